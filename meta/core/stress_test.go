package core

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"syscall"
	"testing"

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
			problems, err := e.s.Check(e.ctx)
			if err != nil {
				t.Fatal(err)
			}
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

// TestCheckFindsDamage makes sure Check is not blind: it must report a
// broken link count.
func TestCheckFindsDamage(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		f := e.create(root, RootIno, "f", 0o644)
		if problems, err := e.s.Check(e.ctx); err != nil || len(problems) != 0 {
			t.Fatalf("fresh tree: %v %v", problems, err)
		}
		if _, err := e.s.Link(e.ctx, &metapb.LinkRequest{Ino: f, NewParent: RootIno, NewName: "g"}); err != nil {
			t.Fatal(err)
		}
		// Remove the entry behind the service's back.
		if err := e.store.Update(e.ctx, func(tx kvTxn) error { return removeEntryRaw(tx, RootIno, "g") }); err != nil {
			t.Fatal(err)
		}
		problems, err := e.s.Check(e.ctx)
		if err != nil || len(problems) == 0 {
			t.Fatalf("damaged tree passes Check: %v", err)
		}
	})
}
