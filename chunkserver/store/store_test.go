package store

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmafs/rdmafs/chunkserver/chunk"
	"github.com/rdmafs/rdmafs/internal/testdisk"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func open(t *testing.T, dir string, opts Options) *Store {
	t.Helper()
	opts.Logger = quiet()
	s, err := Open(dir, opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func randBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, 1))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func TestPutReadListDelete(t *testing.T) {
	s := open(t, t.TempDir(), Options{})
	k1 := chunk.Key{Chunk: 7, Version: 1}
	k2 := chunk.Key{Chunk: 7, Version: 2}
	d1, d2 := randBytes(1, 4096), randBytes(2, 1<<20)
	for _, c := range []struct {
		k chunk.Key
		d []byte
	}{{k1, d1}, {k2, d2}} {
		if err := s.Put(c.k, c.d, Checksum(c.d)); err != nil {
			t.Fatalf("Put %v: %v", c.k, err)
		}
	}
	buf := make([]byte, 1<<20)
	info, err := s.ReadInto(k1, buf)
	if err != nil || !bytes.Equal(buf[:info.Length], d1) {
		t.Fatalf("ReadInto k1: %v %+v", err, info)
	}
	if l := s.List(7); len(l) != 2 || l[0].Version != 1 || l[1].Version != 2 || l[1].Length != 1<<20 {
		t.Fatalf("List = %+v", l)
	}
	if used, n := s.Usage(); n != 2 || used != FileSize(4096)+FileSize(1<<20) {
		t.Fatalf("Usage = %d, %d", used, n)
	}
	if err := s.Delete(k1); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ReadInto(k1, buf); !errors.Is(err, ErrNotFound) {
		t.Fatalf("read deleted: %v", err)
	}
	var ve *VersionError
	if _, err := s.Stat(k1); !errors.As(err, &ve) {
		t.Fatalf("Stat of missing version of existing chunk: %v, want VersionError", err)
	}
	if _, err := s.Stat(chunk.Key{Chunk: 99, Version: 1}); !errors.Is(err, ErrNotFound) || errors.As(err, &ve) {
		t.Fatalf("Stat of unknown chunk: %v", err)
	}
	if err := s.Delete(k1); !errors.Is(err, ErrNotFound) {
		t.Fatalf("double delete: %v", err)
	}
}

func TestPutErrors(t *testing.T) {
	s := open(t, t.TempDir(), Options{MaxLength: 8192, Capacity: 3 * FileSize(8192)})
	k := chunk.Key{Chunk: 1, Version: 1}
	d := randBytes(3, 8192)
	if err := s.Put(k, d, Checksum(d)); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		key  chunk.Key
		n    int
		want error
	}{
		{"exists", k, 100, ErrExists},
		{"too long", chunk.Key{Chunk: 1, Version: 2}, 8193, ErrTooLong},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := make([]byte, tc.n)
			if err := s.Put(tc.key, b, Checksum(b)); !errors.Is(err, tc.want) {
				t.Fatalf("Put = %v, want %v", err, tc.want)
			}
		})
	}
	for v := uint64(2); v <= 3; v++ {
		if err := s.Put(chunk.Key{Chunk: 1, Version: v}, d, Checksum(d)); err != nil {
			t.Fatal(err)
		}
	}
	err := s.Put(chunk.Key{Chunk: 1, Version: 4}, d, Checksum(d))
	if !errors.Is(err, ErrNoSpace) || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Put over capacity = %v, want ENOSPC", err)
	}
	// Nothing of the failed put remains and the committed versions are intact.
	if _, n := s.Usage(); n != 3 {
		t.Fatalf("versions = %d", n)
	}
	buf := make([]byte, 8192)
	if _, err := s.ReadInto(k, buf); err != nil || !bytes.Equal(buf, d) {
		t.Fatalf("committed version damaged: %v", err)
	}
}

