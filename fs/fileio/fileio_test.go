package fileio_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rdmafs/rdmafs/fs/fstest"
)

func random(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, seed+1))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// TestReadBack writes files of many sizes through the mount and reads them back
// byte for byte, after close and after a reopen.
func TestReadBack(t *testing.T) {
	c := fstest.Start(t, fstest.Options{})
	stripe := 4 * 64 << 10
	sizes := []int{0, 1, 4095, 4096, 65536, 65537, stripe - 1, stripe, stripe + 1, 3*stripe + 12345, 5 << 20}
	for i, n := range sizes {
		data := random(n, uint64(i))
		p := filepath.Join(c.Dir, "file-"+string(rune('a'+i)))
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatalf("write %d bytes: %v", n, err)
		}
		got, err := os.ReadFile(p)
		if err != nil {
			t.Fatalf("read %d bytes: %v", n, err)
		}
		if sha256.Sum256(got) != sha256.Sum256(data) {
			t.Fatalf("file of %d bytes: read back %d bytes that differ", n, len(got))
		}
		if st, err := os.Stat(p); err != nil || st.Size() != int64(n) {
			t.Fatalf("file of %d bytes: stat %v %v", n, st, err)
		}
	}
}

// TestOverwriteAndHoles overwrites parts of stripes, writes past the end (a
// hole), truncates and extends: the file always reads as a model says.
func TestOverwriteAndHoles(t *testing.T) {
	c := fstest.Start(t, fstest.Options{})
	p := filepath.Join(c.Dir, "model")
	model := random(700_000, 1)
	if err := os.WriteFile(p, model, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	writeAt := func(b []byte, off int64) {
		t.Helper()
		if _, err := f.WriteAt(b, off); err != nil {
			t.Fatal(err)
		}
		if end := off + int64(len(b)); end > int64(len(model)) {
			model = append(model, make([]byte, end-int64(len(model)))...)
		}
		copy(model[off:], b)
	}
	check := func(what string) {
		t.Helper()
		got, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, model) {
			t.Fatalf("%s: file (%d bytes) differs from the model (%d bytes)", what, len(got), len(model))
		}
	}
	writeAt(random(10, 2), 5)            // inside stripe 0
	writeAt(random(100_000, 3), 200_000) // across a stripe boundary
	writeAt(random(3000, 4), 2_000_000)  // past the end: a hole
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	check("after overwrites and a hole")
	if err := f.Truncate(300_000); err != nil {
		t.Fatal(err)
	}
	model = model[:300_000]
	check("after truncate")
	writeAt(random(5, 5), 400_000) // extend again: the gap reads as zeros
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	check("after extending a truncated file")
}

