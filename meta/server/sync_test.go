package server_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rdmafs/rdmafs/meta/client"
	"github.com/rdmafs/rdmafs/meta/core"
	"github.com/rdmafs/rdmafs/meta/metapb"
	"github.com/rdmafs/rdmafs/meta/metatest"
	"github.com/rdmafs/rdmafs/meta/server"
)

// TestSyncedCommitCoversSync: an fsync's commit that meta answers once
// durable (CommitStripesRequest.Sync) makes the Sync after it free: the
// client sends none, as long as no other change returned meanwhile. After a
// change that is not, the Sync goes to meta.
func TestSyncedCommitCoversSync(t *testing.T) {
	ctx := context.Background()
	dir, secret := formatted(t)
	reg := prometheus.NewRegistry()
	s, err := server.Start(ctx, server.Config{DataDir: dir, Listen: "127.0.0.1:0", Secret: secret, Registry: reg,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop(ctx)
	c, err := client.Dial(s.Addr(), secret)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	syncs := func() int { return metatest.OpsIn(t, reg, "Sync") }
	r, err := c.Create(ctx, &metapb.CreateRequest{Parent: core.RootIno, Name: "f", Mode: 0o644})
	if err != nil {
		t.Fatal(err)
	}
	var version uint64
	commit := func(data string, sync bool) {
		t.Helper()
		cr, err := c.CommitStripes(ctx, &metapb.CommitStripesRequest{Ino: r.Attr.Ino, Size: uint64(len(data)), Sync: sync,
			Stripes: []*metapb.StripeCommit{{Stripe: 0, ExpectedVersion: version, Length: uint64(len(data)), Inline: true, Data: []byte(data)}}})
		if err != nil {
			t.Fatal(err)
		}
		version = cr.Versions[0]
	}
	commit("one", true)
	if _, err := c.Sync(ctx, &metapb.SyncRequest{}); err != nil {
		t.Fatal(err)
	}
	if n := syncs(); n != 0 {
		t.Fatalf("a Sync after a synced commit reached meta (%v calls)", n)
	}
	commit("two", false)
	if _, err := c.Sync(ctx, &metapb.SyncRequest{}); err != nil {
		t.Fatal(err)
	}
	if n := syncs(); n != 1 {
		t.Fatalf("a Sync after an unsynced commit: %v calls at meta, want 1", n)
	}

	// A synced commit that travels in a batch behind a create sent behind
	// (held back by a long linger) covers the batch.
	c.SetLinger(time.Hour)
	sess, err := c.StartSession(ctx, "sync test", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close(ctx)
	caller := &metapb.Caller{Session: sess.ID()}
	if r, err := c.Lookup(ctx, &metapb.LookupRequest{Caller: caller, Parent: core.RootIno, Name: "g", Reserve: true}); err != nil || !r.Reserved {
		t.Fatalf("lookup with reserve: %v, %v", r, err)
	}
	ino, ok := sess.NextIno()
	if !ok {
		t.Fatal("a new session has no inode numbers at hand")
	}
	created := make(chan error, 1)
	if !sess.CreateBehind(&metapb.CreateRequest{Caller: caller, Parent: core.RootIno, Name: "g", Mode: 0o644, Exclusive: true,
		Ino: ino, TimeNs: time.Now().UnixNano()}, func(err error) { created <- err }) {
		t.Fatal("CreateBehind queued nothing")
	}
	if _, err := c.CommitStripes(ctx, &metapb.CommitStripesRequest{Ino: ino, Size: 1, Sync: true,
		Stripes: []*metapb.StripeCommit{{Stripe: 0, Length: 1, Inline: true, Data: []byte("g")}}}); err != nil {
		t.Fatal(err)
	}
	if err := <-created; err != nil {
		t.Fatal(err)
	}
	if _, err := c.Sync(ctx, &metapb.SyncRequest{}); err != nil {
		t.Fatal(err)
	}
	if n := syncs(); n != 1 {
		t.Fatalf("a Sync after a batch ending with a synced commit: %v calls at meta in all, want still 1", n)
	}
}
