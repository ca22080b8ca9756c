package core

import (
	"fmt"
	"sort"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/rdmafs/rdmafs/meta/metaerr"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

func TestOpenUnlinkedFiles(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		d := e.mkdir(root, RootIno, "d", 0o777)
		s1, err := e.s.OpenSession(e.ctx, &metapb.OpenSessionRequest{Client: "one"})
		if err != nil {
			t.Fatal(err)
		}
		s2, err := e.s.OpenSession(e.ctx, &metapb.OpenSessionRequest{Client: "two", TtlMs: 2000})
		if err != nil {
			t.Fatal(err)
		}
		f := e.create(alice, d, "f", 0o600)
		open := func(c *metapb.Caller, sess, ino uint64, flags uint32) error {
			_, err := e.s.Open(e.ctx, &metapb.OpenRequest{Caller: c, Ino: ino, SessionId: sess, Flags: flags})
			return err
		}
		release := func(sess, ino uint64) error {
			_, err := e.s.Release(e.ctx, &metapb.ReleaseRequest{Ino: ino, SessionId: sess})
			return err
		}
		opens := []struct {
			name string
			err  error
			want syscall.Errno
		}{
			{"owner reads", open(alice, s1.SessionId, f, syscall.O_RDONLY), 0},
			{"owner writes in other session", open(alice, s2.SessionId, f, syscall.O_RDWR), 0},
			{"other user", open(carol, s1.SessionId, f, syscall.O_RDONLY), syscall.EACCES},
			{"unknown session", open(alice, 9999, f, syscall.O_RDONLY), syscall.ESTALE},
			{"directory for writing", open(root, s1.SessionId, d, syscall.O_WRONLY), syscall.EISDIR},
			{"directory for reading", open(root, s1.SessionId, d, syscall.O_RDONLY), 0},
			{"release unopened", release(s1.SessionId, RootIno), syscall.EBADF},
		}
		for _, o := range opens {
			t.Run(o.name, func(t *testing.T) { wantErrno(t, o.err, o.want) })
		}
		if _, err := e.s.Unlink(e.ctx, &metapb.UnlinkRequest{Parent: d, Name: "f"}); err != nil {
			t.Fatal(err)
		}
		mustMissing(t, e, d, "f")
		if a := e.attr(f); a.Nlink != 0 {
			t.Fatalf("open unlinked file nlink %d", a.Nlink)
		}
		// Held open across a restart of the service.
		e.restart()
		if err := release(s1.SessionId, f); err != nil {
			t.Fatal(err)
		}
		e.attr(f) // still open in s2
		// s2 stops sending keepalives: when it expires the file goes.
		e.clock.Advance(time.Second)
		if _, err := e.s.KeepAlive(e.ctx, &metapb.KeepAliveRequest{SessionId: s1.SessionId}); err != nil {
			t.Fatal(err)
		}
		e.clock.Advance(1500 * time.Millisecond)
		if err := e.s.expireSessions(e.ctx); err != nil {
			t.Fatal(err)
		}
		_, err = e.s.GetAttr(e.ctx, &metapb.GetAttrRequest{Ino: f})
		wantErrno(t, err, syscall.ENOENT)
		_, err = e.s.KeepAlive(e.ctx, &metapb.KeepAliveRequest{SessionId: s2.SessionId})
		wantErrno(t, err, syscall.ESTALE)
		if e.s.Sessions() != 1 {
			t.Fatalf("%d sessions left, want 1", e.s.Sessions())
		}
		// Create-and-open, unlink, then CloseSession deletes the file.
		cr, err := e.s.Create(e.ctx, &metapb.CreateRequest{Caller: alice, Parent: d, Name: "g", Mode: 0o644, SessionId: s1.SessionId, OpenFlags: syscall.O_RDWR})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.s.Rename(e.ctx, &metapb.RenameRequest{Parent: d, Name: "g", NewParent: d, NewName: "h"}); err != nil {
			t.Fatal(err)
		}
		e.create(root, d, "victim", 0o644)
		// Replacing an open file by rename keeps it until its close too.
		if _, err := e.s.Rename(e.ctx, &metapb.RenameRequest{Parent: d, Name: "victim", NewParent: d, NewName: "h"}); err != nil {
			t.Fatal(err)
		}
		e.attr(cr.Attr.Ino)
		if _, err := e.s.CloseSession(e.ctx, &metapb.CloseSessionRequest{SessionId: s1.SessionId}); err != nil {
			t.Fatal(err)
		}
		_, err = e.s.GetAttr(e.ctx, &metapb.GetAttrRequest{Ino: cr.Attr.Ino})
		wantErrno(t, err, syscall.ENOENT)
		_, err = e.s.CloseSession(e.ctx, &metapb.CloseSessionRequest{SessionId: s1.SessionId})
		wantErrno(t, err, syscall.ESTALE)
	})
}

