package server_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/meta/auth"
	"github.com/rdmafs/rdmafs/meta/client"
	"github.com/rdmafs/rdmafs/meta/core"
	"github.com/rdmafs/rdmafs/meta/kv/etcdkv/etcdtest"
	"github.com/rdmafs/rdmafs/meta/metapb"
	"github.com/rdmafs/rdmafs/meta/server"
)

// TestLeaderFailover runs two meta servers on one etcd: one serves, the
// other stands by and answers Unavailable; a client given both addresses
// keeps creating files while the leader stops, and every create succeeds
// exactly once on the new leader.
func TestLeaderFailover(t *testing.T) {
	etcd := etcdtest.StartT(t)
	ctx := context.Background()
	url := etcd.URL("ha")
	secretFile := t.TempDir() + "/secret"
	if _, err := server.FormatStore(ctx, "", url, secretFile, core.StandardLayout()); err != nil {
		t.Fatal(err)
	}
	if _, err := server.FormatStore(ctx, "", url, t.TempDir()+"/s2", core.StandardLayout()); err == nil {
		t.Fatal("formatting a formatted etcd prefix succeeded")
	}
	secret, err := auth.ReadSecretFile(secretFile)
	if err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	start := func() *server.Server {
		s, err := server.Start(ctx, server.Config{KV: url, Listen: "127.0.0.1:0", Secret: secret, Logger: quiet, ElectionTTL: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Stop(ctx) })
		return s
	}
	a := start()
	waitLeader(t, a)
	b := start()
	time.Sleep(200 * time.Millisecond)
	if b.IsLeader() {
		t.Fatal("two leaders")
	}
	// The standby refuses calls with Unavailable.
	if _, err := rawClient(t, b.Addr()).GetAttr(ctx, &metapb.GetAttrRequest{Ino: core.RootIno}); err == nil || client.Errno(err) == 0 {
		t.Fatalf("standby answered: %v", err)
	}
	c, err := client.Dial(b.Addr()+","+a.Addr(), secret)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const files = 60
	done := make(chan error, 1)
	go func() {
		for i := 0; i < files; i++ {
			if _, err := c.Create(ctx, &metapb.CreateRequest{Parent: core.RootIno, Name: fmt.Sprintf("f%d", i), Mode: 0o644, Exclusive: true}); err != nil {
				done <- fmt.Errorf("create f%d: %w", i, err)
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
		done <- nil
	}()
	time.Sleep(100 * time.Millisecond)
	if err := a.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !b.IsLeader() {
		t.Fatal("the standby did not take over")
	}
	if c.Current() != b.Addr() {
		t.Fatalf("client talks to %s, want the new leader %s", c.Current(), b.Addr())
	}
	r, err := c.ReadDir(ctx, &metapb.ReadDirRequest{Ino: core.RootIno, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Entries) != files {
		t.Fatalf("%d entries after failover, want %d", len(r.Entries), files)
	}
}

func waitLeader(t *testing.T, s *server.Server) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !s.IsLeader() {
		if time.Now().After(deadline) {
			t.Fatal("no leader after 15s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
