package core

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/rdmafs/rdmafs/meta/keys"
	"github.com/rdmafs/rdmafs/meta/kv"
	"github.com/rdmafs/rdmafs/meta/metaerr"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// TestRandomOperationsKeepInvariants runs random namespace operations from
// concurrent workers over a small shared tree (so they collide), then checks
// every invariant with Check, also after a restart.
func TestRandomOperationsKeepInvariants(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		e.chunkservers(6)
		sess, err := e.s.OpenSession(e.ctx, &metapb.OpenSessionRequest{Client: "stress"})
		if err != nil {
			t.Fatal(err)
		}
		dirs := []uint64{RootIno, e.mkdir(root, RootIno, "a", 0o777), e.mkdir(root, RootIno, "b", 0o777)}
		dirs = append(dirs, e.mkdir(root, dirs[1], "c", 0o777))
		var mu sync.Mutex
		pickDir := func(r *rand.Rand) uint64 {
			mu.Lock()
			defer mu.Unlock()
			return dirs[r.IntN(len(dirs))]
		}
		name := func(r *rand.Rand) string { return fmt.Sprintf("n%d", r.IntN(12)) }
		const workers, ops = 8, 250
		var wg sync.WaitGroup
		var unexpected []error
		var succeeded [11]int
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				r := rand.New(rand.NewPCG(uint64(w), 42))
				for i := 0; i < ops; i++ {
					var err error
					op := r.IntN(11)
					switch op {
					case 0, 1:
						var cr *metapb.EntryReply
						cr, err = e.s.Create(e.ctx, &metapb.CreateRequest{Parent: pickDir(r), Name: name(r), Mode: 0o644, Exclusive: r.IntN(2) == 0, SessionId: sess.SessionId})
						if err == nil && r.IntN(2) == 0 {
							_, err = e.s.Release(e.ctx, &metapb.ReleaseRequest{Ino: cr.Attr.Ino, SessionId: sess.SessionId})
						}
					case 2:
						var d *metapb.EntryReply
						d, err = e.s.Mkdir(e.ctx, &metapb.MkdirRequest{Parent: pickDir(r), Name: name(r), Mode: 0o777})
						if err == nil {
							mu.Lock()
							dirs = append(dirs, d.Attr.Ino)
							mu.Unlock()
						}
					case 3:
						_, err = e.s.Unlink(e.ctx, &metapb.UnlinkRequest{Parent: pickDir(r), Name: name(r)})
					case 4:
						// Empty directories under their own names, so that
						// rmdir succeeds as often as it fails.
						p, n := pickDir(r), fmt.Sprintf("e%d", r.IntN(3))
						if _, merr := e.s.Mkdir(e.ctx, &metapb.MkdirRequest{Parent: p, Name: n, Mode: 0o777}); merr != nil && metaerr.Errno(merr) != syscall.EEXIST {
							err = merr
							break
						}
						_, err = e.s.Rmdir(e.ctx, &metapb.RmdirRequest{Parent: pickDir(r), Name: n})
					case 5, 6:
						flags := []uint32{0, 0, uint32(metapb.RenameFlag_RENAME_NOREPLACE), uint32(metapb.RenameFlag_RENAME_EXCHANGE)}[r.IntN(4)]
						_, err = e.s.Rename(e.ctx, &metapb.RenameRequest{Parent: pickDir(r), Name: name(r), NewParent: pickDir(r), NewName: name(r), Flags: flags})
					case 7:
						var l *metapb.EntryReply
						l, err = e.s.Lookup(e.ctx, &metapb.LookupRequest{Parent: pickDir(r), Name: name(r)})
						if err == nil {
							_, err = e.s.Link(e.ctx, &metapb.LinkRequest{Ino: l.Attr.Ino, NewParent: pickDir(r), NewName: name(r)})
						}
					case 8:
						_, err = e.s.Symlink(e.ctx, &metapb.SymlinkRequest{Parent: pickDir(r), Name: name(r), Target: "x"})
					case 9:
						var l *metapb.EntryReply
						l, err = e.s.Lookup(e.ctx, &metapb.LookupRequest{Parent: pickDir(r), Name: name(r)})
						if err == nil && l.Attr.Mode&syscall.S_IFMT == syscall.S_IFREG {
							var g *metapb.GrantWriteReply
							g, err = e.s.GrantWrite(e.ctx, &metapb.GrantWriteRequest{Ino: l.Attr.Ino, Stripes: []uint64{0}})
							if err == nil {
								gr := g.Grants[0]
								_, err = e.s.CommitStripes(e.ctx, &metapb.CommitStripesRequest{Ino: l.Attr.Ino, Size: 10,
									Stripes: []*metapb.StripeCommit{{Stripe: 0, Version: gr.Version, ExpectedVersion: gr.CommittedVersion, Length: 10}}})
							}
						}
					case 10: // truncate: stripes cut or dropped
						var l *metapb.EntryReply
						l, err = e.s.Lookup(e.ctx, &metapb.LookupRequest{Parent: pickDir(r), Name: name(r)})
						if err == nil && l.Attr.Mode&syscall.S_IFMT == syscall.S_IFREG {
							_, err = e.s.SetAttr(e.ctx, &metapb.SetAttrRequest{Caller: root, Ino: l.Attr.Ino, SetSize: true, Size: uint64(r.IntN(12))})
						}
					}
					if err == nil {
						mu.Lock()
						succeeded[op]++
						mu.Unlock()
					}
					switch metaerr.Errno(err) {
					case 0, syscall.ENOENT, syscall.EEXIST, syscall.ENOTEMPTY, syscall.ENOTDIR, syscall.EISDIR, syscall.EINVAL, syscall.EPERM, syscall.EAGAIN:
					default:
						mu.Lock()
						unexpected = append(unexpected, err)
						mu.Unlock()
					}
				}
			}(w)
		}
		wg.Wait()
		if len(unexpected) > 0 {
			t.Fatalf("unexpected errors: %v", unexpected[:min(5, len(unexpected))])
		}
		t.Logf("successful operations by kind: %v", succeeded)
		for op, n := range succeeded {
			if n == 0 {
				t.Fatalf("operation kind %d succeeded only %d times: the test exercises too little", op, n)
			}
		}
		check := func(when string) {
			r, err := e.s.Check(e.ctx, &metapb.CheckRequest{})
			if err != nil {
				t.Fatal(err)
			}
			problems := r.Problems
			if len(problems) > 0 {
				t.Fatalf("%s: %d invariant violations, first: %v", when, len(problems), problems[:min(5, len(problems))])
			}
		}
		check("after random operations")
		e.restart()
		check("after restart")
		if _, err := e.s.CloseSession(e.ctx, &metapb.CloseSessionRequest{SessionId: sess.SessionId}); err != nil {
			t.Fatal(err)
		}
		check("after closing the session")
	})
}

