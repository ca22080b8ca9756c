package posixcheck

import (
	"math/rand/v2"
	"path/filepath"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/rdmafs/rdmafs/fs/fstest"
)

// TestFtruncateSizeDuringReads is the discrepancy the checker found, made
// reliable: ftruncate on a file with uncommitted writes while reads of the
// file are being served (here another descriptor's O_DIRECT reads; in the
// checker, the kernel's asynchronous readahead) must leave fstat reporting
// the new size. A read served between the engine's truncate and the
// metadata service's SetAttr reloads the old committed size into the
// engine, which then reports it, over the service's, for as long as dirty
// stripes remain.
func TestFtruncateSizeDuringReads(t *testing.T) {
	size := int64(2 << 20)
	fd := fileUnderReads(t, "truncate-race", size, 128<<10, 3<<20)
	r := rand.New(rand.NewPCG(3, 4))
	page := make([]byte, 4096)
	for i := range 2000 {
		// A dirty stripe below any new size, and a dirty extension.
		if _, err := unix.Pwrite(fd, page, r.Int64N(256<<10)); err != nil {
			t.Fatal(err)
		}
		if _, err := unix.Pwrite(fd, page, size); err != nil {
			t.Fatal(err)
		}
		size += int64(len(page))
		n := r.Int64N(3 << 20)
		if err := unix.Ftruncate(fd, n); err != nil {
			t.Fatal(err)
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			t.Fatal(err)
		}
		if st.Size != n {
			t.Fatalf("iteration %d: ftruncate from %d to %d returned, then fstat reports %d", i, size, n, st.Size)
		}
		size = n
	}
}

// TestFtruncateStripesDuringReads is the second discrepancy the checker
// found (one-mount-mmap, seed 3, a million operations): a read served
// between the engine's truncate and the metadata service's SetAttr caches
// the stripe as it was before the truncate, longer than the new size; a
// later small write into that stripe took the stale length and its flush
// extended the file to the stripe's old end.
func TestFtruncateStripesDuringReads(t *testing.T) {
	const size = 4 * stripe
	full := make([]byte, size)
	fd := fileUnderReads(t, "truncate-stripes-race", size, 64<<10, size)
	r := rand.New(rand.NewPCG(7, 8))
	page := make([]byte, 4096)
	for i := range 1000 {
		s := r.Int64N(4)
		n := s*stripe + 16<<10 + r.Int64N(stripe-32<<10)
		if err := unix.Ftruncate(fd, n); err != nil {
			t.Fatal(err)
		}
		// A small write inside the cut stripe, below the new size.
		if _, err := unix.Pwrite(fd, page, (n-8<<10)&^4095); err != nil {
			t.Fatal(err)
		}
		if err := unix.Fsync(fd); err != nil {
			t.Fatal(err)
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			t.Fatal(err)
		}
		if st.Size != n {
			t.Fatalf("iteration %d: ftruncate to %d, a write below it and fsync, then fstat reports %d", i, n, st.Size)
		}
		// Back to whole committed stripes for the next round.
		if _, err := unix.Pwrite(fd, full[:size-n], n); err != nil {
			t.Fatal(err)
		}
		if err := unix.Fsync(fd); err != nil {
			t.Fatal(err)
		}
	}
}

// fileUnderReads starts a one-mount cluster, creates name there with size
// committed zero bytes and returns it open for reading and writing, while
// another descriptor reads it with O_DIRECT at random offsets below span,
// readLen bytes at a time, until the test ends: reads served concurrently
// with whatever the test does, as the kernel's readahead serves them.
func fileUnderReads(t *testing.T, name string, size int64, readLen int, span int64) int {
	t.Helper()
	c := fstest.Start(t, fstest.Options{})
	p := filepath.Join(c.Dir, name)
	fd, err := unix.Open(p, unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if _, err := unix.Pwrite(fd, make([]byte, size), 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fsync(fd); err != nil {
		t.Fatal(err)
	}
	rfd, err := unix.Open(p, unix.O_RDONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	var stop atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		// O_DIRECT wants an aligned buffer: an anonymous mapping.
		b, err := unix.Mmap(-1, 0, readLen, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
		if err != nil {
			t.Error(err)
			return
		}
		defer unix.Munmap(b)
		r := rand.New(rand.NewPCG(uint64(size), uint64(span)))
		for !stop.Load() {
			unix.Pread(rfd, b, r.Int64N(span)&^4095) // errors and counts do not matter here
		}
	}()
	// Cleanups run last in first: the reader stops before the files close.
	t.Cleanup(func() {
		stop.Store(true)
		<-done
		unix.Close(rfd)
	})
	return fd
}
