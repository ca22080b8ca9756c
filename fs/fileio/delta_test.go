package fileio_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/klauspost/reedsolomon"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/rdmafs/rdmafs/chunkserver/chunk"
	"github.com/rdmafs/rdmafs/chunkserver/chunktest"
	"github.com/rdmafs/rdmafs/chunkserver/proto"
	"github.com/rdmafs/rdmafs/fs/fstest"
	"github.com/rdmafs/rdmafs/internal/stripe"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// TestDeltaWrites overwrites small ranges of a file's committed stripes with
// an fsync after each few writes, as a database does: the stripes flush as
// parity deltas. A chunkserver stops half way (the deltas that meet it fail
// over to whole rewrites), and at the end a second one: with two of k+m
// shards gone every stripe is read back through its parity, so a wrong
// parity delta shows as wrong bytes. Both an erasure-coded layout and
// replication (k = 1).
func TestDeltaWrites(t *testing.T) {
	for _, lay := range []stripe.Layout{{K: 4, M: 2, Unit: 256 << 10}, {K: 1, M: 2, Unit: 256 << 10}} {
		t.Run(fmt.Sprintf("%d+%d", lay.K, lay.M), func(t *testing.T) {
			c := fstest.Start(t, fstest.Options{Layout: lay, Chunkservers: lay.K + lay.M + 1})
			other, _ := c.Mount(t)
			stripe := int(lay.StripeSize())
			model := random(3*stripe-5000, 1) // the last stripe partly filled
			p := filepath.Join(c.Dir, "db")
			f := writeAndOpen(t, p, model)
			defer f.Close()
			r := rand.New(rand.NewPCG(2, 3))
			for step := range 60 {
				if step == 30 {
					c.Chunk[0].Stop()
				}
				for range 1 + r.IntN(3) {
					n := 1 + r.IntN(6000)
					off := r.IntN(len(model) - n)
					b := random(n, r.Uint64())
					if _, err := f.WriteAt(b, int64(off)); err != nil {
						t.Fatalf("step %d: write: %v", step, err)
					}
					copy(model[off:], b)
				}
				if err := f.Sync(); err != nil {
					t.Fatalf("step %d: fsync: %v", step, err)
				}
				if step%10 == 9 {
					readsBack(t, "db", model, other)
					if step < 30 {
						checkParity(t, c, p)
					}
				}
			}
			deltas := c.Engine.Stats().DeltaWrites.Load()
			if deltas < 20 {
				t.Fatalf("%d stripes written as deltas in 60 fsyncs of small overwrites", deltas)
			}
			c.Chunk[1].Stop()
			fresh, _ := c.Mount(t) // nothing cached
			readsBack(t, "db", model, fresh, other, c.Dir)
			t.Logf("%d delta writes", deltas)
		})
	}
}

