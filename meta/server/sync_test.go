package server_test

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rdmafs/rdmafs/meta/client"
	"github.com/rdmafs/rdmafs/meta/core"
	"github.com/rdmafs/rdmafs/meta/metapb"
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
	syncs := func() float64 {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		n := 0.0
		for _, mf := range mfs {
			if mf.GetName() != "rdmafs_meta_ops_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "method" && l.GetValue() == "Sync" {
						n += m.GetCounter().GetValue()
					}
				}
			}
		}
		return n
	}
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
}
