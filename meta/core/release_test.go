package core

import (
	"syscall"
	"testing"

	"github.com/rdmafs/rdmafs/meta/metaerr"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// TestReleaseBatch releases several opens in one call: each listed inode
// loses one open, an inode listed twice two, one not open is skipped, and
// an unlinked file whose last open goes is deleted.
func TestReleaseBatch(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		sess, err := e.s.OpenSession(e.ctx, &metapb.OpenSessionRequest{Client: "batch"})
		if err != nil {
			t.Fatal(err)
		}
		f := e.create(root, RootIno, "f", 0o644)
		g := e.create(root, RootIno, "g", 0o644)
		for _, ino := range []uint64{f, f, g} {
			if _, err := e.s.Open(e.ctx, &metapb.OpenRequest{Caller: root, Ino: ino, SessionId: sess.SessionId, Flags: syscall.O_RDONLY}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := e.s.Unlink(e.ctx, &metapb.UnlinkRequest{Caller: root, Parent: RootIno, Name: "g"}); err != nil {
			t.Fatal(err)
		}
		if _, err := e.s.Release(e.ctx, &metapb.ReleaseRequest{Ino: f, SessionId: sess.SessionId, More: []uint64{9999, g, f}}); err != nil {
			t.Fatal(err)
		}
		if _, err := e.s.GetAttr(e.ctx, &metapb.GetAttrRequest{Ino: g}); metaerr.Errno(err) != syscall.ENOENT {
			t.Errorf("unlinked file after its last release: %v, want ENOENT", err)
		}
		_, err = e.s.Release(e.ctx, &metapb.ReleaseRequest{Ino: f, SessionId: sess.SessionId})
		wantErrno(t, err, syscall.EBADF) // both opens of f went in the batch
		_, err = e.s.Release(e.ctx, &metapb.ReleaseRequest{Ino: f, SessionId: sess.SessionId, More: make([]uint64, MaxReleasesPerCall+1)})
		wantErrno(t, err, syscall.EINVAL)
	})
}
