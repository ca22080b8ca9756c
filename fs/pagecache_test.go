package fs_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/rdmafs/rdmafs/fs/fstest"
	"github.com/rdmafs/rdmafs/internal/stripe"
)

// syncPage writes a page of b at off of f, and into want, and fsyncs f.
func syncPage(t *testing.T, f *os.File, want []byte, off int64, b byte) {
	t.Helper()
	page := bytes.Repeat([]byte{b}, 4096)
	if _, err := f.WriteAt(page, off); err != nil {
		t.Fatal(err)
	}
	copy(want[off:], page)
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

// forceStat asks the mount for path's attributes, past the kernel's cache
// (AT_STATX_FORCE_SYNC), as a stat after the attribute timeout would.
func forceStat(t *testing.T, path string) unix.Statx_t {
	t.Helper()
	var st unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, path, unix.AT_STATX_FORCE_SYNC, unix.STATX_BASIC_STATS, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

// TestPageCacheAfterCommits: the kernel keeps a file's pages across the
// mount's own commits (a database rereads no page after its fsync'ed
// transaction), and another mount's change reaches it at the next open.
func TestPageCacheAfterCommits(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := fstest.Start(t, fstest.Options{Chunkservers: 3, Layout: stripe.Layout{K: 2, M: 1, Unit: 64 << 10}, Metrics: reg})
	path := filepath.Join(c.Dir, "db")
	const size = 256 << 10
	want := bytes.Repeat([]byte{'a'}, size)
	if err := os.WriteFile(path, want, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got := make([]byte, size)
	if _, err := f.ReadAt(got, 0); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("first read: %v", err)
	}

	// Own commits: write, fsync, stat, read back; the pages answer.
	before := fuseRequests(t, reg, "read")
	for i := range 20 {
		syncPage(t, f, want, int64(i%4)*64<<10, byte('b'+i))
		forceStat(t, path)
		if _, err := f.ReadAt(got, 0); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("round %d: read back after fsync: %v, or other bytes", i, err)
		}
	}
	if n := fuseRequests(t, reg, "read") - before; n != 0 {
		t.Errorf("%d READ requests reached the mount after its own commits, want 0 (the kernel dropped its pages)", n)
	}

	// Another mount's change: this mount's open descriptor may go on
	// reading what it cached (close-to-open, as the engine's reads do), but
	// the size it reports is the new one, and a new open reads the new bytes.
	other, _ := c.Mount(t)
	if err := os.WriteFile(filepath.Join(other, "db"), bytes.Repeat([]byte{'z'}, 8192), 0o644); err != nil {
		t.Fatal(err)
	}
	if st := forceStat(t, path); st.Size != 8192 {
		t.Fatalf("size after the other mount's truncating write: %d, want 8192", st.Size)
	}
	if b, err := os.ReadFile(path); err != nil || !bytes.Equal(b, bytes.Repeat([]byte{'z'}, 8192)) {
		t.Fatalf("reopened after the other mount's change: %d bytes, %v", len(b), err)
	}
	before = fuseRequests(t, reg, "read")
	if n, err := f.ReadAt(got[:8192], 0); n != 8192 || !bytes.Equal(got[:8192], bytes.Repeat([]byte{'z'}, 8192)) {
		t.Fatalf("read through the old descriptor after a new open: %d bytes, %v", n, err)
	}
	if n := fuseRequests(t, reg, "read") - before; n != 0 {
		t.Errorf("%d READ requests for pages the new open read in", n)
	}
}

// lockFile sets (typ F_WRLCK or F_RDLCK) or clears (F_UNLCK) a record lock
// of the whole file, waiting for it.
func lockFile(t *testing.T, f *os.File, typ int16) {
	t.Helper()
	if err := unix.FcntlFlock(f.Fd(), unix.F_SETLKW, &unix.Flock_t{Type: typ}); err != nil {
		t.Fatalf("lock %d: %v", typ, err)
	}
}

// TestLockKeepsUnchangedCaches: a mount that takes a lock of a file other
// mounts can reach keeps what it cached of it when the file is as its
// caches show it (it wrote the file last, under the lock), and drops it
// when another mount changed the file meanwhile.
func TestLockKeepsUnchangedCaches(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := fstest.Start(t, fstest.Options{Chunkservers: 3, Layout: stripe.Layout{K: 2, M: 1, Unit: 64 << 10}, Metrics: reg})
	other, _ := c.Mount(t)
	// Made through the other mount: this one does not own it.
	const size = 256 << 10
	want := bytes.Repeat([]byte{'a'}, size)
	if err := os.WriteFile(filepath.Join(other, "db"), want, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(c.Dir, "db"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got := make([]byte, size)
	transactionOn := func(f *os.File, i int) {
		t.Helper()
		lockFile(t, f, unix.F_WRLCK)
		if _, err := f.ReadAt(got, 0); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("transaction %d: read under the lock: %v, or other bytes", i, err)
		}
		syncPage(t, f, want, int64(i%4)*64<<10, byte('b'+i))
		lockFile(t, f, unix.F_UNLCK)
	}
	transaction := func(i int) { t.Helper(); transactionOn(f, i) }
	transaction(0) // reads the file in
	before := fuseRequests(t, reg, "read")
	for i := 1; i <= 10; i++ {
		transaction(i)
	}
	if n := fuseRequests(t, reg, "read") - before; n != 0 {
		t.Errorf("%d READ requests in 10 transactions on a file only this mount changed, want 0", n)
	}

	// Another mount's transaction: the next lock here drops the caches and
	// reads its bytes.
	g, err := os.OpenFile(filepath.Join(other, "db"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	otherWrites := func(off int64, b byte) {
		t.Helper()
		lockFile(t, g, unix.F_WRLCK)
		syncPage(t, g, want, off, b)
		lockFile(t, g, unix.F_UNLCK)
	}
	otherWrites(8192, 'z')
	before = fuseRequests(t, reg, "read")
	transaction(11) // checks the other mount's bytes under the lock
	if n := fuseRequests(t, reg, "read") - before; n == 0 {
		t.Error("no READ request after another mount's transaction: the caches were kept")
	}

	// This mount's commit on top of the other mount's change, made without
	// a lock: it does not vouch for the caches, and the next lock rereads.
	otherWrites(16384, 'y')
	syncPage(t, f, want, 3*64<<10+4096, 'x')
	transaction(12)

	// An open that keeps the kernel's pages because the other mount's
	// rewrite put the mtime back: the lock after it still rereads.
	st, err := os.Stat(filepath.Join(c.Dir, "db"))
	if err != nil {
		t.Fatal(err)
	}
	reopen := func() *os.File {
		t.Helper()
		f, err := os.OpenFile(filepath.Join(c.Dir, "db"), os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	f2 := reopen() // the mtime this mount saw at its last open
	lockFile(t, f2, unix.F_RDLCK)
	if _, err := f2.ReadAt(got, 0); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read after reopening: %v, or other bytes", err)
	}
	lockFile(t, f2, unix.F_UNLCK)
	otherWrites(24576, 'w')
	if err := os.Chtimes(filepath.Join(other, "db"), st.ModTime(), st.ModTime()); err != nil {
		t.Fatal(err)
	}
	transactionOn(reopen(), 13) // the open keeps the pages; the lock may not
}

// TestCloseCommitsBeforeUnlock: a process that writes under a record lock
// and closes the file without unlocking has its writes committed before
// the close lets the lock go, so the mount that waited for the lock reads
// them.
func TestCloseCommitsBeforeUnlock(t *testing.T) {
	c := fstest.Start(t, fstest.Options{Chunkservers: 3, Layout: stripe.Layout{K: 2, M: 1, Unit: 64 << 10}})
	other, _ := c.Mount(t)
	const size = 256 << 10
	if err := os.WriteFile(filepath.Join(other, "db"), bytes.Repeat([]byte{'a'}, size), 0o644); err != nil {
		t.Fatal(err)
	}
	round := func(i int) {
		f, err := os.OpenFile(filepath.Join(c.Dir, "db"), os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		lockFile(t, f, unix.F_WRLCK)
		g, err := os.OpenFile(filepath.Join(other, "db"), os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer g.Close()
		old := make([]byte, size) // cached on the other mount
		if _, err := g.ReadAt(old, 0); err != nil {
			t.Fatal(err)
		}
		locked := make(chan error, 1)
		go func() {
			locked <- unix.FcntlFlock(g.Fd(), unix.F_SETLKW, &unix.Flock_t{Type: unix.F_WRLCK})
		}()
		page := bytes.Repeat([]byte{byte('b' + i)}, size)
		if _, err := f.WriteAt(page, 0); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil { // lets the lock go, no unlock
			t.Fatal(err)
		}
		if err := <-locked; err != nil {
			t.Fatalf("round %d: the other mount's lock: %v", i, err)
		}
		got := make([]byte, size)
		if _, err := g.ReadAt(got, 0); err != nil || !bytes.Equal(got, page) {
			t.Fatalf("round %d: the next holder read other bytes than the closed writer's (%v)", i, err)
		}
	}
	for i := range 5 {
		round(i)
	}
}