func TestRecovery(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, Options{})
	id := s.ID()
	keep := map[chunk.Key][]byte{}
	for i := uint64(0); i < 20; i++ {
		k := chunk.Key{Chunk: i * 37, Version: i%3 + 1}
		d := randBytes(i, int(i*1000+1))
		if err := s.Put(k, d, Checksum(d)); err != nil {
			t.Fatal(err)
		}
		keep[k] = d
	}
	// Flip a data byte of one good version: the header is fine, so it is listed,
	// but loading it must fail the checksum.
	var bad chunk.Key
	for k := range keep {
		if len(keep[k]) > 100 {
			bad = k
			break
		}
	}
	badPath, _ := s.pathOf(bad)
	s.Close()
	f, _ := os.OpenFile(badPath, os.O_RDWR, 0)
	f.WriteAt([]byte{^keep[bad][50]}, DataOffset+50)
	f.Close()

	// A crash left: a temporary file of an older chunkd, a complete slot whose
	// completion mark (the mode) was lost (kept), a short one and one with a bad
	// checksum (both become free slots), a damaged slot marked complete (moved
	// to corrupt/) and an older copy of a kept version (dropped).
	// These leftovers go into slots the store has never used: it picks slot
	// numbers itself (spares are made in batches in a directory that depends on
	// scheduling), so fixed numbers could overwrite acknowledged versions.
	sub := filepath.Join(dir, chunksDir, "05")
	base := unusedRow(t, dir)
	slotAt := func(i uint64) uint64 { return (base+i)*fanout + 0x05 }
	lostSlot, shortSlot, badcrcSlot, tornSlot, olderSlot := slotAt(0), slotAt(1), slotAt(2), slotAt(3), slotAt(4)
	tmpName := tmpPrefix + "0000000000000005.0000000000000009.abc"
	createRaw(t, filepath.Join(sub, tmpName), []byte("half"), 0o644)
	lost := chunk.Key{Chunk: 5, Version: 20}
	lostData := randBytes(20, 5000)
	writeRaw(t, dir, lostSlot, lost, 9000, lostData, pendingMode, len(lostData))
	keep[lost] = lostData
	short := chunk.Key{Chunk: 5, Version: 21}
	writeRaw(t, dir, shortSlot, short, 9001, randBytes(21, 5000), pendingMode, 3000)
	badcrc := chunk.Key{Chunk: 5, Version: 22}
	writeRaw(t, dir, badcrcSlot, badcrc, 9002, randBytes(22, 5000), pendingMode, -1)
	torn := filepath.Join(sub, fileName(tornSlot))
	createRaw(t, torn, []byte("RDCK garbage"), 0o644)
	// A delete cut short by a power cut: the cleared header reached the disk,
	// the 0600 mark did not. The slot is free, not damaged.
	cleared := filepath.Join(sub, fileName(slotAt(5)))
	createRaw(t, cleared, make([]byte, FileSize(5000)), doneMode)
	writeRaw(t, dir, olderSlot, lost, 1, randBytes(99, 5000), doneMode, 5000) // older copy

	s2 := open(t, dir, Options{})
	for _, k := range []chunk.Key{short, badcrc} {
		if _, err := s2.Stat(k); err == nil {
			t.Fatalf("half-written %v was kept", k)
		}
	}
	if p, _ := s2.pathOf(lost); p != filepath.Join(sub, fileName(lostSlot)) {
		t.Fatalf("the older copy of %v won: %s", lost, p)
	}
	if fi, err := os.Stat(filepath.Join(sub, fileName(lostSlot))); err != nil || fi.Mode().Perm() != doneMode {
		t.Fatalf("kept version not marked complete: %v %v", fi.Mode(), err)
	}
	if _, err := os.Stat(torn); err == nil {
		t.Fatal("damaged slot not moved aside")
	}
	if fi, err := os.Stat(cleared); err != nil || fi.Mode().Perm() != pendingMode {
		t.Fatalf("slot with a cleared header not kept as a free slot: %v %v", fi, err)
	}
	if _, err := os.Stat(filepath.Join(dir, corruptDir, fileName(slotAt(5)))); err == nil {
		t.Fatal("slot with a cleared header moved aside as damaged")
	}
	if _, err := os.Stat(filepath.Join(sub, tmpName)); err == nil {
		t.Fatal("temporary file not removed")
	}
	if s2.ID() != id {
		t.Fatalf("id changed: %s -> %s", id, s2.ID())
	}
	if _, n := s2.Usage(); n != len(keep) {
		t.Fatalf("recovered %d versions, want %d", n, len(keep))
	}
	buf := make([]byte, 1<<20)
	for k, d := range keep {
		info, err := s2.ReadInto(k, buf)
		if k == bad {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("corrupt data read without error: %v", err)
			}
			continue
		}
		if err != nil || !bytes.Equal(buf[:info.Length], d) {
			t.Fatalf("version %v: %v", k, err)
		}
	}
	// The freed slots are reused.
	k := chunk.Key{Chunk: 5, Version: 30}
	d := randBytes(30, 5000)
	if err := s2.Put(k, d, Checksum(d)); err != nil {
		t.Fatal(err)
	}
	if info, err := s2.ReadInto(k, buf); err != nil || !bytes.Equal(buf[:info.Length], d) {
		t.Fatalf("version in a reused slot: %v", err)
	}
}