func TestLayouts(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		if err := func() error {
			_, err := e.s.Mkdir(e.ctx, &metapb.MkdirRequest{Caller: alice, Parent: RootIno, Name: "x"})
			return err
		}(); metaerr.Errno(err) != syscall.EACCES {
			t.Fatalf("alice mkdir in root: %v", err)
		}
		e.chunkservers(6, "z1", "z2", "z3")
		d := e.mkdir(root, RootIno, "ld", 0o777)
		if _, err := e.s.SetAttr(e.ctx, &metapb.SetAttrRequest{Ino: d, SetUid: true, Uid: alice.Uid}); err != nil {
			t.Fatal(err)
		}
		before := e.create(alice, d, "before", 0o644)
		rep := &metapb.Layout{K: 1, M: 2, Unit: 4096}
		tests := []struct {
			name   string
			c      *metapb.Caller
			ino    uint64
			layout *metapb.Layout
			want   syscall.Errno
		}{
			{"k=0", alice, d, &metapb.Layout{K: 0, M: 2, Unit: 4096}, syscall.EINVAL},
			{"unit not 4k multiple", alice, d, &metapb.Layout{K: 2, M: 1, Unit: 5000}, syscall.EINVAL},
			{"wider than the cluster", alice, d, &metapb.Layout{K: 5, M: 2, Unit: 4096}, syscall.EINVAL},
			{"more shards in a zone than parity", alice, d, &metapb.Layout{K: 4, M: 1, Unit: 4096}, syscall.EINVAL},
			{"not owner", carol, d, rep, syscall.EPERM},
			{"on a file", alice, before, rep, syscall.ENOTDIR},
			{"replication", alice, d, rep, 0},
		}
		for _, tt := range tests {
			_, err := e.s.SetLayout(e.ctx, &metapb.SetLayoutRequest{Caller: tt.c, Ino: tt.ino, Layout: tt.layout})
			t.Run(tt.name, func(t *testing.T) { wantErrno(t, err, tt.want) })
		}
		sub := e.mkdir(alice, d, "sub", 0o755)
		after := e.create(alice, d, "after", 0o644)
		deep := e.create(alice, sub, "deep", 0o644)
		layoutOf := func(ino uint64) string {
			r, err := e.s.GetLayout(e.ctx, &metapb.GetLayoutRequest{Ino: ino})
			if err != nil {
				t.Fatal(err)
			}
			return fmt.Sprintf("%d+%d/%d", r.Layout.K, r.Layout.M, r.Layout.Unit)
		}
		for ino, want := range map[uint64]string{before: "4+2/65536", after: "1+2/4096", deep: "1+2/4096", sub: "1+2/4096", RootIno: "4+2/65536"} {
			if got := layoutOf(ino); got != want {
				t.Errorf("layout of %d = %s, want %s", ino, got, want)
			}
		}
		if a := e.attr(after); a.Layout.K != 1 {
			t.Fatalf("file attr layout %v", a.Layout)
		}
	})
}

// grant asks for one stripe and returns its grant.
func (e *env) grant(ino, stripe uint64) *metapb.StripeGrant {
	e.t.Helper()
	r, err := e.s.GrantWrite(e.ctx, &metapb.GrantWriteRequest{Ino: ino, Stripes: []uint64{stripe}})
	if err != nil {
		e.t.Fatalf("grant: %v", err)
	}
	return r.Grants[0]
}

func (e *env) commit(ino uint64, g *metapb.StripeGrant, expected, length, size uint64) error {
	_, err := e.s.CommitStripes(e.ctx, &metapb.CommitStripesRequest{Ino: ino, Size: size,
		Stripes: []*metapb.StripeCommit{{Stripe: g.Stripe, Version: g.Version, ExpectedVersion: expected, Length: length}}})
	return err
}

