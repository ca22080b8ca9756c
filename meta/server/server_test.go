package server_test

import (
	"context"
	"strings"
	"syscall"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rdmafs/rdmafs/meta/client"
	"github.com/rdmafs/rdmafs/meta/core"
	"github.com/rdmafs/rdmafs/meta/metapb"
	"github.com/rdmafs/rdmafs/meta/metatest"
)

func TestSecretRequired(t *testing.T) {
	m := metatest.Start(t, metatest.Options{})
	ctx := context.Background()
	tests := []struct {
		name   string
		secret string
		want   codes.Code
		msg    string
	}{
		{"right secret", m.Secret, codes.OK, ""},
		{"wrong secret", strings.Repeat("0", len(m.Secret)), codes.Unauthenticated, "wrong cluster secret"},
		{"prefix of the secret", m.Secret[:10], codes.Unauthenticated, "wrong cluster secret"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := client.Dial(m.Addr, tt.secret)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_, err = c.GetAttr(ctx, &metapb.GetAttrRequest{Ino: core.RootIno})
			if status.Code(err) != tt.want || (tt.msg != "" && !strings.Contains(err.Error(), tt.msg)) {
				t.Fatalf("err = %v, want %v %q", err, tt.want, tt.msg)
			}
		})
	}
	// No secret at all: a raw connection without credentials.
	if _, err := client.Dial(m.Addr, ""); err == nil {
		t.Fatal("Dial accepted an empty secret")
	}
	raw := rawClient(t, m.Addr)
	_, err := raw.GetAttr(ctx, &metapb.GetAttrRequest{Ino: core.RootIno})
	if status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "missing cluster secret") {
		t.Fatalf("call without secret: %v", err)
	}
	// Chunkserver calls are refused too.
	_, err = raw.Register(ctx, &metapb.RegisterRequest{Id: "x", Address: "a:1"})
	if status.Code(err) != codes.Unauthenticated {
		t.Fatalf("register without secret: %v", err)
	}
}

func TestErrnosCrossTheWire(t *testing.T) {
	m := metatest.Start(t, metatest.Options{})
	c := m.Client(t)
	ctx := context.Background()
	if _, err := c.Mkdir(ctx, &metapb.MkdirRequest{Parent: core.RootIno, Name: "d", Mode: 0o755}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Create(ctx, &metapb.CreateRequest{Parent: core.RootIno, Name: "f", Mode: 0o644}); err != nil {
		t.Fatal(err)
	}
	errOf := func(_ any, err error) error { return err }
	tests := []struct {
		name string
		err  error
		want syscall.Errno
	}{
		{"ENOENT", errOf(c.Lookup(ctx, &metapb.LookupRequest{Parent: core.RootIno, Name: "x"})), syscall.ENOENT},
		{"EEXIST", errOf(c.Mkdir(ctx, &metapb.MkdirRequest{Parent: core.RootIno, Name: "d"})), syscall.EEXIST},
		{"ENOTDIR", errOf(c.Rmdir(ctx, &metapb.RmdirRequest{Parent: core.RootIno, Name: "f"})), syscall.ENOTDIR},
		{"EISDIR", errOf(c.Unlink(ctx, &metapb.UnlinkRequest{Parent: core.RootIno, Name: "d"})), syscall.EISDIR},
		{"ENAMETOOLONG", errOf(c.Lookup(ctx, &metapb.LookupRequest{Parent: core.RootIno, Name: strings.Repeat("n", 256)})), syscall.ENAMETOOLONG},
		{"EACCES", errOf(c.Create(ctx, &metapb.CreateRequest{Caller: &metapb.Caller{Uid: 7}, Parent: core.RootIno, Name: "g"})), syscall.EACCES},
		{"ENODATA", errOf(c.GetXattr(ctx, &metapb.GetXattrRequest{Ino: core.RootIno, Name: "user.x"})), syscall.ENODATA},
		{"EHOSTDOWN without chunkservers (writers wait it out)", errOf(c.GrantWrite(ctx, &metapb.GrantWriteRequest{Ino: 3, Stripes: []uint64{0}})), syscall.EHOSTDOWN},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := client.Errno(tt.err); got != tt.want {
				t.Fatalf("Errno(%v) = %v, want %v", tt.err, got, tt.want)
			}
		})
	}
	if got := client.Errno(nil); got != 0 {
		t.Fatalf("Errno(nil) = %v", got)
	}
}

func TestStripesOverGRPC(t *testing.T) {
	m := metatest.Start(t, metatest.Options{})
	c := m.Client(t)
	ctx := context.Background()
	metatest.FakeChunkservers(t, c, 6, 100e6)
	f, err := c.Create(ctx, &metapb.CreateRequest{Parent: core.RootIno, Name: "f", Mode: 0o644})
	if err != nil {
		t.Fatal(err)
	}
	g, err := c.GrantWrite(ctx, &metapb.GrantWriteRequest{Ino: f.Attr.Ino, Stripes: []uint64{0}})
	if err != nil {
		t.Fatal(err)
	}
	g2, err := c.GrantWrite(ctx, &metapb.GrantWriteRequest{Ino: f.Attr.Ino, Stripes: []uint64{0}})
	if err != nil {
		t.Fatal(err)
	}
	commit := func(gr *metapb.StripeGrant) error {
		_, err := c.CommitStripes(ctx, &metapb.CommitStripesRequest{Ino: f.Attr.Ino, Size: 5,
			Stripes: []*metapb.StripeCommit{{Stripe: 0, Version: gr.Version, ExpectedVersion: gr.CommittedVersion, Length: 5}}})
		return err
	}
	if err := commit(g.Grants[0]); err != nil {
		t.Fatal(err)
	}
	err = commit(g2.Grants[0])
	if status.Code(err) != codes.Aborted || len(client.ConflictStripes(err)) != 1 || client.Errno(err) != syscall.EAGAIN {
		t.Fatalf("conflict over gRPC: %v (stripes %v)", err, client.ConflictStripes(err))
	}
	st, err := c.Status(ctx, &metapb.StatusRequest{})
	if err != nil || len(st.Chunkservers) != 6 || st.Stripes != 1 {
		t.Fatalf("status %v %v", st, err)
	}
}

func TestSessionKeepalive(t *testing.T) {
	m := metatest.Start(t, metatest.Options{SessionTTL: 300e6})
	c := m.Client(t)
	ctx := context.Background()
	s, err := c.StartSession(ctx, "test", 0)
	if err != nil {
		t.Fatal(err)
	}
	f, err := c.Create(ctx, &metapb.CreateRequest{Parent: core.RootIno, Name: "f", Mode: 0o644, SessionId: s.ID()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Unlink(ctx, &metapb.UnlinkRequest{Parent: core.RootIno, Name: "f"}); err != nil {
		t.Fatal(err)
	}
	// Several TTLs pass: the keepalives hold the session and the file.
	for i := 0; i < 10; i++ {
		if _, err := c.GetAttr(ctx, &metapb.GetAttrRequest{Ino: f.Attr.Ino}); err != nil {
			t.Fatalf("open unlinked file lost while the session is alive: %v", err)
		}
		// Real time on purpose: the client's keepalive timer and the
		// server's session expiry both run on the real clock (neither the
		// meta client nor server.Config takes one to inject).
		sleep(100e6)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = c.GetAttr(ctx, &metapb.GetAttrRequest{Ino: f.Attr.Ino})
	if client.Errno(err) != syscall.ENOENT {
		t.Fatalf("after close: %v", err)
	}
}