// TestConcurrentPutsDistinctSlots: Puts racing with each other and with the
// maintainer's spare slots (taken from the spares or made by newSlot) never
// share a slot, and every acknowledged version survives a reopen.
func TestConcurrentPutsDistinctSlots(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, Options{})
	const workers, each = 8, 16
	errs := make(chan error, workers)
	for w := uint64(0); w < workers; w++ {
		go func() {
			for v := uint64(1); v <= each; v++ {
				d := randBytes(w*each+v, int(v*100))
				if err := s.Put(chunk.Key{Chunk: 100 + w, Version: v}, d, Checksum(d)); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range workers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	paths := map[string]chunk.Key{}
	for w := uint64(0); w < workers; w++ {
		for v := uint64(1); v <= each; v++ {
			k := chunk.Key{Chunk: 100 + w, Version: v}
			p, ok := s.pathOf(k)
			if !ok {
				t.Fatalf("%v not stored", k)
			}
			if o, dup := paths[p]; dup {
				t.Fatalf("%v and %v share slot %s", o, k, p)
			}
			paths[p] = k
		}
	}
	s.Close()
	s2 := open(t, dir, Options{})
	if _, n := s2.Usage(); n != workers*each {
		t.Fatalf("recovered %d versions, want %d", n, workers*each)
	}
	buf := make([]byte, each*100)
	for w := uint64(0); w < workers; w++ {
		for v := uint64(1); v <= each; v++ {
			k := chunk.Key{Chunk: 100 + w, Version: v}
			info, err := s2.ReadInto(k, buf)
			if err != nil || !bytes.Equal(buf[:info.Length], randBytes(w*each+v, int(v*100))) {
				t.Fatalf("version %v: %v", k, err)
			}
		}
	}
}

// TestSlotReuse: deleted versions' slots are reused (in place when the size
// matches) and a reused slot never shows its old version after a reopen.
func TestSlotReuse(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, Options{})
	for v := uint64(1); v <= 50; v++ {
		d := randBytes(v, 8192)
		k := chunk.Key{Chunk: 3, Version: v}
		if err := s.Put(k, d, Checksum(d)); err != nil {
			t.Fatal(err)
		}
		if v > 2 {
			if err := s.Delete(chunk.Key{Chunk: 3, Version: v - 2}); err != nil {
				t.Fatal(err)
			}
		}
		if v%10 == 0 {
			// The freed slots become reusable once maintain has made them
			// durably free.
			waitFor(t, "deleted slots to be durably free", 10*time.Second, func() bool { return pendingFree(s) == 0 })
		}
	}
	s.Close()
	ents := 0
	for i := 0; i < fanout; i++ {
		e, _ := os.ReadDir(filepath.Join(dir, chunksDir, fmt.Sprintf("%02x", i)))
		ents += len(e)
	}
	if ents > 2+spareSlots+20 {
		t.Fatalf("%d slot files for 2 versions: slots are not reused", ents)
	}
	s2 := open(t, dir, Options{})
	if l := s2.List(3); len(l) != 2 || l[0].Version != 49 || l[1].Version != 50 {
		t.Fatalf("after reopen: %+v", l)
	}
}

// writeRaw writes slot file n by hand: cut >= 0 truncates it to cut data bytes,
// cut < 0 damages the data's checksum. The slot must not exist yet.
func writeRaw(t *testing.T, dir string, n uint64, k chunk.Key, seq uint64, data []byte, mode os.FileMode, cut int) {
	t.Helper()
	hdr := make([]byte, HeaderLen)
	crc := Checksum(data)
	if cut < 0 {
		crc ^= 1
		cut = len(data)
	}
	encodeHeader(hdr, chunk.Info{Key: k, Length: uint32(len(data)), CRC: crc}, seq)
	file := make([]byte, FileSize(len(data)))
	copy(file, hdr)
	copy(file[DataOffset:], data[:cut])
	if cut < len(data) {
		file = file[:DataOffset+cut]
	}
	createRaw(t, filepath.Join(dir, chunksDir, fmt.Sprintf("%02x", n%fanout), fileName(n)), file, mode)
}

// createRaw creates a file that must not exist yet (so that a test never
// overwrites a slot of the store), with exactly mode.
func createRaw(t *testing.T, path string, b []byte, mode os.FileMode) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		t.Fatalf("create %s: %v", path, err)
	}
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(path, mode) // past the umask
	}
	if err != nil {
		t.Fatal(err)
	}
}