// gc returns what chunkserver id should delete, reporting done the given refs.
func (e *env) gc(id string, done []*metapb.ChunkRef) []*metapb.ChunkRef {
	e.t.Helper()
	r, err := e.s.Heartbeat(e.ctx, &metapb.HeartbeatRequest{Id: id, Free: 99 << 30, Deleted: done})
	if err != nil {
		e.t.Fatal(err)
	}
	return r.Delete
}

func (e *env) allGC() map[string][]string {
	out := map[string][]string{}
	for i := 0; i < 8; i++ {
		for _, r := range e.gc(csID(i), nil) {
			out[csID(i)] = append(out[csID(i)], fmt.Sprintf("%d@%d", r.ChunkId, r.Version))
		}
	}
	return out
}

func TestStripeGrantsAndCommits(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		f := e.create(root, RootIno, "f", 0o644)
		_, err := e.s.GrantWrite(e.ctx, &metapb.GrantWriteRequest{Ino: f, Stripes: []uint64{0}})
		if metaerr.Errno(err) != syscall.EHOSTDOWN || status(err) != codes.FailedPrecondition {
			t.Fatalf("grant without chunkservers: %v", err)
		}
		e.chunkservers(4)
		_, err = e.s.GrantWrite(e.ctx, &metapb.GrantWriteRequest{Ino: f, Stripes: []uint64{0}})
		if metaerr.Errno(err) != syscall.EHOSTDOWN {
			t.Fatalf("grant with 4 of 6 chunkservers (min-write-shards 5): %v", err)
		}
		e.chunkservers(8, "z1", "z2", "z3")
		g1 := e.grant(f, 0)
		g2 := e.grant(f, 0) // a concurrent writer
		if g1.Version == g2.Version || g1.CommittedVersion != 0 || len(g1.Shards) != 6 {
			t.Fatalf("grants %v / %v", g1, g2)
		}
		servers := map[string]bool{}
		zones := map[byte]int{}
		for _, sh := range g1.Shards {
			if servers[sh.ServerId] || sh.Address == "" {
				t.Fatalf("bad placement %v", g1.Shards)
			}
			servers[sh.ServerId] = true
			zones[sh.ServerId[2]%3]++
		}
		for z, n := range zones {
			if n != 2 {
				t.Fatalf("zone %d holds %d shards of 6 over 3 zones", z, n)
			}
		}
		sb := uint64(4 * 64 << 10)
		if err := e.commit(f, g1, 0, 1000, 1000); err != nil {
			t.Fatal(err)
		}
		// The second writer built on version 0 too: it loses the CAS.
		err = e.commit(f, g2, 0, 2000, 2000)
		if status(err) != codes.Aborted || fmt.Sprint(metaerr.ConflictStripes(err)) != "[0]" {
			t.Fatalf("stale commit: %v", err)
		}
		// Its grant is gone: committing it again is refused.
		wantErrno(t, e.commit(f, g2, g1.Version, 2000, 2000), syscall.EINVAL)
		// A retried commit of g1 (lost reply) succeeds without change.
		if err := e.commit(f, g1, 0, 1000, 1000); err != nil {
			t.Fatalf("idempotent retry: %v", err)
		}
		if a := e.attr(f); a.Size != 1000 {
			t.Fatalf("size %d", a.Size)
		}
		gs, err := e.s.GetStripes(e.ctx, &metapb.GetStripesRequest{Ino: f, First: 0, Count: 10})
		if err != nil || len(gs.Stripes) != 1 || gs.Stripes[0].Version != g1.Version || gs.Stripes[0].Length != 1000 || gs.Size != 1000 {
			t.Fatalf("stripes %v %v", gs, err)
		}
		if !metapb.SameShards(gs.Stripes[0].Shards, g1.Shards) || gs.Stripes[0].Shards[0].Address == "" {
			t.Fatalf("stripe placement %v, granted %v", gs.Stripes[0].Shards, g1.Shards)
		}
		// The loser's chunks are garbage.
		gcs := e.allGC()
		if n := countRefs(gcs); n != 6 {
			t.Fatalf("%d chunks to collect after a lost CAS, want 6: %v", n, gcs)
		}
		ackAll(e, gcs)
		// Overwrite with a batch of two stripes: the old version of stripe 0
		// becomes garbage.
		r, err := e.s.GrantWrite(e.ctx, &metapb.GrantWriteRequest{Ino: f, Stripes: []uint64{0, 1}})
		if err != nil {
			t.Fatal(err)
		}
		if r.Grants[0].CommittedVersion != g1.Version {
			t.Fatalf("grant reports committed %d", r.Grants[0].CommittedVersion)
		}
		e.clock.Advance(time.Second)
		if _, err := e.s.CommitStripes(e.ctx, &metapb.CommitStripesRequest{Ino: f, Size: sb + 10, MtimeNs: 42, Stripes: []*metapb.StripeCommit{
			{Stripe: 0, Version: r.Grants[0].Version, ExpectedVersion: g1.Version, Length: sb, Shards: r.Grants[0].Shards},
			{Stripe: 1, Version: r.Grants[1].Version, ExpectedVersion: 0, Length: 10},
		}}); err != nil {
			t.Fatal(err)
		}
		if a := e.attr(f); a.Size != sb+10 || a.MtimeNs != 42 || a.CtimeNs != e.clock.Now().UnixNano() {
			t.Fatalf("after batch commit %+v", a)
		}
		if n := countRefs(e.allGC()); n != 6 {
			t.Fatalf("%d chunks to collect after overwrite, want 6", n)
		}
		ackAll(e, e.allGC())
		// All or nothing: one stale stripe fails the whole batch.
		r, err = e.s.GrantWrite(e.ctx, &metapb.GrantWriteRequest{Ino: f, Stripes: []uint64{0, 1}})
		if err != nil {
			t.Fatal(err)
		}
		_, err = e.s.CommitStripes(e.ctx, &metapb.CommitStripesRequest{Ino: f, Size: 3 * sb, Stripes: []*metapb.StripeCommit{
			{Stripe: 0, Version: r.Grants[0].Version, ExpectedVersion: r.Grants[0].CommittedVersion, Length: sb},
			{Stripe: 1, Version: r.Grants[1].Version, ExpectedVersion: 0, Length: sb},
		}})
		if fmt.Sprint(metaerr.ConflictStripes(err)) != "[1]" {
			t.Fatalf("partial conflict: %v", err)
		}
		if a := e.attr(f); a.Size != sb+10 {
			t.Fatalf("failed batch changed the size to %d", a.Size)
		}
		// The surviving grant of stripe 0 can still be committed alone.
		if err := e.commit(f, r.Grants[0], r.Grants[0].CommittedVersion, sb, sb); err != nil {
			t.Fatal(err)
		}
		ackAll(e, e.allGC())
		// Errors.
		bad := []struct {
			name string
			req  *metapb.CommitStripesRequest
			want syscall.Errno
		}{
			{"no grant", &metapb.CommitStripesRequest{Ino: f, Stripes: []*metapb.StripeCommit{{Stripe: 7, Version: 99}}}, syscall.EINVAL},
			{"empty", &metapb.CommitStripesRequest{Ino: f}, syscall.EINVAL},
			{"directory", &metapb.CommitStripesRequest{Ino: RootIno, Stripes: []*metapb.StripeCommit{{Stripe: 0, Version: 1}}}, syscall.EISDIR},
			{"missing file", &metapb.CommitStripesRequest{Ino: 5555, Stripes: []*metapb.StripeCommit{{Stripe: 0, Version: 1}}}, syscall.ENOENT},
		}
		for _, b := range bad {
			_, err := e.s.CommitStripes(e.ctx, b.req)
			t.Run(b.name, func(t *testing.T) { wantErrno(t, err, b.want) })
		}
		g := e.grant(f, 5)
		_, err = e.s.CommitStripes(e.ctx, &metapb.CommitStripesRequest{Ino: f, Stripes: []*metapb.StripeCommit{{Stripe: 5, Version: g.Version, Length: sb + 1}}})
		wantErrno(t, err, syscall.EINVAL)
		g.Shards[0].ChunkId++
		_, err = e.s.CommitStripes(e.ctx, &metapb.CommitStripesRequest{Ino: f, Stripes: []*metapb.StripeCommit{{Stripe: 5, Version: g.Version, Shards: g.Shards}}})
		wantErrno(t, err, syscall.EINVAL)
		// Truncate to half a stripe: stripe 1 is dropped, stripe 0 shortened.
		if _, err := e.s.SetAttr(e.ctx, &metapb.SetAttrRequest{Ino: f, SetSize: true, Size: 100}); err != nil {
			t.Fatal(err)
		}
		gs, _ = e.s.GetStripes(e.ctx, &metapb.GetStripesRequest{Ino: f})
		if len(gs.Stripes) != 1 || gs.Stripes[0].Length != 100 || gs.Size != 100 {
			t.Fatalf("after truncate %v", gs)
		}
		if n := countRefs(e.allGC()); n != 6 {
			t.Fatalf("%d chunks to collect after truncate, want 6", n)
		}
		ackAll(e, e.allGC())
		// A grant never committed is collected when it expires.
		e.clock.Advance(2 * time.Minute)
		if err := e.s.expireGrants(e.ctx); err != nil {
			t.Fatal(err)
		}
		if n := countRefs(e.allGC()); n != 6 {
			t.Fatalf("%d chunks to collect after grant expiry, want 6", n)
		}
		ackAll(e, e.allGC())
		// Unlink: everything is collected.
		if _, err := e.s.Unlink(e.ctx, &metapb.UnlinkRequest{Parent: RootIno, Name: "f"}); err != nil {
			t.Fatal(err)
		}
		if n := countRefs(e.allGC()); n != 6 {
			t.Fatalf("%d chunks to collect after unlink, want 6", n)
		}
		ackAll(e, e.allGC())
		if n := countRefs(e.allGC()); n != 0 {
			t.Fatalf("acknowledged deletions still listed: %d", n)
		}
	})
}

