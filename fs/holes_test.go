package fs_test

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/rdmafs/rdmafs/fs/fstest"
)

// TestSparseFiles: st_blocks counts the data stored, not the size (a
// truncated 1 GiB file stores nothing; one byte written stores one
// block), and SEEK_DATA/SEEK_HOLE find the data and the holes at stripe
// granularity (stripes of 4 x 64 KiB here).
func TestSparseFiles(t *testing.T) {
	dir := fstest.Start(t, fstest.Options{}).Dir
	p := filepath.Join(dir, "sparse")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	blocks := func() int64 {
		t.Helper()
		var st unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &st); err != nil {
			t.Fatal(err)
		}
		return st.Blocks
	}
	if err := f.Truncate(1 << 30); err != nil {
		t.Fatal(err)
	}
	if b := blocks(); b != 0 {
		t.Fatalf("a truncated 1 GiB file has %d blocks, want 0", b)
	}
	const at = 10 << 20 // the start of stripe 40
	if _, err := f.WriteAt([]byte{1}, at); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if b := blocks(); b != 1 {
		t.Fatalf("one byte written: %d blocks, want 1", b)
	}
	seek := func(off int64, whence int) (int64, error) {
		return unix.Seek(int(f.Fd()), off, whence)
	}
	for _, c := range []struct {
		off    int64
		whence int
		want   int64
		err    error
	}{
		{0, unix.SEEK_DATA, at, nil},
		{0, unix.SEEK_HOLE, 0, nil},
		{at, unix.SEEK_HOLE, at + 1, nil},
		{at, unix.SEEK_DATA, at, nil},
		{at + 1, unix.SEEK_DATA, 0, syscall.ENXIO},
		{1 << 30, unix.SEEK_HOLE, 0, syscall.ENXIO},
	} {
		got, err := seek(c.off, c.whence)
		if err != c.err || (err == nil && got != c.want) {
			t.Errorf("lseek(%d, whence %d) = %d, %v; want %d, %v", c.off, c.whence, got, err, c.want, c.err)
		}
	}
	// Whole stripes written from 0: the first hole is where they end, and
	// uncommitted writes count as data (lseek commits them first).
	if _, err := f.WriteAt(make([]byte, 1<<20), 0); err != nil {
		t.Fatal(err)
	}
	if got, err := seek(0, unix.SEEK_HOLE); err != nil || got != 1<<20 {
		t.Fatalf("SEEK_HOLE after 1 MiB written at 0: %d %v", got, err)
	}
	if b := blocks(); b != (1<<20)/512+1 {
		t.Fatalf("1 MiB and a byte stored: %d blocks, want %d", b, (1<<20)/512+1)
	}
	// Truncating down gives the space back.
	if err := f.Truncate(4096); err != nil {
		t.Fatal(err)
	}
	if b := blocks(); b != 8 {
		t.Fatalf("after truncate to 4 KiB: %d blocks, want 8", b)
	}
}
