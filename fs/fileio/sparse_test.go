package fileio_test

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/rdmafs/rdmafs/fs/fstest"
	"github.com/rdmafs/rdmafs/internal/stripe"
)

// TestSparseRandomWrites runs small random writes (kept sparse, gathered per
// stripe), reads between them, truncates, fsyncs and reopens against a
// model, with buffer memory for only a few whole stripes so that flushes
// wait for memory, on several files at once; every byte is checked from
// this mount and from a second one.
func TestSparseRandomWrites(t *testing.T) {
	c := fstest.Start(t, fstest.Options{Layout: stripe.Layout{K: 4, M: 2, Unit: 256 << 10}, MemBytes: 8 << 20})
	other, _ := c.Mount(t)
	const fileSize = 4 << 20 // four stripes of 1 MiB
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for w := range 3 {
		wg.Go(func() {
			if err := sparseWorker(c.Dir, other, fmt.Sprintf("sparse%d", w), fileSize, uint64(w)); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if c.Engine.Stats().SparseStripes.Load() == 0 {
		t.Error("no stripe was written sparse")
	}
}

func sparseWorker(dir, other, name string, fileSize int, seed uint64) error {
	r := rand.New(rand.NewPCG(seed, 99))
	p := filepath.Join(dir, name)
	model := random(fileSize, seed+100)
	if err := os.WriteFile(p, model, 0o644); err != nil {
		return err
	}
	check := func(where string, step int) error {
		got, err := os.ReadFile(filepath.Join(where, name))
		if err != nil {
			return err
		}
		if !bytes.Equal(got, model) {
			at := 0
			for at < min(len(got), len(model)) && got[at] == model[at] {
				at++
			}
			return fmt.Errorf("%s step %d: %d bytes read from %s, model %d, first difference at %d", name, step, len(got), where, len(model), at)
		}
		return nil
	}
	for round := range 3 {
		f, err := os.OpenFile(p, os.O_RDWR, 0)
		if err != nil {
			return err
		}
		for step := range 200 {
			switch op := r.IntN(20); {
			case op < 15: // a small write anywhere, sometimes past the end
				off := r.IntN(len(model) + 8192)
				b := random(1+r.IntN(6000), r.Uint64())
				if _, err := f.WriteAt(b, int64(off)); err != nil {
					return err
				}
				if end := off + len(b); end > len(model) {
					model = append(model, make([]byte, end-len(model))...)
				}
				copy(model[off:], b)
			case op < 18: // a read through the open descriptor
				off := r.IntN(len(model) + 1)
				n := r.IntN(20000)
				got := make([]byte, n)
				k, _ := f.ReadAt(got, int64(off))
				want := model[min(off, len(model)):min(off+n, len(model))]
				if !bytes.Equal(got[:k], want) {
					return fmt.Errorf("%s round %d step %d: read of %d at %d gave %d bytes that differ from the model's %d", name, round, step, n, off, k, len(want))
				}
			case op < 19: // truncate down or up
				n := r.IntN(fileSize + fileSize/4)
				if err := f.Truncate(int64(n)); err != nil {
					return err
				}
				if n < len(model) {
					model = model[:n]
				} else {
					model = append(model, make([]byte, n-len(model))...)
				}
			default:
				if err := f.Sync(); err != nil {
					return err
				}
				if err := check(other, step); err != nil {
					return err
				}
			}
		}
		if err := f.Close(); err != nil {
			return err
		}
		for _, where := range []string{dir, other} {
			if err := check(where, -1); err != nil {
				return err
			}
		}
	}
	return nil
}

// TestSparseWhenMemoryIsHeld writes sparse stripes and then whole-stripe
// writes into one file while another file's writer, idle, holds most of the
// buffer memory with dirty stripes: the writes and the fsync must wait for
// that memory to be flushed free, not fail.
func TestSparseWhenMemoryIsHeld(t *testing.T) {
	// Stripes of 1 MiB, buffers of 1.5 MiB: 4 MiB holds two of them.
	c := fstest.Start(t, fstest.Options{Layout: stripe.Layout{K: 4, M: 2, Unit: 256 << 10}, MemBytes: 4 << 20, FileDirtyLimit: 4 << 20})
	idle, err := os.Create(filepath.Join(c.Dir, "idle"))
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	// Two stripes begun at their start and left half written: two whole
	// buffers, dirty, with nobody to flush them.
	half := random(512<<10, 1)
	for _, off := range []int64{0, 1 << 20} {
		if _, err := idle.WriteAt(half, off); err != nil {
			t.Fatal(err)
		}
	}
	p := filepath.Join(c.Dir, "busy")
	model := make([]byte, 4<<20)
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	write := func(off int, b []byte) {
		t.Helper()
		if _, err := f.WriteAt(b, int64(off)); err != nil {
			t.Fatalf("write of %d bytes at %d: %v", len(b), off, err)
		}
		copy(model[off:], b)
	}
	write(len(model)-1, []byte{1}) // the size
	for i := range 4 {
		write(i<<20+4096*(i+1), random(4096, uint64(i+2))) // sparse
	}
	write(2<<20, random(1<<20, 9)) // a whole stripe: needs a buffer
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	readsBack(t, "busy", model, c.Dir)
}