func status(err error) codes.Code {
	var me *metaerr.Error
	if err == nil {
		return codes.OK
	}
	if ok := asMeta(err, &me); ok {
		return me.Code
	}
	return codes.Unknown
}

func asMeta(err error, target **metaerr.Error) bool {
	me, ok := err.(*metaerr.Error)
	if ok {
		*target = me
	}
	return ok
}

func countRefs(m map[string][]string) int {
	n := 0
	for _, v := range m {
		n += len(v)
	}
	return n
}

func ackAll(e *env, m map[string][]string) {
	for id, refs := range m {
		var done []*metapb.ChunkRef
		for _, r := range refs {
			var c, v uint64
			fmt.Sscanf(r, "%d@%d", &c, &v)
			done = append(done, &metapb.ChunkRef{ChunkId: c, Version: v})
		}
		e.gc(id, done)
	}
}

func TestConcurrentWritersSerialize(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		e.chunkservers(6)
		f := e.create(root, RootIno, "f", 0o644)
		const writers, each = 8, 10
		var mu sync.Mutex
		var committed []uint64
		var wg sync.WaitGroup
		for w := 0; w < writers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < each; {
					r, err := e.s.GrantWrite(e.ctx, &metapb.GrantWriteRequest{Ino: f, Stripes: []uint64{3}})
					if err != nil {
						t.Error(err)
						return
					}
					g := r.Grants[0]
					err = e.commit(f, g, g.CommittedVersion, 1, 0)
					if metaerr.ConflictStripes(err) != nil {
						continue // lost the race: retry with a new grant
					}
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					committed = append(committed, g.Version)
					mu.Unlock()
					i++
				}
			}()
		}
		wg.Wait()
		if len(committed) != writers*each {
			t.Fatalf("%d commits, want %d", len(committed), writers*each)
		}
		seen := map[uint64]bool{}
		for _, v := range committed {
			if seen[v] {
				t.Fatalf("version %d committed twice", v)
			}
			seen[v] = true
		}
		sort.Slice(committed, func(i, j int) bool { return committed[i] < committed[j] })
		gs, err := e.s.GetStripes(e.ctx, &metapb.GetStripesRequest{Ino: f, First: 3, Count: 1})
		if err != nil || gs.Stripes[0].Version != committed[len(committed)-1] {
			t.Fatalf("final version %v, highest committed %d", gs, committed[len(committed)-1])
		}
	})
}