// writeAndOpen writes data to a new file at p, synced, and opens it for
// reading and writing.
func writeAndOpen(t *testing.T, p string, data []byte) *os.File {
	t.Helper()
	if err := writeSync(p, data); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// checkParity reads every shard of every stripe of the file at p straight
// from the chunkservers' stores and checks that the parity matches the data
// (with k = 1, that the copies are equal).
func checkParity(t *testing.T, c *fstest.Cluster, p string) {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	ino := fi.Sys().(*syscall.Stat_t).Ino
	r, err := c.Meta.Client(t).GetStripes(context.Background(), &metapb.GetStripesRequest{Ino: ino, First: 0, Count: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	byID := map[string]*chunktest.Server{}
	for _, s := range c.Chunk {
		byID[s.ID()] = s
	}
	for _, si := range r.Stripes {
		l := si.Layout.Stripe()
		shards := make([][]byte, len(si.Shards))
		for i, sh := range si.Shards {
			srv := byID[sh.ServerId]
			if srv == nil {
				t.Fatalf("stripe %d shard %d on unknown chunkserver %q", si.Stripe, i, sh.ServerId)
			}
			b := make([]byte, l.Unit)
			info, err := srv.Store.ReadInto(chunk.Key{Chunk: sh.ChunkId, Version: si.Version}, b)
			if err != nil {
				t.Fatalf("stripe %d shard %d: %v", si.Stripe, i, err)
			}
			if want := l.ShardLen(int64(si.Length), i); int64(info.Length) != want {
				t.Fatalf("stripe %d (%d bytes) shard %d stored with %d bytes, want %d (short stripes)", si.Stripe, si.Length, i, info.Length, want)
			}
			// Coded at data shard 0's length: zeros after the stored bytes.
			shards[i] = b[:l.CodedLen(int64(si.Length))]
		}
		if l.K == 1 {
			for i := 1; i < len(shards); i++ {
				if !bytes.Equal(shards[i], shards[0]) {
					t.Fatalf("stripe %d version %d: copy %d differs from copy 0", si.Stripe, si.Version, i)
				}
			}
			continue
		}
		enc, err := reedsolomon.New(l.K, l.M)
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := enc.Verify(shards); !ok || err != nil {
			t.Fatalf("stripe %d version %d: parity does not match the data (%v)", si.Stripe, si.Version, err)
		}
	}
}

// TestDeltaKeepsOldBytes rewrites the same pages of a file at every fsync,
// as a database commits: the header page and the page it appends to, which
// moves on now and then. The old bytes of those ranges come from the mount's
// copy of the stripe's previous delta instead of chunkserver reads, and the
// grant from the previous delta's commit instead of a GrantWrite. Another
// mount writes the same stripe now and then, so the committed version moves
// on without this mount's delta: the copy no longer matches and must not be
// used. Every step checks that the parity on the chunkservers matches the
// data (a stale copy makes a wrong parity delta), and a fresh mount reads the
// file back at the end.
func TestDeltaKeepsOldBytes(t *testing.T) {
	lay := stripe.Layout{K: 4, M: 2, Unit: 64 << 10}
	c := fstest.Start(t, fstest.Options{Layout: lay, Chunkservers: lay.K + lay.M})
	other, _ := c.Mount(t)
	const page = 4096
	model := random(int(lay.StripeSize())+5*page, 1)
	p := filepath.Join(c.Dir, "db")
	f := writeAndOpen(t, p, model)
	defer func() { f.Close() }()
	write := func(f *os.File, off int) {
		t.Helper()
		b := random(page, uint64(off)<<20|uint64(len(model)))
		if _, err := f.WriteAt(b, int64(off)); err != nil {
			t.Fatal(err)
		}
		copy(model[off:], b)
	}
	st := c.Engine.Stats()
	for step := range 40 {
		write(f, 0)
		write(f, (20+step/8)*page) // the appended page, in data shard 1
		if step%10 == 4 {
			// The other mount rewrites the header page, and a page of
			// data shard 2 at the same shard offset (its parity ranges
			// are the header's), and this mount opens the file again
			// (close-to-open): its next delta builds on a version it did
			// not write, whose old parity bytes are not the ones it kept.
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
			g, err := os.OpenFile(filepath.Join(other, "db"), os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			write(g, 0)
			write(g, 2*int(lay.Unit))
			if err := errors.Join(g.Sync(), g.Close()); err != nil {
				t.Fatalf("step %d: other mount: %v", step, err)
			}
			if f, err = os.OpenFile(p, os.O_RDWR, 0); err != nil {
				t.Fatal(err)
			}
			write(f, 0)
			write(f, (20+step/8)*page)
		}
		if err := f.Sync(); err != nil {
			t.Fatalf("step %d: fsync: %v", step, err)
		}
		checkParity(t, c, p)
	}
	kept, deltas, held := st.DeltaOldKept.Load(), st.DeltaWrites.Load(), st.NextGrantsUsed.Load()
	if deltas < 30 || kept < 20 || held < 20 {
		t.Fatalf("%d delta writes, %d ranges' old bytes kept by the mount, %d written with a grant held, in 40 fsyncs of the same pages", deltas, kept, held)
	}
	// Each patch fits a part of the connection's slab: one round trip each.
	var slab, staged float64
	for _, cs := range c.Chunk {
		ops := cs.Metrics().Ops
		slab += testutil.ToFloat64(ops.WithLabelValues(proto.OpPatchSlab.String(), proto.StatusOK.String()))
		staged += testutil.ToFloat64(ops.WithLabelValues(proto.OpPreparePatch.String(), proto.StatusOK.String()))
	}
	if slab < 3*float64(deltas) || staged != 0 {
		t.Fatalf("%v patches through the slab, %v staged, for %d delta writes of three shards or more", slab, staged, deltas)
	}
	fresh, _ := c.Mount(t)
	readsBack(t, "db", model, fresh, other)
	t.Logf("%d delta writes, %d ranges' old bytes kept, %d with a grant held", deltas, kept, held)
}