// unusedRow returns a slot row past every slot file in the data directory of a
// closed store, as recovery computes it: no slot of that row or later exists.
func unusedRow(t *testing.T, dir string) uint64 {
	t.Helper()
	row := uint64(1)
	for i := 0; i < fanout; i++ {
		ents, err := os.ReadDir(filepath.Join(dir, chunksDir, fmt.Sprintf("%02x", i)))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			if n, ok := parseName(e.Name()); ok {
				row = max(row, n/fanout+1)
			}
		}
	}
	return row
}

func TestLock(t *testing.T) {
	dir := t.TempDir()
	open(t, dir, Options{})
	if _, err := Open(dir, Options{Logger: quiet()}); !errors.Is(err, ErrDirLocked) {
		t.Fatalf("second Open = %v, want ErrDirLocked", err)
	}
}

// TestRealENOSPC fills a tiny tmpfs: the error must say ENOSPC and leave no file.
func TestRealENOSPC(t *testing.T) {
	dir := testdisk.Tmpfs(t, "2m")
	s, err := Open(dir, Options{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	d := randBytes(9, 1<<20)
	var got error
	for v := uint64(1); v < 10 && got == nil; v++ {
		got = s.Put(chunk.Key{Chunk: 1, Version: v}, d, Checksum(d))
	}
	if !errors.Is(got, ErrNoSpace) || !errors.Is(got, syscall.ENOSPC) {
		t.Fatalf("filling the disk: %v, want ENOSPC", got)
	}
	ents, _ := os.ReadDir(filepath.Join(dir, chunksDir, "01"))
	for _, e := range ents {
		if e.Name()[0] == '.' {
			t.Fatalf("temporary file left: %s", e.Name())
		}
	}
	buf := make([]byte, 1<<20)
	if _, err := s.ReadInto(chunk.Key{Chunk: 1, Version: 1}, buf); err != nil || !bytes.Equal(buf, d) {
		t.Fatalf("committed version after ENOSPC: %v", err)
	}
}

// TestDirectAndBufferedWrites: data in block-aligned memory (as in the registered
// pool) goes with direct I/O, other data through the page cache; both read back
// exactly, with the padding zeroed, and survive a reopen.
func TestDirectAndBufferedWrites(t *testing.T) {
	mem, err := unix.Mmap(-1, 0, 4<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	for _, noDirect := range []bool{false, true} {
		t.Run(fmt.Sprintf("nodirect=%v", noDirect), func(t *testing.T) {
			dir := t.TempDir()
			s := open(t, dir, Options{NoDirectIO: noDirect})
			for i, n := range []int{1, 4095, 4096, 4097, 1<<20 + 3} {
				key := chunk.Key{Chunk: 77, Version: uint64(i + 1)}
				want := randBytes(uint64(n), n)
				buf := mem[: n : 4<<20] // aligned, room for padding
				copy(buf, want)
				for j := n; j < roundUp(n); j++ {
					mem[j] = 0xAA // garbage past the end must not reach the disk
				}
				if err := s.Put(key, buf, Checksum(want)); err != nil {
					t.Fatalf("Put %d bytes: %v", n, err)
				}
				path, _ := s.pathOf(key)
				fi, err := os.Stat(path)
				if err != nil || fi.Size() != FileSize(n) {
					t.Fatalf("file of %d bytes: %v %v", n, fi.Size(), err)
				}
				raw, _ := os.ReadFile(path)
				for _, b := range raw[DataOffset+n:] {
					if b != 0 {
						t.Fatalf("padding of a %d-byte version not zero", n)
					}
				}
			}
			t.Logf("direct I/O in use: %v", s.direct.Load())
			s.Close()
			s2 := open(t, dir, Options{})
			got := make([]byte, 2<<20)
			for i, n := range []int{1, 4095, 4096, 4097, 1<<20 + 3} {
				info, err := s2.ReadInto(chunk.Key{Chunk: 77, Version: uint64(i + 1)}, got)
				if err != nil || !bytes.Equal(got[:info.Length], randBytes(uint64(n), n)) {
					t.Fatalf("read back %d bytes: %v", n, err)
				}
			}
		})
	}
}