func TestMembershipStatusAndStatFS(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		regs := []struct {
			name string
			req  *metapb.RegisterRequest
			want syscall.Errno
		}{
			{"empty id", &metapb.RegisterRequest{Address: "a:1"}, syscall.EINVAL},
			{"id with space", &metapb.RegisterRequest{Id: "a b", Address: "a:1"}, syscall.EINVAL},
			{"no address", &metapb.RegisterRequest{Id: "x"}, syscall.EINVAL},
		}
		for _, r := range regs {
			_, err := e.s.Register(e.ctx, r.req)
			t.Run(r.name, func(t *testing.T) { wantErrno(t, err, r.want) })
		}
		e.chunkservers(6, "z1", "z2")
		f := e.create(root, RootIno, "f", 0o644)
		g := e.grant(f, 0)
		if err := e.commit(f, g, 0, 10, 10); err != nil {
			t.Fatal(err)
		}
		st, err := e.s.Status(e.ctx, &metapb.StatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Chunkservers) != 6 || st.Files != 1 || st.Directories != 1 || st.Stripes != 1 || st.DegradedStripes != 0 {
			t.Fatalf("status %v", st)
		}
		fs, err := e.s.StatFS(e.ctx, &metapb.StatFSRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if want := uint64(6*100<<30) / 6 * 4 / 4096; fs.Blocks != want || fs.BlocksFree == 0 || fs.NameMax != 255 {
			t.Fatalf("statfs %v, want %d blocks", fs, want)
		}
		// cs0 stops sending heartbeats: it goes down, its stripe is degraded.
		for i := 0; i < 3; i++ {
			e.clock.Advance(2 * time.Second)
			for j := 1; j < 6; j++ {
				e.gc(csID(j), nil)
			}
			e.s.members.sweep(e.clock.Now(), e.s.cfg.HeartbeatTimeout, e.s.log)
		}
		st, _ = e.s.Status(e.ctx, &metapb.StatusRequest{})
		if st.Chunkservers[0].Up || !st.Chunkservers[1].Up || st.DegradedStripes != 1 {
			t.Fatalf("after timeout: %v", st)
		}
		dg, err := e.s.GrantWrite(e.ctx, &metapb.GrantWriteRequest{Ino: f, Stripes: []uint64{1}})
		if err != nil || holes(dg.Grants[0].Shards) != 1 {
			t.Fatalf("grant with 5 live chunkservers: %v, want a degraded grant (min-write-shards 5)", err)
		}
		e.gc(csID(0), nil) // back up
		st, _ = e.s.Status(e.ctx, &metapb.StatusRequest{})
		if !st.Chunkservers[0].Up || st.DegradedStripes != 0 {
			t.Fatalf("after return: %v", st)
		}
		// Full chunkservers: enough are alive but too few have room.
		for j := 0; j < 6; j++ {
			if _, err := e.s.Heartbeat(e.ctx, &metapb.HeartbeatRequest{Id: csID(j), Free: uint64(j) * 1000}); err != nil {
				t.Fatal(err)
			}
		}
		_, err = e.s.GrantWrite(e.ctx, &metapb.GrantWriteRequest{Ino: f, Stripes: []uint64{1}})
		if metaerr.Errno(err) != syscall.ENOSPC || status(err) != codes.ResourceExhausted {
			t.Fatalf("grant on full chunkservers: %v", err)
		}
		r, err := e.s.Heartbeat(e.ctx, &metapb.HeartbeatRequest{Id: "stranger"})
		if err != nil || !r.Reregister {
			t.Fatalf("unknown heartbeat: %v %v", r, err)
		}
		// Registrations survive a restart; liveness is learnt again.
		e.restart()
		st, _ = e.s.Status(e.ctx, &metapb.StatusRequest{})
		if len(st.Chunkservers) != 6 || st.Chunkservers[0].Up {
			t.Fatalf("after restart: %v", st)
		}
	})
}