// TestCheckRepairs damages the store behind the service's back in each way
// Check's repair fixes — a link count too high, a file no entry names, an
// entry of a missing inode, an unopened inode without links, a stripe of a
// missing inode, a wrong stored byte count — and checks that Check reports
// each, that its repair fixes each (the unnamed file lands in /lost+found)
// and that the tree is consistent afterwards.
func TestCheckRepairs(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		check := func(repair bool) *metapb.CheckReply {
			t.Helper()
			r, err := e.s.Check(e.ctx, &metapb.CheckRequest{Repair: repair})
			if err != nil {
				t.Fatal(err)
			}
			return r
		}
		if r := check(false); len(r.Problems) != 0 {
			t.Fatalf("fresh tree: %v", r.Problems)
		}
		f := e.create(root, RootIno, "f", 0o644)
		if _, err := e.s.Link(e.ctx, &metapb.LinkRequest{Ino: f, NewParent: RootIno, NewName: "g"}); err != nil {
			t.Fatal(err)
		}
		unnamed := e.create(root, RootIno, "unnamed", 0o644)
		dangling := e.create(root, RootIno, "dangling", 0o644)
		unlinked := e.create(root, RootIno, "unlinked", 0o644)
		sized := e.create(root, RootIno, "sized", 0o644)
		const stray = 1 << 40
		if err := e.store.Update(e.ctx, func(tx kvTxn) error {
			for _, name := range []string{"g", "unnamed", "unlinked"} {
				if err := removeEntryRaw(tx, RootIno, name); err != nil {
					return err
				}
			}
			if err := tx.Delete(keys.Inode(dangling)); err != nil {
				return err
			}
			rec, err := getInode(tx, unlinked)
			if err != nil {
				return err
			}
			rec.Attr.Nlink = 0
			if err := putInode(tx, rec); err != nil {
				return err
			}
			if rec, err = getInode(tx, sized); err != nil {
				return err
			}
			rec.Attr.Stored, rec.Attr.StoredKnown = 12345, true
			if err := putInode(tx, rec); err != nil {
				return err
			}
			return putMsg(tx, keys.Stripe(stray, 0), &metapb.StripeRecord{Version: 3, Length: 10, Layout: metapb.LayoutOf(e.s.def),
				Shards: []*metapb.Shard{{ChunkId: 77, ServerId: "cs-gone"}}})
		}); err != nil {
			t.Fatal(err)
		}
		r := check(false)
		if len(r.Problems) < 6 || len(r.Repaired) != 0 {
			t.Fatalf("damaged tree: %d problems %v, repaired %v; want at least 6 and no repairs without --repair", len(r.Problems), r.Problems, r.Repaired)
		}
		r = check(true)
		for _, want := range []string{fmt.Sprintf("inode %d: nlink 2 set to 1", f), fmt.Sprintf("inode %d: linked as /lost+found/#%d", unnamed, unnamed),
			fmt.Sprintf("entry \"dangling\" in %d: removed", RootIno), fmt.Sprintf("inode %d: deleted", unlinked),
			fmt.Sprintf("stripe 0 of missing inode %d: deleted", stray), fmt.Sprintf("inode %d: stored bytes 12345 set to 0", sized)} {
			if !slices.ContainsFunc(r.Repaired, func(s string) bool { return strings.HasPrefix(s, want) }) {
				t.Errorf("repairs %q: none starts with %q", r.Repaired, want)
			}
		}
		if r := check(false); len(r.Problems) != 0 {
			t.Fatalf("after the repair: %v", r.Problems)
		}
		lf, err := e.s.Lookup(e.ctx, &metapb.LookupRequest{Caller: root, Parent: RootIno, Name: "lost+found"})
		if err != nil {
			t.Fatal(err)
		}
		if got, err := e.s.Lookup(e.ctx, &metapb.LookupRequest{Caller: root, Parent: lf.Attr.Ino, Name: fmt.Sprintf("#%d", unnamed)}); err != nil || got.Attr.Ino != unnamed || got.Attr.Nlink != 1 {
			t.Fatalf("lost+found entry of inode %d: %v %v", unnamed, got, err)
		}
		if _, err := e.s.GetAttr(e.ctx, &metapb.GetAttrRequest{Ino: unlinked}); metaerr.Errno(err) != syscall.ENOENT {
			t.Fatalf("unlinked inode after repair: %v, want ENOENT", err)
		}
		var gc int
		if err := e.store.View(e.ctx, func(r kv.Reader) error {
			_, ok, err := r.Get(keys.GC("cs-gone", 77, 3))
			if ok {
				gc++
			}
			return err
		}); err != nil || gc != 1 {
			t.Fatalf("the stray stripe's chunk is not queued for collection (%v)", err)
		}
	})
}

// TestCheckFindsDamage makes sure Check is not blind: it must report a
// broken link count.
func TestCheckFindsDamage(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		f := e.create(root, RootIno, "f", 0o644)
		if r, err := e.s.Check(e.ctx, &metapb.CheckRequest{}); err != nil || len(r.Problems) != 0 {
			t.Fatalf("fresh tree: %v %v", r, err)
		}
		if _, err := e.s.Link(e.ctx, &metapb.LinkRequest{Ino: f, NewParent: RootIno, NewName: "g"}); err != nil {
			t.Fatal(err)
		}
		// Remove the entry behind the service's back.
		if err := e.store.Update(e.ctx, func(tx kvTxn) error { return removeEntryRaw(tx, RootIno, "g") }); err != nil {
			t.Fatal(err)
		}
		r, err := e.s.Check(e.ctx, &metapb.CheckRequest{})
		if err != nil || len(r.Problems) == 0 {
			t.Fatalf("damaged tree passes Check: %v", err)
		}
	})
}
