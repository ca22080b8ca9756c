package fs_test

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/rdmafs/rdmafs/meta/metapb"
)

// commitInSize is a file I/O engine that keeps written bytes in memory as
// uncommitted writes, and commits them (for the file system: between the
// begin and end it observes, with the attributes meta would answer) inside
// the first Size call after arm: the moment a background flush-behind
// commit can end while the file system answers a stat.
type commitInSize struct {
	mu         sync.Mutex
	data       map[uint64][]byte
	dirty      map[uint64]bool
	armed      bool
	begin      func(uint64)
	end        func(uint64, *metapb.CommitStripesReply)
	committed  chan uint64 // receives the inode committed inside Size
	attrOfSize func(ino uint64, size int) *metapb.Attr
}

func (d *commitInSize) Size(ino uint64) (int64, bool) {
	d.mu.Lock()
	armed := d.armed && d.dirty[ino]
	size := len(d.data[ino])
	if armed {
		d.armed = false
	}
	d.mu.Unlock()
	if armed {
		d.begin(ino)
		d.end(ino, &metapb.CommitStripesReply{Attr: d.attrOfSize(ino, size)})
		d.mu.Lock()
		d.dirty[ino] = false
		d.mu.Unlock()
		d.committed <- ino
		return 0, false // nothing uncommitted any more
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return int64(size), d.dirty[ino]
}

func (d *commitInSize) Write(_ context.Context, ino uint64, p []byte, off int64) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	b := d.data[ino]
	if end := int(off) + len(p); end > len(b) {
		b = append(b, make([]byte, end-len(b))...)
	}
	copy(b[off:], p)
	d.data[ino], d.dirty[ino] = b, true
	return len(p), nil
}

func (d *commitInSize) Read(_ context.Context, ino uint64, p []byte, off int64) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	b := d.data[ino]
	if off >= int64(len(b)) {
		return 0, nil
	}
	return copy(p, b[off:]), nil
}

func (d *commitInSize) ObserveCommits(begin func(uint64), end func(uint64, *metapb.CommitStripesReply)) {
	d.begin, d.end = begin, end
}

func (d *commitInSize) Open(context.Context, uint64) error             { return nil }
func (d *commitInSize) Created(uint64, *metapb.Layout)                 {}
func (d *commitInSize) Flush(context.Context, uint64) error            { return nil } // flush-behind
func (d *commitInSize) Sync(context.Context, uint64) error             { return nil }
func (d *commitInSize) Truncate(context.Context, uint64, uint64) error { return nil }
func (d *commitInSize) Truncated(uint64)                               {}
func (d *commitInSize) Forget(uint64)                                  {}
func (d *commitInSize) WriteErrors(uint64) (uint64, error)             { return 0, nil }

// TestStatWhileCommitEnds stats a file the mount created under its
// directory lease (so it owns the file and answers stat from what it
// knows) at the moment its uncommitted writes are committed: the size is
// the written one, never the size from before the writes. Reading the
// file's known attributes before asking the engine would pair attributes
// from before the commit with an engine that no longer holds the writes:
// size 0, which the kernel then caches, and a read returns nothing.
func TestStatWhileCommitEnds(t *testing.T) {
	data := &commitInSize{data: map[uint64][]byte{}, dirty: map[uint64]bool{}, committed: make(chan uint64, 1)}
	dir, fsys := mountEarly(t, data, true)
	sub := filepath.Join(dir, "d")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		path := filepath.Join(sub, "f"+string(rune('a'+i)))
		want := 1 + 1000*i
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write(make([]byte, want)); err != nil {
			t.Fatal(err)
		}
		var st unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &st); err != nil || st.Size != int64(want) {
			t.Fatalf("%s: fstat before close: size %d, %v", path, st.Size, err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		data.mu.Lock()
		data.armed = true
		data.attrOfSize = func(ino uint64, size int) *metapb.Attr {
			return &metapb.Attr{Ino: ino, Mode: syscall.S_IFREG | 0o644, Nlink: 1, Size: uint64(size)}
		}
		data.mu.Unlock()
		// statx with AT_STATX_FORCE_SYNC: the kernel asks the mount.
		var stx unix.Statx_t
		if err := unix.Statx(unix.AT_FDCWD, path, unix.AT_STATX_FORCE_SYNC, unix.STATX_SIZE, &stx); err != nil {
			t.Fatal(err)
		}
		select {
		case <-data.committed:
		default:
			t.Fatalf("%s: the stat did not reach the engine's Size", path)
		}
		if stx.Size != uint64(want) {
			t.Fatalf("%s: stat while its writes were committed: size %d, want %d", path, stx.Size, want)
		}
	}
	// The stats of owned files were answered from the kept attributes.
	if kept := fsys.Stats().KeptAnswers.Load(); kept < 5 {
		t.Errorf("%d lookups and getattrs answered from kept attributes, want at least the 5 stats", kept)
	}
}