func TestDataPathErrors(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		e.chunkservers(6)
		f := e.create(root, RootIno, "f", 0o644)
		sl, err := e.s.Symlink(e.ctx, &metapb.SymlinkRequest{Parent: RootIno, Name: "sl", Target: "f"})
		if err != nil {
			t.Fatal(err)
		}
		fifo, err := e.s.Mknod(e.ctx, &metapb.MknodRequest{Parent: RootIno, Name: "p", Mode: syscall.S_IFIFO | 0o644})
		if err != nil {
			t.Fatal(err)
		}
		many := make([]uint64, MaxStripesPerCall+1)
		for i := range many {
			many[i] = uint64(i)
		}
		errOf := func(_ any, err error) error { return err }
		tests := []struct {
			name string
			err  error
			want syscall.Errno
		}{
			{"grant on a directory", errOf(e.s.GrantWrite(e.ctx, &metapb.GrantWriteRequest{Ino: RootIno, Stripes: []uint64{0}})), syscall.EISDIR},
			{"grant on a fifo", errOf(e.s.GrantWrite(e.ctx, &metapb.GrantWriteRequest{Ino: fifo.Attr.Ino, Stripes: []uint64{0}})), syscall.EINVAL},
			{"grant on a missing inode", errOf(e.s.GrantWrite(e.ctx, &metapb.GrantWriteRequest{Ino: 4444, Stripes: []uint64{0}})), syscall.ENOENT},
			{"grant of no stripes", errOf(e.s.GrantWrite(e.ctx, &metapb.GrantWriteRequest{Ino: f})), syscall.EINVAL},
			{"grant of too many stripes", errOf(e.s.GrantWrite(e.ctx, &metapb.GrantWriteRequest{Ino: f, Stripes: many})), syscall.EINVAL},
			{"grant of many stripes", errOf(e.s.GrantWrite(e.ctx, &metapb.GrantWriteRequest{Ino: f, Stripes: many[:64]})), 0},
			{"stripes of a directory", errOf(e.s.GetStripes(e.ctx, &metapb.GetStripesRequest{Ino: RootIno})), syscall.EISDIR},
			{"stripes of a symlink", errOf(e.s.GetStripes(e.ctx, &metapb.GetStripesRequest{Ino: sl.Attr.Ino})), syscall.EINVAL},
			{"stripes of a missing inode", errOf(e.s.GetStripes(e.ctx, &metapb.GetStripesRequest{Ino: 4444})), syscall.ENOENT},
			{"stripes of an unwritten file", errOf(e.s.GetStripes(e.ctx, &metapb.GetStripesRequest{Ino: f, First: 1 << 62, Count: 1 << 62})), 0},
			{"layout of a symlink", errOf(e.s.GetLayout(e.ctx, &metapb.GetLayoutRequest{Ino: sl.Attr.Ino})), syscall.EINVAL},
			{"layout of a missing inode", errOf(e.s.GetLayout(e.ctx, &metapb.GetLayoutRequest{Ino: 4444})), syscall.ENOENT},
			{"readlink of a missing inode", errOf(e.s.Readlink(e.ctx, &metapb.ReadlinkRequest{Ino: 4444})), syscall.ENOENT},
			{"heartbeat with too many deletions", errOf(e.s.Heartbeat(e.ctx, &metapb.HeartbeatRequest{Id: csID(0), Deleted: make([]*metapb.ChunkRef, 4*MaxDeletesPerHeartbeat+1)})), syscall.EINVAL},
			{"keepalive of an unknown session", errOf(e.s.KeepAlive(e.ctx, &metapb.KeepAliveRequest{SessionId: 77})), syscall.ESTALE},
			{"close of an unknown session", errOf(e.s.CloseSession(e.ctx, &metapb.CloseSessionRequest{SessionId: 77})), syscall.ESTALE},
			{"create opened in an unknown session", errOf(e.s.Create(e.ctx, &metapb.CreateRequest{Parent: RootIno, Name: "g", SessionId: 77})), syscall.ESTALE},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) { wantErrno(t, tt.err, tt.want) })
		}
		// The many uncommitted grants are collected when they expire.
		e.clock.Advance(2 * time.Minute)
		if err := e.s.expireGrants(e.ctx); err != nil {
			t.Fatal(err)
		}
		if n := countRefs(e.allGC()); n != 64*6 {
			t.Fatalf("%d chunks of 64 expired grants to collect, want %d", n, 64*6)
		}
	})
}
