package core

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/meta/metapb"
)

func (e *env) trashList(c *metapb.Caller) []*metapb.TrashEntry {
	e.t.Helper()
	var out []*metapb.TrashEntry
	after := uint64(0)
	for {
		r, err := e.s.Trash(e.ctx, &metapb.TrashRequest{Caller: c, After: after})
		if err != nil {
			e.t.Fatal(err)
		}
		out = append(out, r.Entries...)
		if r.Next == 0 {
			return out
		}
		after = r.Next
	}
}

func TestTrash(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		if _, err := e.s.Config(e.ctx, &metapb.ConfigRequest{Name: "trash-days", Value: "2", Set: true}); err != nil {
			t.Fatal(err)
		}
		if _, err := e.s.Config(e.ctx, &metapb.ConfigRequest{Name: "trash-days", Value: "-1", Set: true}); err == nil {
			t.Fatal("negative trash-days accepted")
		}
		e.chunkservers(8)
		sb := uint64(4 * 64 << 10)
		d := e.mkdir(root, RootIno, "d", 0o777)
		a := e.create(alice, d, "a", 0o644)
		g := e.grant(a, 0)
		if err := e.commit(a, g, 0, sb, sb); err != nil {
			t.Fatal(err)
		}
		b := e.create(bob, d, "b", 0o644)
		e.create(bob, d, "c", 0o644)
		ackAll(e, e.allGC())

		// The trash directory is at the root, not listed, not creatable.
		if got := fmt.Sprint(e.names(RootIno)); got != "[d]" {
			t.Fatalf("root lists %s", got)
		}
		if ino, err := e.lookup(RootIno, TrashName); err != nil || ino != TrashIno {
			t.Fatalf("lookup of %s: %d %v", TrashName, ino, err)
		}
		_, err := e.s.Mkdir(e.ctx, &metapb.MkdirRequest{Caller: root, Parent: RootIno, Name: TrashName, Mode: 0o755})
		wantErrno(t, err, syscall.EEXIST)

		// Unlink and a rename over a file put them in the trash, keeping
		// their data.
		if _, err := e.s.Unlink(e.ctx, &metapb.UnlinkRequest{Caller: alice, Parent: d, Name: "a"}); err != nil {
			t.Fatal(err)
		}
		e.clock.Advance(time.Hour)
		if _, err := e.s.Rename(e.ctx, &metapb.RenameRequest{Caller: bob, Parent: d, Name: "c", NewParent: d, NewName: "b"}); err != nil {
			t.Fatal(err)
		}
		if n := countRefs(e.allGC()); n != 0 {
			t.Fatalf("%d chunks collected of a file in the trash", n)
		}
		all := e.trashList(root)
		if len(all) != 2 || all[0].Path != "/d/a" || all[0].Bytes != sb || all[1].Path != "/d/b" ||
			all[0].ExpiresNs != all[0].DeletedNs+int64(48*time.Hour) {
			t.Fatalf("trash as root: %v", all)
		}
		if mine := e.trashList(alice); len(mine) != 1 || mine[0].Ino != a {
			t.Fatalf("alice's trash: %v", mine)
		}
		if got := fmt.Sprint(e.namesAs(bob, TrashIno)); got != fmt.Sprintf("[%d|b]", b) {
			t.Fatalf("bob's .trash lists %s", got)
		}
		if _, err := e.s.Lookup(e.ctx, &metapb.LookupRequest{Caller: alice, Parent: TrashIno, Name: fmt.Sprintf("%d|b", b)}); err == nil {
			t.Fatal("alice looked up bob's file in the trash")
		}
		st, err := e.s.Status(e.ctx, &metapb.StatusRequest{})
		if err != nil || st.TrashFiles != 2 || st.TrashBytes != sb || st.TrashSeconds != 2*86400 {
			t.Fatalf("status: %+v %v", st, err)
		}
		fsr, err := e.s.StatFS(e.ctx, &metapb.StatFSRequest{Ino: TrashIno})
		if err != nil || fsr.Blocks*fsr.BlockSize != sb || fsr.Files != 2 {
			t.Fatalf("statfs of the trash: %+v %v", fsr, err)
		}

		// Restore: back at its name with its data; not over an existing name.
		if _, err := e.s.Trash(e.ctx, &metapb.TrashRequest{Caller: bob, Op: metapb.TrashRequest_RESTORE, Inos: []uint64{a}}); err == nil {
			t.Fatal("bob restored alice's file")
		}
		if _, err := e.s.Trash(e.ctx, &metapb.TrashRequest{Caller: alice, Op: metapb.TrashRequest_RESTORE, Inos: []uint64{a}}); err != nil {
			t.Fatal(err)
		}
		if ino, err := e.lookup(d, "a"); err != nil || ino != a || e.attr(a).Nlink != 1 {
			t.Fatalf("restored: %d %v", ino, err)
		}
		if st := e.stripesOf(a); len(st) != 1 || st[0].Version != g.Version || !metapb.SameShards(st[0].Shards, g.Shards) {
			t.Fatalf("restored stripes %v", st)
		}
		_, err = e.s.Trash(e.ctx, &metapb.TrashRequest{Caller: bob, Op: metapb.TrashRequest_RESTORE, Inos: []uint64{b}})
		wantErrno(t, err, syscall.EEXIST) // c took the name b

		// Purge by unlinking the entry, and by expiry (the injected clock).
		if _, err := e.s.Unlink(e.ctx, &metapb.UnlinkRequest{Caller: alice, Parent: d, Name: "a"}); err != nil {
			t.Fatal(err)
		}
		if _, err := e.s.Unlink(e.ctx, &metapb.UnlinkRequest{Caller: alice, Parent: TrashIno, Name: fmt.Sprintf("%d|a", a)}); err != nil {
			t.Fatal(err)
		}
		if n := countRefs(e.allGC()); n != 6 {
			t.Fatalf("%d chunks collected after a purge, want 6", n)
		}
		if _, err := e.s.GetAttr(e.ctx, &metapb.GetAttrRequest{Ino: a}); err == nil {
			t.Fatal("purged inode still exists")
		}
		e.clock.Advance(47 * time.Hour)
		if err := e.s.expireTrash(e.ctx); err != nil {
			t.Fatal(err)
		}
		if l := e.trashList(root); len(l) != 1 || l[0].Ino != b {
			t.Fatalf("trash before b's retention ends: %v", l)
		}
		e.restart() // the retention and the trash survive a restart
		e.clock.Advance(2 * time.Hour)
		if err := e.s.expireTrash(e.ctx); err != nil {
			t.Fatal(err)
		}
		if l := e.trashList(root); len(l) != 0 {
			t.Fatalf("trash after the retention: %v", l)
		}
		if _, err := e.s.GetAttr(e.ctx, &metapb.GetAttrRequest{Ino: b}); err == nil {
			t.Fatal("expired inode still exists")
		}
		if rep, err := e.s.Check(e.ctx, &metapb.CheckRequest{}); err != nil || len(rep.Problems) != 0 {
			t.Fatalf("check: %v %v", rep, err)
		}

		// Off: deletes free at once.
		if _, err := e.s.Config(e.ctx, &metapb.ConfigRequest{Name: "trash-days", Value: "0", Set: true}); err != nil {
			t.Fatal(err)
		}
		if _, err := e.s.Unlink(e.ctx, &metapb.UnlinkRequest{Caller: bob, Parent: d, Name: "b"}); err != nil {
			t.Fatal(err)
		}
		if l := e.trashList(root); len(l) != 0 {
			t.Fatalf("trash off, yet: %v", l)
		}
	})
}