// TestDegradedRead stops two of six chunkservers: with EC 4+2 every byte still
// reads back.
func TestDegradedRead(t *testing.T) {
	c := fstest.Start(t, fstest.Options{})
	data := random(3<<20, 7)
	p := filepath.Join(c.Dir, "degraded")
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	c.Chunk[0].Stop()
	c.Chunk[3].Stop()
	// A new open drops the kernel's cached pages: the reads reach the engine.
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got := make([]byte, len(data))
	if _, err := f.ReadAt(got, 0); err != nil {
		t.Fatalf("degraded read: %v", err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("degraded read returned different bytes")
	}
	if n := c.Engine.Stats().DegradedReads.Load(); n == 0 {
		t.Fatal("no stripe was rebuilt: the reads did not reach the chunkservers")
	}
}

// TestTwoMounts checks close-to-open consistency between two mounts: what one
// wrote and closed, the other sees at its next open, size and bytes.
func TestTwoMounts(t *testing.T) {
	c := fstest.Start(t, fstest.Options{})
	other, _ := c.Mount(t)
	a, b := filepath.Join(c.Dir, "shared"), filepath.Join(other, "shared")
	v1 := random(100_000, 11)
	if err := os.WriteFile(a, v1, 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(b); err != nil || !bytes.Equal(got, v1) {
		t.Fatalf("second mount after the first closed: %v, %d bytes", err, len(got))
	}
	// Grow and change it on the second mount; the first, which has the old size
	// and pages cached, must see the new ones at its next open.
	v2 := random(1_300_000, 12)
	if err := os.WriteFile(b, v2, 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(a); err != nil || !bytes.Equal(got, v2) {
		t.Fatalf("first mount after the second closed: %v, %d bytes (want %d)", err, len(got), len(v2))
	}
	// Shrink it on the first.
	if err := os.WriteFile(a, v1[:10], 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(b); err != nil || !bytes.Equal(got, v1[:10]) {
		t.Fatalf("second mount after a shrink: %v, %d bytes", err, len(got))
	}
}

// TestAppendAndMmap checks O_APPEND writes and writes and reads through mmap.
func TestAppendAndMmap(t *testing.T) {
	c := fstest.Start(t, fstest.Options{})
	p := filepath.Join(c.Dir, "log")
	var want []byte
	for i := 0; i < 50; i++ {
		f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		line := random(1000+i*37, uint64(i))
		if _, err := f.Write(line); err != nil {
			t.Fatal(err)
		}
		want = append(want, line...)
		f.Close()
	}
	if got, err := os.ReadFile(p); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("after 50 appends: %v, %d bytes want %d", err, len(got), len(want))
	}
	// mmap runs in a child process: a page fault on this process's own FUSE
	// mount cannot be served while a garbage collection waits for the
	// faulting thread.
	m := filepath.Join(c.Dir, "mapped")
	if err := os.WriteFile(m, make([]byte, 3<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	child := exec.Command(os.Args[0], "-test.run=^TestMmapChild$", "-test.v")
	child.Env = append(os.Environ(), "MMAP_FILE="+m)
	if out, err := child.CombinedOutput(); err != nil || !strings.Contains(string(out), "--- PASS: TestMmapChild") {
		t.Fatalf("mmap child: %v\n%s", err, out)
	}
	// What the child wrote through the mapping is in the file.
	if got, err := os.ReadFile(m); err != nil || !bytes.Equal(got, random(3<<20, 99)) {
		t.Fatalf("after writing through mmap: %v", err)
	}
}

// TestMmapChild is TestAppendAndMmap's child process: it writes a file through
// a shared mapping, msyncs, and reads it back through a new mapping.
func TestMmapChild(t *testing.T) {
	m := os.Getenv("MMAP_FILE")
	if m == "" {
		t.Skip("run by TestAppendAndMmap")
	}
	size := 3 << 20
	f, err := os.OpenFile(m, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	data := random(size, 99)
	copy(mem, data)
	if err := unix.Msync(mem, unix.MS_SYNC); err != nil {
		t.Fatal(err)
	}
	syscall.Munmap(mem)
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	f, err = os.Open(m)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ro, err := syscall.Mmap(int(f.Fd()), 0, size, syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(ro)
	if !bytes.Equal(ro, data) {
		t.Fatal("reading through mmap returned different bytes")
	}
}

// TestReadahead reads a file sequentially (O_DIRECT, so every read reaches the
// engine in order): the stripes ahead are prefetched and the reads served from
// them return the file's bytes. A rewrite committed by another mount is seen
// at the next open, never the prefetched old version; random reads are right too.
func TestReadahead(t *testing.T) {
	c := fstest.Start(t, fstest.Options{})
	other, _ := c.Mount(t)
	const stripe = 4 * 64 << 10
	data := random(20*stripe+12345, 21)
	if err := os.WriteFile(filepath.Join(other, "seq"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(c.Dir, "seq")
	// readAll reads the file sequentially and compares the first len(want) bytes.
	readAll := func(what string, want []byte) {
		t.Helper()
		f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_DIRECT, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		buf, _ := unix.Mmap(-1, 0, 64<<10, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE) // aligned for O_DIRECT
		defer unix.Munmap(buf)
		var got []byte
		for off := int64(0); off < int64(len(want)); {
			n, err := f.ReadAt(buf, off)
			got = append(got, buf[:n]...)
			off += int64(n)
			if err != nil || n == 0 {
				break
			}
		}
		if len(got) > len(want) {
			got = got[:len(want)]
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%s: read %d bytes, want %d, or they differ", what, len(got), len(want))
		}
	}
	readAll("whole file", data)
	readAll("first stripes", data[:5*stripe]) // the stripes after them are prefetched now
	st := c.Engine.Stats()
	if st.ReadaheadStripes.Load() == 0 || st.ReadaheadHits.Load() == 0 {
		t.Fatalf("sequential read: %d stripes prefetched, %d reads served from them; want both > 0",
			st.ReadaheadStripes.Load(), st.ReadaheadHits.Load())
	}
	// Rewrite the middle on the other mount while this one has stripes cached.
	v2 := append([]byte(nil), data...)
	copy(v2[5*stripe+100:], random(3*stripe, 22))
	if err := os.WriteFile(filepath.Join(other, "seq"), v2, 0o644); err != nil {
		t.Fatal(err)
	}
	readAll("after a rewrite on another mount", v2)

	// Random reads: right bytes, and no prefetching for them.
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf, _ := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	defer unix.Munmap(buf)
	before := st.ReadaheadStripes.Load()
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 100; i++ {
		off := int64(r.IntN(len(v2)/4096-1)+1) * 4096
		if _, err := f.ReadAt(buf, off); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf, v2[off:off+4096]) {
			t.Fatalf("random read at %d differs", off)
		}
	}
	if n := st.ReadaheadStripes.Load() - before; n > 2 {
		t.Fatalf("random reads prefetched %d stripes", n)
	}
}

// TestReadaheadMemoryBounded reads many files partly, leaving their prefetched
// stripes cached, and then writes a file larger than the whole buffer memory:
// readahead never holds memory a writer waits for.
func TestReadaheadMemoryBounded(t *testing.T) {
	c := fstest.Start(t, fstest.Options{MemBytes: 8 << 20})
	other, _ := c.Mount(t)
	const stripe = 4 * 64 << 10
	for i := 0; i < 8; i++ {
		name := fmt.Sprintf("f%d", i)
		if err := os.WriteFile(filepath.Join(other, name), random(12*stripe, uint64(i)), 0o644); err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(filepath.Join(c.Dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(f, make([]byte, 3*stripe)); err != nil {
			t.Fatal(err)
		}
		defer f.Close() // kept open: its prefetched stripes stay cached
	}
	big := random(24<<20, 99)
	if err := os.WriteFile(filepath.Join(c.Dir, "big"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(other, "big"))
	if err != nil || !bytes.Equal(got, big) {
		t.Fatalf("big file: %v, %d bytes back", err, len(got))
	}
}

// TestOverwriteMerge checks how overwrites of committed stripes merge: a
// sequential overwrite of a whole file reads nothing back, a partial overwrite
// reads what it keeps, and a read of a partly overwritten stripe before any
// flush returns old and new bytes merged.
func TestOverwriteMerge(t *testing.T) {
	c := fstest.Start(t, fstest.Options{})
	const stripe = 4 * 64 << 10
	p := filepath.Join(c.Dir, "merge")
	old := random(4*stripe+5000, 31)
	if err := os.WriteFile(p, old, 0o644); err != nil {
		t.Fatal(err)
	}
	st := c.Engine.Stats()
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	whole := random(len(old), 32)
	for off := 0; off < len(whole); off += 64 << 10 {
		if _, err := f.WriteAt(whole[off:min(off+64<<10, len(whole))], int64(off)); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if n := st.MergeReads.Load(); n != 0 {
		t.Fatalf("a sequential overwrite of the whole file read %d stripes back", n)
	}
	if got, err := os.ReadFile(p); err != nil || !bytes.Equal(got, whole) {
		t.Fatalf("after the overwrite: %v, %d bytes, or they differ", err, len(got))
	}

	// A partial overwrite, read back through the same descriptor before close
	// (O_DIRECT: from the engine, not the kernel's pages).
	g, err := os.OpenFile(p, os.O_RDWR|syscall.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	buf, _ := unix.Mmap(-1, 0, 2*stripe, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	defer unix.Munmap(buf)
	patch := random(4096, 33)
	copy(buf, patch)
	if _, err := g.WriteAt(buf[:4096], stripe+8192); err != nil {
		t.Fatal(err)
	}
	want := append([]byte(nil), whole...)
	copy(want[stripe+8192:], patch)
	if _, err := g.ReadAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf, want[:2*stripe]) {
		t.Fatal("read of a partly overwritten stripe before flush: bytes differ")
	}
	if err := g.Sync(); err != nil {
		t.Fatal(err)
	}
	// One 4 KiB range in place: a parity delta, nothing read to merge.
	if m, d := st.MergeReads.Load(), st.DeltaWrites.Load(); m != 0 || d != 1 {
		t.Fatalf("a 4 KiB overwrite of one stripe: %d stripes read to merge, %d delta writes, want 0 and 1", m, d)
	}
	if got, err := os.ReadFile(p); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("after the partial overwrite: %v, %d bytes, or they differ", err, len(got))
	}
	// A write that extends the last stripe rewrites it whole: the flush
	// reads the committed bytes it keeps ([0, 3000) of that stripe) first,
	// while a read before the flush sees old and new bytes merged.
	tail := random(4096, 34)
	copy(buf, tail)
	if _, err := g.WriteAt(buf[:4096], 4*stripe+3000); err != nil {
		t.Fatal(err)
	}
	want = append(want[:4*stripe+3000], tail...)
	if n, err := g.ReadAt(buf[:8192], 4*stripe); (err != nil && err != io.EOF) || !bytes.Equal(buf[:n], want[4*stripe:]) {
		t.Fatalf("read of the extended stripe before flush: %d bytes, %v, or they differ", n, err)
	}
	if err := g.Sync(); err != nil {
		t.Fatal(err)
	}
	if n := st.MergeReads.Load(); n != 1 {
		t.Fatalf("a write extending the last stripe: %d stripes read to merge, want 1", n)
	}
	if got, err := os.ReadFile(p); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("after the extending write: %v, %d bytes, or they differ", err, len(got))
	}
}

// TestSequentialWriteAheadOfFlushes writes a file in sequence faster than its
// stripes are flushed, with a dirty limit of about one stripe: the writer
// must wait for the flushes in progress, not flush the stripe it is filling
// half written (which would be written again and read back to merge once
// filled).
func TestSequentialWriteAheadOfFlushes(t *testing.T) {
	const unit = 64 << 10
	const stripeBuf = 6 * unit // k+m shards of one stripe
	c := fstest.Start(t, fstest.Options{FileDirtyLimit: stripeBuf + 1})
	p := filepath.Join(c.Dir, "seq")
	data := random(32*4*unit+12345, 41)
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	for off := 0; off < len(data); off += unit {
		if _, err := f.Write(data[off:min(off+unit, len(data))]); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if n := c.Engine.Stats().MergeReads.Load(); n != 0 {
		t.Fatalf("a sequential write read %d stripes back to merge: they were flushed half written", n)
	}
	if got, err := os.ReadFile(p); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back: %v, %d bytes, or they differ", err, len(got))
	}
}

// TestFallocate checks fallocate(2): mode 0 extends with zeros, KEEP_SIZE
// leaves the size, PUNCH_HOLE zeroes a range and nothing else, more than the
// cluster holds is ENOSPC, and modes without meaning here are EOPNOTSUPP.
func TestFallocate(t *testing.T) {
	c := fstest.Start(t, fstest.Options{})
	other, _ := c.Mount(t)
	p := filepath.Join(c.Dir, "falloc")
	data := random(300_000, 41)
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fd := int(f.Fd())
	want := append([]byte(nil), data...)
	steps := []struct {
		name      string
		mode      uint32
		off, size int64
		errno     syscall.Errno
		apply     func()
	}{
		{"extend", 0, 250_000, 200_000, 0, func() { want = append(want, make([]byte, 150_000)...) }},
		{"keep size", unix.FALLOC_FL_KEEP_SIZE, 0, 1 << 20, 0, func() {}},
		{"inside", 0, 0, 1000, 0, func() {}},
		{"punch hole", unix.FALLOC_FL_PUNCH_HOLE | unix.FALLOC_FL_KEEP_SIZE, 70_000, 100_000, 0, func() { clear(want[70_000:170_000]) }},
		{"punch past the end", unix.FALLOC_FL_PUNCH_HOLE | unix.FALLOC_FL_KEEP_SIZE, 440_000, 1 << 20, 0, func() { clear(want[440_000:]) }},
		{"no room", 0, 0, 1 << 55, syscall.ENOSPC, func() {}},
		{"zero range", unix.FALLOC_FL_ZERO_RANGE, 0, 4096, syscall.EOPNOTSUPP, func() {}},
		{"punch without keep size", unix.FALLOC_FL_PUNCH_HOLE, 0, 4096, syscall.EOPNOTSUPP, func() {}},
	}
	for _, st := range steps {
		err := unix.Fallocate(fd, st.mode, st.off, st.size)
		if got := errnoOf(err); got != st.errno {
			t.Fatalf("%s: fallocate: %v, want errno %v", st.name, err, st.errno)
		}
		st.apply()
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
		for _, dir := range []string{c.Dir, other} {
			got, err := os.ReadFile(filepath.Join(dir, "falloc"))
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("%s: read back %d bytes (%v), want %d, or they differ", st.name, len(got), err, len(want))
			}
		}
	}
}

func errnoOf(err error) syscall.Errno {
	var e syscall.Errno
	if errors.As(err, &e) {
		return e
	}
	return 0
}

// TestGapsInReusedBuffers writes sparse pieces into stripes whose buffers last
// held other data: the buffer pool hands out memory uncleared and a stripe is
// zeroed lazily, so every byte not written must still read as zero — from the
// dirty buffer before the flush (O_DIRECT reads reach the engine) and from the
// chunkservers after it.
func TestGapsInReusedBuffers(t *testing.T) {
	c := fstest.Start(t, fstest.Options{})
	const stripe = 4 * 64 << 10
	type piece struct{ off, n int }
	tests := []struct {
		name   string
		pieces []piece // written in this order
	}{
		{"one piece mid-stripe", []piece{{100_000, 5000}}},
		{"high then low", []piece{{200_000, 4096}, {8192, 4096}}},
		{"low, then the next stripe", []piece{{4096, 4096}, {stripe + 4096, 4096}}},
		{"sequential then a jump", []piece{{0, 65536}, {65536, 65536}, {3*stripe - 4096, 4096}}},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// Fill the pool's memory with non-zero bytes: buffers go back to
			// the pool once this file is flushed.
			junk := filepath.Join(c.Dir, fmt.Sprintf("junk-%d", i))
			if err := os.WriteFile(junk, bytes.Repeat([]byte{0xA5}, 8*stripe), 0o644); err != nil {
				t.Fatal(err)
			}
			p := filepath.Join(c.Dir, fmt.Sprintf("gaps-%d", i))
			f, err := os.OpenFile(p, os.O_CREATE|os.O_RDWR|syscall.O_DIRECT, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			var want []byte
			for j, pc := range tc.pieces {
				buf, _ := unix.Mmap(-1, 0, pc.n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
				copy(buf, random(pc.n, uint64(100*i+j)))
				if _, err := f.WriteAt(buf, int64(pc.off)); err != nil {
					t.Fatal(err)
				}
				if end := pc.off + pc.n; end > len(want) {
					want = append(want, make([]byte, end-len(want))...)
				}
				copy(want[pc.off:], buf)
				unix.Munmap(buf)
			}
			check := func(when string) {
				t.Helper()
				n := (len(want) + 4095) / 4096 * 4096
				got, _ := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
				defer unix.Munmap(got)
				m, err := f.ReadAt(got, 0)
				if err != nil && !errors.Is(err, io.EOF) {
					t.Fatal(err)
				}
				if m != len(want) {
					st, _ := f.Stat()
					t.Fatalf("%s: read %d bytes (%v), want %d; size %d", when, m, err, len(want), st.Size())
				}
				if k := firstDiff(got[:m], want); k >= 0 {
					t.Fatalf("%s: byte %d is %#x, want %#x", when, k, got[k], want[k])
				}
			}
			check("before the flush")
			if err := f.Sync(); err != nil {
				t.Fatal(err)
			}
			check("after fsync")
		})
	}
}

// firstDiff returns the first index where a and b differ, or -1.
func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}

// TestSizeBeforeClose stats a file whose writes are still buffered, after the
// kernel's cached attributes expired: the size is what the writes made it, not
// the committed size the metadata service still has.
func TestSizeBeforeClose(t *testing.T) {
	c := fstest.Start(t, fstest.Options{})
	p := filepath.Join(c.Dir, "growing")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(random(5000, 7), 100_000); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond) // the attribute timeout is 1 s
	for _, stat := range []func() (os.FileInfo, error){f.Stat, func() (os.FileInfo, error) { return os.Stat(p) }} {
		st, err := stat()
		if err != nil {
			t.Fatal(err)
		}
		if st.Size() != 105_000 {
			t.Fatalf("size before close %d, want 105000", st.Size())
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(p); err != nil || st.Size() != 105_000 {
		t.Fatalf("size after close: %v %v", st, err)
	}
}

// TestDropBehind writes a file in sequence through one handle: past the
// drop-behind threshold the kernel's pages of what was written are dropped
// (mincore on a mapping of the file), before it they stay, and with the
// feature off or for writes out of sequence all stay. The data reads back
// whole either way.
func TestDropBehind(t *testing.T) {
	const mib = 1 << 20
	tests := []struct {
		name       string
		dropBehind int64
		sequential bool
		dropped    bool // pages of [8 MiB, 30 MiB) leave the page cache
	}{
		{"sequential", 4 * mib, true, true},
		{"off", 0, true, false},
		{"out of sequence", 4 * mib, false, false},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := fstest.Start(t, fstest.Options{DropBehind: tc.dropBehind})
			p := filepath.Join(c.Dir, "stream")
			data := random(32*mib, uint64(40+i))
			f, err := os.Create(p)
			if err != nil {
				t.Fatal(err)
			}
			order := make([]int, 32)
			for j := range order {
				order[j] = j
			}
			if !tc.sequential { // pairs swapped: no write starts where the last ended
				for j := 0; j+1 < len(order); j += 2 {
					order[j], order[j+1] = order[j+1], order[j]
				}
			}
			for _, j := range order {
				if _, err := f.WriteAt(data[j*mib:(j+1)*mib], int64(j*mib)); err != nil {
					t.Fatal(err)
				}
			}
			resident := func(lo, hi int) float64 {
				m, err := unix.Mmap(int(f.Fd()), 0, len(data), unix.PROT_READ, unix.MAP_SHARED)
				if err != nil {
					t.Fatal(err)
				}
				defer unix.Munmap(m)
				vec := make([]byte, len(data)/4096)
				if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
					t.Fatalf("mincore: %v", e)
				}
				n := 0
				for _, v := range vec[lo/4096 : hi/4096] {
					n += int(v & 1)
				}
				return float64(n) / float64((hi-lo)/4096)
			}
			// The pages go asynchronously: wait for them a while.
			var mid float64
			for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
				mid = resident(8*mib, 30*mib)
				if !tc.dropped || mid < 0.1 || time.Now().After(deadline) {
					break
				}
			}
			if head := resident(0, 4*mib); head < 0.9 {
				t.Errorf("%.0f%% of the first 4 MiB cached, want them all", 100*head)
			}
			if tc.dropped && mid > 0.1 {
				t.Errorf("%.0f%% of [8, 30) MiB still cached, want them dropped", 100*mid)
			}
			if !tc.dropped && mid < 0.9 {
				t.Errorf("%.0f%% of [8, 30) MiB cached, want them all", 100*mid)
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(p)
			if err != nil || sha256.Sum256(got) != sha256.Sum256(data) {
				t.Fatalf("read back: %v, %d bytes, or they differ", err, len(got))
			}
		})
	}
}

// TestAppendAcrossAttrTimeout appends records with O_APPEND and never closes
// in between, while another process stats the file after the attribute cache
// expired: every append lands after the one before (the size the kernel
// appends at survives the refreshed attributes), nothing is overwritten.
func TestAppendAcrossAttrTimeout(t *testing.T) {
	c := fstest.Start(t, fstest.Options{})
	p := filepath.Join(c.Dir, "log")
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var want []byte
	for round := range 3 {
		for i := range 10 {
			rec := []byte(fmt.Sprintf("round %d record %02d %s\n", round, i, strings.Repeat("x", 70)))
			if _, err := f.Write(rec); err != nil {
				t.Fatal(err)
			}
			want = append(want, rec...)
		}
		time.Sleep(1200 * time.Millisecond) // the attribute timeout is 1 s
		if st, err := os.Stat(p); err != nil {
			t.Fatal(err)
		} else if st.Size() != int64(len(want)) {
			t.Errorf("round %d: stat says %d bytes, want %d", round, st.Size(), len(want))
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(p)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read back: %v, %d bytes, want %d, or they differ", err, len(got), len(want))
	}
}

// TestReadInPlace reads files sequentially through ReadInPlace, as the mount
// answers the kernel's reads: reads served from stripes read ahead return
// those bytes in place, equal to the file's, and they stay intact while held
// even after the reader has moved on and the stripe left the cache. Releasing
// them returns the memory: with readahead memory for 8 stripes, ten files read
// one after another all keep being read ahead (a leaked reference would use it
// up within a few).
func TestReadInPlace(t *testing.T) {
	c := fstest.Start(t, fstest.Options{MemBytes: 8 << 20})
	other, _ := c.Mount(t)
	const stripe = 4 * 64 << 10
	ctx := context.Background()
	p := make([]byte, 64<<10)
	for i := range 10 {
		name := fmt.Sprintf("f%d", i)
		data := random(12*stripe+777, uint64(100+i))
		if err := os.WriteFile(filepath.Join(other, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
		st, err := os.Stat(filepath.Join(c.Dir, name))
		if err != nil {
			t.Fatal(err)
		}
		ino := st.Sys().(*syscall.Stat_t).Ino
		var (
			held     []byte // the first in-place view, kept to the end
			heldOff  int64
			heldRel  interface{ Release() }
			inPlace  int
			off      int64
			previous interface{ Release() } // released after the next read, as replies overlap
		)
		for off < int64(len(data)) {
			b, rel, err := c.Engine.ReadInPlace(ctx, ino, p, off)
			if err != nil {
				t.Fatalf("%s: read at %d: %v", name, off, err)
			}
			if len(b) == 0 {
				t.Fatalf("%s: read at %d returned nothing before the end (%d)", name, off, len(data))
			}
			if !bytes.Equal(b, data[off:off+int64(len(b))]) {
				t.Fatalf("%s: read at %d: bytes differ from the file's", name, off)
			}
			if (unsafe.SliceData(b) != unsafe.SliceData(p)) != (rel != nil) {
				t.Fatalf("%s: read at %d: in place %v, release %v: want a release exactly for bytes in place", name, off,
					unsafe.SliceData(b) != unsafe.SliceData(p), rel)
			}
			if rel != nil {
				inPlace++
				if held == nil {
					held, heldOff, heldRel = b, off, rel
					off += int64(len(b))
					continue
				}
			}
			if previous != nil {
				previous.Release()
			}
			previous = rel
			off += int64(len(b))
		}
		if previous != nil {
			previous.Release()
		}
		if b, rel, err := c.Engine.ReadInPlace(ctx, ino, p, off); err != nil || len(b) != 0 || rel != nil {
			t.Fatalf("%s: read at the end: %d bytes, release %v, %v", name, len(b), rel, err)
		}
		if inPlace == 0 {
			t.Fatalf("%s: no read was served in place (readahead stripes %d, hits %d)", name,
				c.Engine.Stats().ReadaheadStripes.Load(), c.Engine.Stats().ReadaheadHits.Load())
		}
		if !bytes.Equal(held, data[heldOff:heldOff+int64(len(held))]) {
			t.Fatalf("%s: the bytes held from offset %d changed before they were released", name, heldOff)
		}
		heldRel.Release()
	}
}

// TestShortStripes writes files whose last stripe is short: each shard is
// stored with its own length (data shards their bytes only, parity as long as
// data shard 0), the parity matches the data zero-padded, and every file reads
// back whole with two chunkservers gone, through the readahead and decoding.
func TestShortStripes(t *testing.T) {
	c := fstest.Start(t, fstest.Options{})
	sizes := []int{70_000, 100_000, 200_000, 262_144, 300_000, 600_000}
	data := make([][]byte, len(sizes))
	for i, n := range sizes {
		data[i] = random(n, uint64(40+i))
		p := filepath.Join(c.Dir, fmt.Sprintf("short-%d", n))
		if err := os.WriteFile(p, data[i], 0o644); err != nil {
			t.Fatal(err)
		}
		checkParity(t, c, p) // and each shard's stored length
	}
	c.Chunk[0].Stop()
	c.Chunk[3].Stop()
	fresh, _ := c.Mount(t) // nothing cached
	for i, n := range sizes {
		got, err := os.ReadFile(filepath.Join(fresh, fmt.Sprintf("short-%d", n)))
		if err != nil {
			t.Fatalf("%d-byte file with two chunkservers gone: %v", n, err)
		}
		if !bytes.Equal(got, data[i]) {
			t.Fatalf("%d-byte file read back different with two chunkservers gone", n)
		}
	}
}

// TestReadDuringMergeRead reads a stripe again and again while its flush
// reads in the committed bytes around a write (without the file's lock):
// every read sees the old bytes with the new ones over them, never a
// buffer still being filled.
func TestReadDuringMergeRead(t *testing.T) {
	c := fstest.Start(t, fstest.Options{})
	const stripe = 4 * 64 << 10
	p := filepath.Join(c.Dir, "f")
	want := random(stripe+stripe/2, 41)
	if err := os.WriteFile(p, want, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(p, os.O_RDWR|syscall.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf, _ := unix.Mmap(-1, 0, 2*stripe, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	defer unix.Munmap(buf)
	for round := range 20 {
		// Extending the last stripe: it is rewritten whole, its first
		// bytes read in by the flush.
		at := int64(len(want))
		patch := random(4096, uint64(100+round))
		copy(buf, patch)
		if _, err := f.WriteAt(buf[:4096], at); err != nil {
			t.Fatal(err)
		}
		want = append(want, patch...)
		synced := make(chan error, 1)
		go func() { synced <- f.Sync() }()
		for done := false; !done; {
			select {
			case err := <-synced:
				if err != nil {
					t.Fatal(err)
				}
				done = true
			default:
			}
			n, err := f.ReadAt(buf[:2*stripe], stripe)
			if err != nil && err != io.EOF {
				t.Fatal(err)
			}
			if !bytes.Equal(buf[:n], want[stripe:]) {
				t.Fatalf("round %d: a read during the flush differs from what was written", round)
			}
		}
	}
}
