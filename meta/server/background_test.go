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

// openUnlinked opens a session for clientName, creates the file "f" in the
// root directory held open by that session, and unlinks it; it returns the
// session and the file's inode, which lives on until the session releases
// it or expires.
func openUnlinked(t *testing.T, c *client.Client, clientName string) (session, ino uint64) {
	t.Helper()
	ctx := context.Background()
	s, err := c.OpenSession(ctx, &metapb.OpenSessionRequest{Client: clientName})
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
	return s.SessionId, f.Attr.Ino
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
	session, ino := openUnlinked(t, c, "doomed") // no keepalives
	waitFor(t, 5*time.Second, "the open-unlinked file of an expired session to go", func() bool {
		_, err := c.GetAttr(ctx, &metapb.GetAttrRequest{Ino: ino})
		return client.Errno(err) == syscall.ENOENT
	})
	// The session is forgotten once the transaction that ended it (and
	// deleted the file) has committed: a moment after the file is gone.
	waitFor(t, 5*time.Second, "keepalives of the expired session to fail with ESTALE", func() bool {
		_, err := c.KeepAlive(ctx, &metapb.KeepAliveRequest{SessionId: session})
		return client.Errno(err) == syscall.ESTALE
	})
}

// TestRestartKeepsSessions: sessions and the files they hold open survive a
// meta server restart.
func TestRestartKeepsSessions(t *testing.T) {
	m := metatest.Start(t, metatest.Options{SessionTTL: 5 * time.Second})
	ctx := context.Background()
	session, ino := openUnlinked(t, m.Client(t), "survivor")
	m.Restart(t)
	c := m.Client(t)
	if _, err := c.KeepAlive(ctx, &metapb.KeepAliveRequest{SessionId: session}); err != nil {
		t.Fatalf("session lost across restart: %v", err)
	}
	if _, err := c.GetAttr(ctx, &metapb.GetAttrRequest{Ino: ino}); err != nil {
		t.Fatalf("open-unlinked file lost across restart: %v", err)
	}
	if _, err := c.Release(ctx, &metapb.ReleaseRequest{Ino: ino, SessionId: session}); err != nil {
		t.Fatal(err)
	}
	_, err := c.GetAttr(ctx, &metapb.GetAttrRequest{Ino: ino})
	if client.Errno(err) != syscall.ENOENT {
		t.Fatalf("file kept after its last release: %v", err)
	}
}