// TestTrashPurgeAll purges everything a user sees, in batches, and a file
// still open when purged goes at its last close.
func TestTrashPurgeAll(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		if _, err := e.s.Config(e.ctx, &metapb.ConfigRequest{Name: "trash-days", Value: "1", Set: true}); err != nil {
			t.Fatal(err)
		}
		d := e.mkdir(root, RootIno, "d", 0o777)
		for i := 0; i < trashBatch+5; i++ {
			e.create(alice, d, fmt.Sprint(i), 0o644)
		}
		sess, err := e.s.OpenSession(e.ctx, &metapb.OpenSessionRequest{Client: "t"})
		if err != nil {
			t.Fatal(err)
		}
		open := e.create(bob, d, "open", 0o644)
		if _, err := e.s.Open(e.ctx, &metapb.OpenRequest{Caller: bob, Ino: open, SessionId: sess.SessionId}); err != nil {
			t.Fatal(err)
		}
		if _, _, err := e.rmr(root, RootIno, "d", 0); err != nil {
			t.Fatal(err)
		}
		if n := len(e.trashList(root)); n != trashBatch+6 {
			t.Fatalf("%d files in the trash after rmr", n)
		}
		r, err := e.s.Trash(e.ctx, &metapb.TrashRequest{Caller: alice, Op: metapb.TrashRequest_PURGE, All: true})
		if err != nil || r.Done != trashBatch+5 {
			t.Fatalf("purge all as alice: %+v %v", r, err)
		}
		if l := e.trashList(root); len(l) != 1 || l[0].Ino != open {
			t.Fatalf("left: %v", l)
		}
		if _, err := e.s.Trash(e.ctx, &metapb.TrashRequest{Caller: bob, Op: metapb.TrashRequest_PURGE, Inos: []uint64{open}}); err != nil {
			t.Fatal(err)
		}
		if _, err := e.s.GetAttr(e.ctx, &metapb.GetAttrRequest{Ino: open}); err != nil {
			t.Fatalf("an open file purged before its close: %v", err)
		}
		if _, err := e.s.Release(e.ctx, &metapb.ReleaseRequest{Ino: open, SessionId: sess.SessionId}); err != nil {
			t.Fatal(err)
		}
		if _, err := e.s.GetAttr(e.ctx, &metapb.GetAttrRequest{Ino: open}); err == nil {
			t.Fatal("purged file kept after its last close")
		}
		if e.s.inodes.Load() != 1 {
			t.Fatalf("%d inodes, want the root", e.s.inodes.Load())
		}
	})
}
