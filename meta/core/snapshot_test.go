package core

import (
	"fmt"
	"sort"
	"syscall"
	"testing"

	"github.com/rdmafs/rdmafs/meta/keys"
	"github.com/rdmafs/rdmafs/meta/kv"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// snapshot runs a snapshot to completion in batches and returns its last
// reply and the number of calls.
func (e *env) snapshot(c *metapb.Caller, src, parent uint64, name string, batch uint32) (*metapb.SnapshotReply, int, error) {
	for calls := 1; ; calls++ {
		r, err := e.s.Snapshot(e.ctx, &metapb.SnapshotRequest{Caller: c, Src: src, DstParent: parent, Name: name, Batch: batch})
		if err != nil || r.Done {
			return r, calls, err
		}
		if calls > 10000 {
			e.t.Fatal("snapshot never finishes")
		}
	}
}

// rmr removes a tree in batches and returns the files and directories removed.
func (e *env) rmr(c *metapb.Caller, parent uint64, name string, batch uint32) (files, dirs uint64, err error) {
	for calls := 0; calls < 100000; calls++ {
		r, err := e.s.RemoveTree(e.ctx, &metapb.RemoveTreeRequest{Caller: c, Parent: parent, Name: name, Batch: batch})
		if err != nil {
			return files, dirs, err
		}
		files, dirs = files+r.Files, dirs+r.Dirs
		if r.Done {
			return files, dirs, nil
		}
	}
	e.t.Fatal("rmr never finishes")
	return 0, 0, nil
}

// sharedKeys returns the chunk versions with extra references, as "chunk@version=n".
func (e *env) sharedKeys() []string {
	var out []string
	if err := e.store.View(e.ctx, func(r kv.Reader) error {
		return r.Scan([]byte{keys.PrefixShared}, []byte{keys.PrefixShared + 1}, 0, func(k, v []byte) error {
			c, ver, err := keys.ParseShared(k)
			if err != nil {
				return err
			}
			n, err := keys.DecodeUint64(v)
			out = append(out, fmt.Sprintf("%d@%d=%d", c, ver, n))
			return err
		})
	}); err != nil {
		e.t.Fatal(err)
	}
	return out
}

func (e *env) stripesOf(ino uint64) []*metapb.StripeInfo {
	e.t.Helper()
	r, err := e.s.GetStripes(e.ctx, &metapb.GetStripesRequest{Ino: ino, Count: 100})
	if err != nil {
		e.t.Fatal(err)
	}
	return r.Stripes
}

func TestSnapshotSharesChunksUntilWritten(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		e.chunkservers(8)
		sb := uint64(4 * 64 << 10)
		src := e.mkdir(root, RootIno, "src", 0o755)
		sub := e.mkdir(root, src, "sub", 0o750)
		a := e.create(root, src, "a", 0o644)
		var versions []string // every chunk version written, "server:chunk@version"
		write := func(ino, stripe, expected uint64) *metapb.StripeGrant {
			g := e.grant(ino, stripe)
			if err := e.commit(ino, g, expected, sb, (stripe+1)*sb); err != nil {
				t.Fatal(err)
			}
			for _, sh := range g.Shards {
				versions = append(versions, fmt.Sprintf("%s:%d@%d", sh.ServerId, sh.ChunkId, g.Version))
			}
			return g
		}
		a0 := write(a, 0, 0)
		write(a, 1, 0)
		c := e.create(root, sub, "c", 0o600)
		write(c, 0, 0)
		if _, err := e.s.Link(e.ctx, &metapb.LinkRequest{Caller: root, Ino: a, NewParent: sub, NewName: "a-link"}); err != nil {
			t.Fatal(err)
		}
		if _, err := e.s.Symlink(e.ctx, &metapb.SymlinkRequest{Caller: root, Parent: src, Name: "l", Target: "sub/c"}); err != nil {
			t.Fatal(err)
		}
		if _, err := e.s.SetXattr(e.ctx, &metapb.SetXattrRequest{Caller: root, Ino: a, Name: "user.k", Value: []byte("v")}); err != nil {
			t.Fatal(err)
		}
		ackAll(e, e.allGC())

		// Refused: a user other than root, a copy into the source, a name taken.
		_, _, err := e.snapshot(alice, src, RootIno, "x", 0)
		wantErrno(t, err, syscall.EPERM)
		_, _, err = e.snapshot(root, src, sub, "x", 0)
		wantErrno(t, err, syscall.EINVAL)
		_, _, err = e.snapshot(root, src, RootIno, "src", 0)
		wantErrno(t, err, syscall.EEXIST)

		r, calls, err := e.snapshot(root, src, RootIno, "snap", 2)
		if err != nil {
			t.Fatal(err)
		}
		if calls < 3 || r.Files != 3 || r.Dirs != 2 || r.SharedStripes != 3 || r.Bytes != 3*sb {
			t.Fatalf("snapshot in %d calls: %+v", calls, r)
		}
		if p, err := e.s.Snapshot(e.ctx, &metapb.SnapshotRequest{Caller: root, DstParent: RootIno, Name: "snap", Progress: true}); err != nil || !p.Done || p.Dst != r.Dst {
			t.Fatalf("progress of a finished snapshot: %+v %v", p, err)
		}
		snap := r.Dst
		if got := fmt.Sprint(e.names(snap)); got != "[a l sub]" {
			t.Fatalf("snapshot holds %s", got)
		}
		snapSub, _ := e.lookup(snap, "sub")
		sa, _ := e.lookup(snap, "a")
		sl, _ := e.lookup(snapSub, "a-link")
		if sa != sl || sa == a || e.attr(sa).Nlink != 2 || e.attr(snapSub).Mode&0o777 != 0o750 {
			t.Fatalf("hard link copied as %d and %d (source %d), nlink %d", sa, sl, a, e.attr(sa).Nlink)
		}
		if x, err := e.s.GetXattr(e.ctx, &metapb.GetXattrRequest{Caller: root, Ino: sa, Name: "user.k"}); err != nil || string(x.Value) != "v" {
			t.Fatalf("xattr of the copy: %v %v", x, err)
		}
		if e.attr(sa).Size != 2*sb {
			t.Fatalf("copy's size %d", e.attr(sa).Size)
		}
		orig, cp := e.stripesOf(a), e.stripesOf(sa)
		for i := range orig {
			if orig[i].Version != cp[i].Version || !metapb.SameShards(orig[i].Shards, cp[i].Shards) {
				t.Fatalf("stripe %d of the copy: %v, source %v", i, cp[i], orig[i])
			}
		}
		if n := len(e.sharedKeys()); n != 18 {
			t.Fatalf("%d shared chunk versions, want 18 (3 stripes of 6): %v", n, e.sharedKeys())
		}

		// A write to either side never writes in place into shared chunks,
		// and collects nothing the other side still reads.
		g, err := e.s.GrantWrite(e.ctx, &metapb.GrantWriteRequest{Ino: a, Stripes: []uint64{0}, InPlace: []uint64{0}})
		if err != nil || g.Grants[0].InPlace {
			t.Fatalf("in-place grant on a shared stripe: %+v %v", g, err)
		}
		if err := e.commit(a, g.Grants[0], a0.Version, sb, 2*sb); err != nil {
			t.Fatal(err)
		}
		for _, sh := range g.Grants[0].Shards {
			versions = append(versions, fmt.Sprintf("%s:%d@%d", sh.ServerId, sh.ChunkId, g.Grants[0].Version))
		}
		if n := countRefs(e.allGC()); n != 0 {
			t.Fatalf("overwriting the source collected %d chunks the snapshot references", n)
		}
		if cp := e.stripesOf(sa); cp[0].Version != a0.Version || !metapb.SameShards(cp[0].Shards, a0.Shards) {
			t.Fatalf("the copy's stripe changed with the source's: %v", cp[0])
		}
		// Unshared now, the source's new version may be written in place.
		g, err = e.s.GrantWrite(e.ctx, &metapb.GrantWriteRequest{Ino: a, Stripes: []uint64{0}, InPlace: []uint64{0}})
		if err != nil || !g.Grants[0].InPlace {
			t.Fatalf("in-place grant on an unshared stripe: %+v %v", g, err)
		}
		// The copy's stripe 0 is its own now: in place again, and not
		// counted as shared.
		gc, err := e.s.GrantWrite(e.ctx, &metapb.GrantWriteRequest{Ino: sa, Stripes: []uint64{0}, InPlace: []uint64{0}})
		if err != nil || !gc.Grants[0].InPlace {
			t.Fatalf("in-place grant on the copy's stripe the source rewrote: %+v %v", gc, err)
		}
		if st, err := e.s.Status(e.ctx, &metapb.StatusRequest{}); err != nil || st.SharedBytes != 4*sb {
			t.Fatalf("status counts %d bytes shared, want %d (stripe 1 of a and its copy, and c and its copy): %v", st.SharedBytes, 4*sb, err)
		}
		for _, sh := range gc.Grants[0].Shards {
			versions = append(versions, fmt.Sprintf("%s:%d@%d", sh.ServerId, sh.ChunkId, gc.Grants[0].Version))
		}
		// Never committed, its chunks are collected with the file.
		for _, sh := range g.Grants[0].Shards {
			versions = append(versions, fmt.Sprintf("%s:%d@%d", sh.ServerId, sh.ChunkId, g.Grants[0].Version))
		}

		// Removing the snapshot, then the source, collects every version
		// written exactly once.
		var collected []string
		collect := func() {
			gcs := e.allGC()
			for id, refs := range gcs {
				for _, r := range refs {
					collected = append(collected, id+":"+r)
				}
			}
			ackAll(e, gcs)
		}
		_, _, err = e.rmr(alice, RootIno, "snap", 2)
		wantErrno(t, err, syscall.EACCES)
		files, dirs, err := e.rmr(root, RootIno, "snap", 2)
		if err != nil || files != 4 || dirs != 2 {
			t.Fatalf("rmr of the snapshot: %d files, %d dirs, %v", files, dirs, err)
		}
		collect()
		if _, err := e.lookup(RootIno, "snap"); err == nil {
			t.Fatal("snapshot still there after rmr")
		}
		if _, err := e.s.Unlink(e.ctx, &metapb.UnlinkRequest{Caller: root, Parent: sub, Name: "a-link"}); err != nil {
			t.Fatal(err)
		}
		if _, _, err := e.rmr(root, RootIno, "src", 0); err != nil {
			t.Fatal(err)
		}
		collect()
		sort.Strings(versions)
		sort.Strings(collected)
		if fmt.Sprint(versions) != fmt.Sprint(collected) {
			t.Fatalf("collected\n%v\nwant every version written once\n%v", collected, versions)
		}
		if k := e.sharedKeys(); len(k) != 0 {
			t.Fatalf("reference counts left: %v", k)
		}
		if e.s.inodes.Load() != 1 {
			t.Fatalf("%d inodes left, want the root", e.s.inodes.Load())
		}
	})
}

