package core

import (
	"context"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/rdmafs/rdmafs/meta/metaerr"
	"github.com/rdmafs/rdmafs/meta/metapb"
	"github.com/rdmafs/rdmafs/meta/reqid"
)

// TestExactlyOnce sends every mutating request twice with one request id,
// the second time as a retry (as after a failover where the first reply was
// lost): the retry must return the first reply, not an error such as EEXIST
// or ENOENT, and must not apply the operation twice.
func TestExactlyOnce(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		sess, err := e.s.OpenSession(e.ctx, &metapb.OpenSessionRequest{Client: "t"})
		if err != nil {
			t.Fatal(err)
		}
		sid := sess.SessionId
		f := e.create(root, RootIno, "f", 0o644)
		e.mkdir(root, RootIno, "d", 0o755)
		seq := uint64(0)
		tests := []struct {
			name string
			call func(ctx context.Context) (proto.Message, error)
		}{
			{"create", func(ctx context.Context) (proto.Message, error) {
				return e.s.Create(ctx, &metapb.CreateRequest{Caller: root, Parent: RootIno, Name: "new", Mode: 0o644, Exclusive: true, SessionId: sid})
			}},
			{"mkdir", func(ctx context.Context) (proto.Message, error) {
				return e.s.Mkdir(ctx, &metapb.MkdirRequest{Caller: root, Parent: RootIno, Name: "newdir", Mode: 0o755})
			}},
			{"symlink", func(ctx context.Context) (proto.Message, error) {
				return e.s.Symlink(ctx, &metapb.SymlinkRequest{Caller: root, Parent: RootIno, Name: "ln", Target: "f"})
			}},
			{"link", func(ctx context.Context) (proto.Message, error) {
				return e.s.Link(ctx, &metapb.LinkRequest{Caller: root, Ino: f, NewParent: RootIno, NewName: "hard"})
			}},
			{"rename", func(ctx context.Context) (proto.Message, error) {
				return e.s.Rename(ctx, &metapb.RenameRequest{Caller: root, Parent: RootIno, Name: "hard", NewParent: RootIno, NewName: "hard2"})
			}},
			{"unlink", func(ctx context.Context) (proto.Message, error) {
				return e.s.Unlink(ctx, &metapb.UnlinkRequest{Caller: root, Parent: RootIno, Name: "hard2"})
			}},
			{"rmdir", func(ctx context.Context) (proto.Message, error) {
				return e.s.Rmdir(ctx, &metapb.RmdirRequest{Caller: root, Parent: RootIno, Name: "d"})
			}},
			{"setxattr create", func(ctx context.Context) (proto.Message, error) {
				return e.s.SetXattr(ctx, &metapb.SetXattrRequest{Caller: root, Ino: f, Name: "user.a", Value: []byte("v"), Flags: uint32(metapb.XattrFlag_XATTR_CREATE)})
			}},
			{"removexattr", func(ctx context.Context) (proto.Message, error) {
				return e.s.RemoveXattr(ctx, &metapb.RemoveXattrRequest{Caller: root, Ino: f, Name: "user.a"})
			}},
			{"open", func(ctx context.Context) (proto.Message, error) {
				return e.s.Open(ctx, &metapb.OpenRequest{Caller: root, Ino: f, SessionId: sid, Flags: syscall.O_RDONLY})
			}},
			{"release", func(ctx context.Context) (proto.Message, error) {
				return e.s.Release(ctx, &metapb.ReleaseRequest{Ino: f, SessionId: sid})
			}},
			{"setattr", func(ctx context.Context) (proto.Message, error) {
				return e.s.SetAttr(ctx, &metapb.SetAttrRequest{Caller: root, Ino: f, SetMode: true, Mode: 0o600})
			}},
			{"close session", func(ctx context.Context) (proto.Message, error) {
				return e.s.CloseSession(ctx, &metapb.CloseSessionRequest{SessionId: sid})
			}},
		}
		var createID reqid.ID
		for _, tt := range tests {
			seq++
			id := reqid.ID{Client: 0xfeed, Seq: seq, Millis: uint64(e.clock.Now().UnixMilli())}
			if tt.name == "create" {
				createID = id
			}
			first, err := tt.call(reqid.NewIncoming(e.ctx, id))
			if err != nil {
				t.Fatalf("%s: first attempt: %v", tt.name, err)
			}
			e.clock.Advance(time.Millisecond)
			id.Retry = true
			again, err := tt.call(reqid.NewIncoming(e.ctx, id))
			if err != nil {
				t.Fatalf("%s: retry with the same request id: %v", tt.name, err)
			}
			if !proto.Equal(first, again) {
				t.Fatalf("%s: retry returned %v, first reply was %v", tt.name, again, first)
			}
		}
		// Applied once: the open count went 1 -> 0, so a further release fails.
		if _, err := e.s.Release(e.ctx, &metapb.ReleaseRequest{Ino: f, SessionId: sid}); metaerr.Errno(err) != syscall.ESTALE && metaerr.Errno(err) != syscall.EBADF {
			t.Fatalf("release after the replayed release: %v", err)
		}
		if _, err := e.lookup(RootIno, "new"); err != nil {
			t.Fatalf("created file missing: %v", err)
		}
		// A retry whose first attempt never committed runs normally.
		ctx := reqid.NewIncoming(e.ctx, reqid.ID{Client: 0xfeed, Seq: 1000, Millis: uint64(e.clock.Now().UnixMilli()), Retry: true})
		if _, err := e.s.Mkdir(ctx, &metapb.MkdirRequest{Caller: root, Parent: RootIno, Name: "fresh", Mode: 0o755}); err != nil {
			t.Fatalf("retry of an unknown request: %v", err)
		}
		// Without a request id nothing is deduplicated: EEXIST as before.
		_, err = e.s.Mkdir(e.ctx, &metapb.MkdirRequest{Caller: root, Parent: RootIno, Name: "fresh", Mode: 0o755})
		wantErrno(t, err, syscall.EEXIST)
		// Records expire after RequestTTL, not before.
		createID.Retry = true
		retryCreate := func() error {
			_, err := e.s.Create(reqid.NewIncoming(e.ctx, createID), &metapb.CreateRequest{Caller: root, Parent: RootIno, Name: "new", Mode: 0o644, Exclusive: true})
			return err
		}
		e.clock.Advance(4 * time.Minute) // within RequestTTL (5m)
		if err := e.s.expireRequests(e.ctx); err != nil {
			t.Fatal(err)
		}
		if err := retryCreate(); err != nil {
			t.Fatalf("retry of the create within RequestTTL: %v", err)
		}
		e.clock.Advance(7 * time.Minute) // past RequestTTL
		if err := e.s.expireRequests(e.ctx); err != nil {
			t.Fatal(err)
		}
		wantErrno(t, retryCreate(), syscall.EEXIST)
		// A malformed id is refused clearly.
		bad := reqid.NewIncoming(e.ctx, reqid.ID{})
		bad = withBadID(bad)
		_, err = e.s.Mkdir(bad, &metapb.MkdirRequest{Caller: root, Parent: RootIno, Name: "x", Mode: 0o755})
		wantErrno(t, err, syscall.EINVAL)
	})
}

// withBadID replaces the request id of an incoming context with garbage.
func withBadID(ctx context.Context) context.Context {
	return metadata.NewIncomingContext(ctx, metadata.Pairs(reqid.HeaderID, "not-an-id"))
}
