package server_test

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/meta/client"
	"github.com/rdmafs/rdmafs/meta/core"
	"github.com/rdmafs/rdmafs/meta/metapb"
	"github.com/rdmafs/rdmafs/meta/metatest"
)

// waitFor polls cond until it holds or the timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestChunkserverDownAndUp runs the server's background loop with a short
// heartbeat timeout: a silent chunkserver goes down, and up when it returns.
func TestChunkserverDownAndUp(t *testing.T) {
	m := metatest.Start(t, metatest.Options{HeartbeatTimeout: 300 * time.Millisecond})
	c := m.Client(t)
	ctx := context.Background()
	if _, err := c.Register(ctx, &metapb.RegisterRequest{Id: "silent", Address: "127.0.0.1:1", Capacity: 1 << 30}); err != nil {
		t.Fatal(err)
	}
	up := func() bool {
		st, err := c.Status(ctx, &metapb.StatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return st.Chunkservers[0].Up
	}
	if !up() {
		t.Fatal("freshly registered chunkserver is down")
	}
	waitFor(t, 3*time.Second, "chunkserver down", func() bool { return !up() })
	if _, err := c.Heartbeat(ctx, &metapb.HeartbeatRequest{Id: "silent", Free: 1 << 30}); err != nil {
		t.Fatal(err)
	}
	if !up() {
		t.Fatal("chunkserver not up after a heartbeat")
	}
}

// TestDeadClientSessionExpires: a client that opened a file, unlinked it and
// vanished without closing loses its session after the TTL, and the file is
// deleted.
func TestDeadClientSessionExpires(t *testing.T) {
	m := metatest.Start(t, metatest.Options{SessionTTL: 300 * time.Millisecond})
	c := m.Client(t)
	ctx := context.Background()
	s, err := c.OpenSession(ctx, &metapb.OpenSessionRequest{Client: "doomed"}) // no keepalives
	if err != nil {
		t.Fatal(err)
	}
	f, err := c.Create(ctx, &metapb.CreateRequest{Parent: core.RootIno, Name: "f", Mode: 0o644, SessionId: s.SessionId})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Unlink(ctx, &metapb.UnlinkRequest{Parent: core.RootIno, Name: "f"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the open-unlinked file of an expired session to go", func() bool {
		_, err := c.GetAttr(ctx, &metapb.GetAttrRequest{Ino: f.Attr.Ino})
		return client.Errno(err) == syscall.ENOENT
	})
	_, err = c.KeepAlive(ctx, &metapb.KeepAliveRequest{SessionId: s.SessionId})
	if client.Errno(err) != syscall.ESTALE {
		t.Fatalf("keepalive of an expired session: %v", err)
	}
}

// TestRestartKeepsSessions: sessions and the files they hold open survive a
// meta server restart.
func TestRestartKeepsSessions(t *testing.T) {
	m := metatest.Start(t, metatest.Options{SessionTTL: 5 * time.Second})
	ctx := context.Background()
	c := m.Client(t)
	s, err := c.OpenSession(ctx, &metapb.OpenSessionRequest{Client: "survivor"})
	if err != nil {
		t.Fatal(err)
	}
	f, err := c.Create(ctx, &metapb.CreateRequest{Parent: core.RootIno, Name: "f", Mode: 0o644, SessionId: s.SessionId})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Unlink(ctx, &metapb.UnlinkRequest{Parent: core.RootIno, Name: "f"}); err != nil {
		t.Fatal(err)
	}
	m.Restart(t)
	c = m.Client(t)
	if _, err := c.KeepAlive(ctx, &metapb.KeepAliveRequest{SessionId: s.SessionId}); err != nil {
		t.Fatalf("session lost across restart: %v", err)
	}
	if _, err := c.GetAttr(ctx, &metapb.GetAttrRequest{Ino: f.Attr.Ino}); err != nil {
		t.Fatalf("open-unlinked file lost across restart: %v", err)
	}
	if _, err := c.Release(ctx, &metapb.ReleaseRequest{Ino: f.Attr.Ino, SessionId: s.SessionId}); err != nil {
		t.Fatal(err)
	}
	_, err = c.GetAttr(ctx, &metapb.GetAttrRequest{Ino: f.Attr.Ino})
	if client.Errno(err) != syscall.ENOENT {
		t.Fatalf("file kept after its last release: %v", err)
	}
}