// TestSnapshotResumes interrupts a tree snapshot after each batch with a
// restart of the service: it goes on where it stopped.
func TestSnapshotResumes(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		src := e.mkdir(root, RootIno, "src", 0o755)
		want := map[string]bool{}
		for i := 0; i < 5; i++ {
			d := e.mkdir(root, src, fmt.Sprintf("d%d", i), 0o755)
			for j := 0; j < 7; j++ {
				e.create(root, d, fmt.Sprintf("f%d", j), 0o644)
				want[fmt.Sprintf("d%d/f%d", i, j)] = true
			}
		}
		calls := 0
		for {
			r, err := e.s.Snapshot(e.ctx, &metapb.SnapshotRequest{Caller: root, Src: src, DstParent: RootIno, Name: "snap", Batch: 4})
			if err != nil {
				t.Fatal(err)
			}
			calls++
			if r.Done {
				if r.Files != 35 || r.Dirs != 6 {
					t.Fatalf("totals %+v", r)
				}
				break
			}
			e.restart()
		}
		snap, _ := e.lookup(RootIno, "snap")
		got := map[string]bool{}
		for _, d := range e.names(snap) {
			di, _ := e.lookup(snap, d)
			for _, f := range e.names(di) {
				got[d+"/"+f] = true
			}
		}
		if len(got) != len(want) || calls < 10 {
			t.Fatalf("%d calls; copy holds %d files, want %d", calls, len(got), len(want))
		}
		_, _, err := e.snapshot(root, src, RootIno, "snap", 0)
		wantErrno(t, err, syscall.EEXIST)
	})
}
