package fileio_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmafs/rdmafs/chunkserver"
	"github.com/rdmafs/rdmafs/fs/fstest"
	"github.com/rdmafs/rdmafs/internal/stripe"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// TestRelayoutOfOpenFile converts a file from 4+2 to replication (1+2, the
// same 64 KiB stripes) while this mount has it open with its stripe map
// cached and unflushed writes in buffers sized for 4+2: reads through the
// open descriptor return the same bytes from the converted stripes, and the
// writes, flushed after the conversion, are encoded in the new layout
// (buffers grown for its three full copies) and read back.
func TestRelayoutOfOpenFile(t *testing.T) {
	c := fstest.Start(t, fstest.Options{Layout: stripe.Layout{K: 4, M: 2, Unit: 16 << 10},
		ChunkConfig: func(i int, cfg *chunkserver.Config) {
			cfg.Repair = chunkserver.RepairConfig{Planner: cfg.Membership.(chunkserver.RepairPlanner), PollInterval: 20 * time.Millisecond}
		}})
	p := filepath.Join(c.Dir, "f")
	model := random(1<<20+5000, 3)
	if err := os.WriteFile(p, model, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	readAll := func(what string) {
		t.Helper()
		fd, err := unix.Open(p, unix.O_RDONLY|unix.O_DIRECT, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		buf, err := unix.Mmap(-1, 0, 2<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Munmap(buf)
		n, err := unix.Pread(fd, buf, 0)
		if err != nil || n != len(model) || !bytes.Equal(buf[:n], model) {
			t.Fatalf("%s: read %d bytes (%v), want %d equal", what, n, err, len(model))
		}
	}
	readAll("before")
	// Unflushed writes: whole stripes (buffers) and a small one.
	for _, off := range []int64{0, 3 << 16, 200_000} {
		b := random(1<<16, uint64(off))
		if off == 200_000 {
			b = b[:777]
		}
		if _, err := f.WriteAt(b, off); err != nil {
			t.Fatal(err)
		}
		copy(model[off:], b)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	mc := c.Meta.Client(t)
	ctx := context.Background()
	if _, err := mc.Relayout(ctx, &metapb.RelayoutRequest{Ino: st.Ino, Layout: &metapb.Layout{K: 1, M: 2}}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		r, err := mc.Relayout(ctx, &metapb.RelayoutRequest{Ino: st.Ino, Progress: true})
		if err != nil {
			t.Fatal(err)
		}
		if r.StripesLeft == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the conversion did not finish: %v", r)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The old layout's chunks go: reads through the cached stripe map find
	// them gone and look the stripes up again.
	for {
		st, err := mc.Status(ctx, &metapb.StatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if st.PendingDeletes == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d chunk deletes still pending", st.PendingDeletes)
		}
		time.Sleep(20 * time.Millisecond)
	}
	readAll("converted, the writes not flushed yet")
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	readAll("after")
	got, err := mc.GetStripes(ctx, &metapb.GetStripesRequest{Ino: st.Ino})
	if err != nil {
		t.Fatal(err)
	}
	for _, si := range got.Stripes {
		if l := si.Layout.Stripe(); l.K != 1 || l.M != 2 || l.Unit != 64<<10 || len(si.Shards) != 3 {
			t.Fatalf("stripe %d after the conversion and the writes: %v with %d shards", si.Stripe, l, len(si.Shards))
		}
	}
}
