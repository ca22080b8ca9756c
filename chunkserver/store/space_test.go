package store

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/chunkserver/chunk"
	"github.com/rdmafs/rdmafs/internal/fakeclock"
	"github.com/rdmafs/rdmafs/internal/testdisk"
)

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// durablyKept returns how many non-empty slots are in the free lists.
func durablyKept(s *Store) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.freeCount
}

// pendingFree returns the bytes of deleted versions' slots not yet durably
// free (not yet reusable).
func pendingFree(s *Store) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dirtyBytes
}

// slotFiles counts the non-empty slot files on disk.
func slotFiles(t *testing.T, dir string) int {
	t.Helper()
	n := 0
	for i := 0; i < fanout; i++ {
		ents, err := os.ReadDir(filepath.Join(dir, chunksDir, fmtDir(i)))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			if fi, err := e.Info(); err == nil && fi.Size() > 0 {
				n++
			}
		}
	}
	return n
}

func fmtDir(i int) string { return string("0123456789abcdef"[i>>4]) + string("0123456789abcdef"[i&15]) }

// TestSpaceKeptSlots: with a configured capacity, the kept slots of deleted
// versions count as available, are reused for new versions of their size,
// and are released, not refused, when a claim needs their room; claims stop
// at the reserve, which a Put without a claim (a repair) may use.
func TestSpaceKeptSlots(t *testing.T) {
	const length = 64 << 10
	f := FileSize(length)
	dir := t.TempDir()
	clock := fakeclock.New(time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC))
	s := open(t, dir, Options{MaxLength: length, Capacity: 40 * f, Reserve: 4 * f, KeepIdle: time.Hour, Now: clock.Now})
	d := randBytes(1, length)
	put := func(v uint64) {
		t.Helper()
		if err := s.Put(chunk.Key{Chunk: 1, Version: v}, d, Checksum(d)); err != nil {
			t.Fatalf("put %d: %v", v, err)
		}
	}
	for v := uint64(1); v <= 30; v++ {
		put(v)
	}
	sp := s.Space()
	if sp.Total != 40*f || sp.Used != 30*f || sp.Avail != 10*f || sp.Kept != 0 || sp.Reserve != 4*f || sp.Versions != 30 {
		t.Fatalf("after 30 puts: %+v", sp)
	}
	if c, free := sp.Offered(); c != 36*f || free != 6*f {
		t.Fatalf("offered capacity %d free %d, want %d %d", c, free, 36*f, 6*f)
	}

	// Deleted versions: kept, and counted as available at once.
	for v := uint64(1); v <= 5; v++ {
		if err := s.Delete(chunk.Key{Chunk: 1, Version: v}); err != nil {
			t.Fatal(err)
		}
	}
	if sp := s.Space(); sp.Used != 25*f || sp.Kept != 5*f || sp.Avail != 15*f {
		t.Fatalf("after 5 deletes: %+v", sp)
	}
	waitFor(t, "deleted slots to become reusable", 10*time.Second, func() bool { return durablyKept(s) == 5 })
	files := slotFiles(t, dir)

	// A new version of the same size reuses a kept slot: no new file.
	put(31)
	if sp := s.Space(); sp.Used != 26*f || sp.Kept != 4*f || sp.Avail != 14*f {
		t.Fatalf("after a reuse: %+v", sp)
	}
	if got := slotFiles(t, dir); got != files {
		t.Fatalf("%d slot files after a reuse, %d before", got, files)
	}

	// Claims: 14F available, 4F reserved: ten claims fit, the eleventh does
	// not. Kept slots are released as the claims eat into the room they hold.
	for i := uint64(0); i < 10; i++ {
		if err := s.Claim(chunk.Key{Chunk: 2, Version: i}, length); err != nil {
			t.Fatalf("claim %d: %v (%+v)", i, err, s.Space())
		}
	}
	err := s.Claim(chunk.Key{Chunk: 2, Version: 10}, length)
	if !errors.Is(err, ErrNoSpace) || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("claim under the reserve = %v, want ENOSPC", err)
	}
	if sp := s.Space(); sp.Kept != 0 || sp.Avail != 4*f {
		t.Fatalf("after the claims: %+v, want no kept slots and the reserve available", sp)
	}
	if got := slotFiles(t, dir); got != 26 {
		t.Fatalf("%d slot files with 26 versions and no kept slot", got)
	}
	if err := s.Claim(chunk.Key{Chunk: 2, Version: 0}, length); !errors.Is(err, ErrBusy) {
		t.Fatalf("claiming a claimed key = %v, want ErrBusy", err)
	}
	// Unclaim gives the room back.
	s.Unclaim(chunk.Key{Chunk: 2, Version: 9})
	if sp := s.Space(); sp.Avail != 5*f {
		t.Fatalf("after an unclaim: %+v", sp)
	}
	// Claimed Puts take their claims over.
	for i := uint64(0); i < 9; i++ {
		if err := s.Put(chunk.Key{Chunk: 2, Version: i}, d, Checksum(d)); err != nil {
			t.Fatalf("claimed put %d: %v", i, err)
		}
	}
	if sp := s.Space(); sp.Used != 35*f || sp.Avail != 5*f {
		t.Fatalf("after the claimed puts: %+v", sp)
	}
	// A repair (no claim) may use the reserve, up to the capacity.
	for v := uint64(100); v < 105; v++ {
		put(v)
	}
	err = s.Put(chunk.Key{Chunk: 1, Version: 105}, d, Checksum(d))
	if !errors.Is(err, ErrNoSpace) {
		t.Fatalf("put over the capacity = %v", err)
	}
	if sp := s.Space(); sp.Used != 40*f || sp.Avail != 0 {
		t.Fatalf("full: %+v", sp)
	}
	if c, free := s.Space().Offered(); c != 36*f || free != 0 {
		t.Fatalf("full: offered %d free %d", c, free)
	}
}

// TestKeptSlotsAge: kept slots no write takes are released after KeepIdle.
func TestKeptSlotsAge(t *testing.T) {
	const length = 8192
	dir := t.TempDir()
	clock := fakeclock.New(time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC))
	s := open(t, dir, Options{MaxLength: length, KeepIdle: time.Minute, Now: clock.Now})
	d := randBytes(2, length)
	for v := uint64(1); v <= 6; v++ {
		if err := s.Put(chunk.Key{Chunk: 1, Version: v}, d, Checksum(d)); err != nil {
			t.Fatal(err)
		}
	}
	for v := uint64(1); v <= 4; v++ {
		if err := s.Delete(chunk.Key{Chunk: 1, Version: v}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "deleted slots to become reusable", 10*time.Second, func() bool { return durablyKept(s) == 4 })
	if got := slotFiles(t, dir); got != 6 {
		t.Fatalf("%d slot files, want 6 (2 versions, 4 kept)", got)
	}
	clock.Advance(30 * time.Second)
	s.trim() // what maintain does on each tick
	if k := s.Space().Kept; k != 4*FileSize(length) {
		t.Fatalf("kept %d bytes before KeepIdle, want %d", k, 4*FileSize(length))
	}
	clock.Advance(31 * time.Second)
	s.trim()
	if k := s.Space().Kept; k != 0 {
		t.Fatalf("kept %d bytes after KeepIdle", k)
	}
	if got := slotFiles(t, dir); got != 2 {
		t.Fatalf("%d slot files after KeepIdle, want 2", got)
	}
	// The maintenance goroutine does it by itself.
	for v := uint64(5); v <= 6; v++ {
		if err := s.Delete(chunk.Key{Chunk: 1, Version: v}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "deleted slots to become reusable", 10*time.Second, func() bool { return durablyKept(s) == 2 })
	clock.Advance(2 * time.Minute)
	waitFor(t, "maintain to release idle kept slots", 10*time.Second, func() bool { return slotFiles(t, dir) == 0 })
}

// TestDeleteUnderPressure: when the room left is under the reserve plus one
// version of the largest length, deletes give the space back at once instead
// of keeping slots.
func TestDeleteUnderPressure(t *testing.T) {
	const length = 64 << 10
	f := FileSize(length)
	dir := t.TempDir()
	s := open(t, dir, Options{MaxLength: length, Capacity: 20 * f, Reserve: 3 * f, KeepIdle: time.Hour})
	d := randBytes(3, length)
	for v := uint64(1); v <= 20; v++ {
		if err := s.Put(chunk.Key{Chunk: 1, Version: v}, d, Checksum(d)); err != nil {
			t.Fatalf("put %d: %v", v, err)
		}
	}
	// The first deletes leave less than reserve + one version of room:
	// unlinked. Once there is that room, slots are kept.
	for v := uint64(1); v <= 8; v++ {
		if err := s.Delete(chunk.Key{Chunk: 1, Version: v}); err != nil {
			t.Fatal(err)
		}
	}
	sp := s.Space()
	if sp.Used != 12*f || sp.Kept != 4*f || sp.Avail != 8*f {
		t.Fatalf("after deletes under pressure: %+v, want 4 kept slots (room for reserve + one version)", sp)
	}
	if got := slotFiles(t, dir); got != 16 {
		t.Fatalf("%d slot files, want 16", got)
	}
}

// TestStatfsNoAlloc: the space checks on the write path do not allocate.
func TestStatfsNoAlloc(t *testing.T) {
	s := open(t, t.TempDir(), Options{})
	if n := testing.AllocsPerRun(100, func() {
		if _, _, err := s.statfs(); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Fatalf("statfs allocates %v times", n)
	}
}

func TestDefaultReserve(t *testing.T) {
	for _, tc := range []struct{ total, want int64 }{
		{0, 0},
		{64 << 20, 32 << 20},        // half of a small disk
		{300 << 20, 64 << 20},       // the floor
		{100 << 30, 2 << 30},        // 2%
		{10 << 40, 4 << 30},         // the ceiling
		{1 << 30, 64 << 20},         // 2% is under the floor
		{(64 << 20) * 2, 64 << 20},  // floor and half meet
		{(64 << 20) * 50, 64 << 20}, // 2% is the floor
	} {
		if got := DefaultReserve(tc.total); got != tc.want {
			t.Errorf("DefaultReserve(%d) = %d, want %d", tc.total, got, tc.want)
		}
	}
}

// TestSpaceOnRealDisk: on a small tmpfs, claims stop at the reserve, deleted
// versions' space goes back to the file system (df) as soon as it is short of
// the reserve, and what is kept is released for claims of another size
// rather than refusing them.
func TestSpaceOnRealDisk(t *testing.T) {
	const length = 1 << 20
	dir := testdisk.Tmpfs(t, "16m")
	s := open(t, dir, Options{MaxLength: length, Reserve: 2 << 20, KeepIdle: time.Hour})
	if sp := s.Space(); sp.Total != 16<<20 || sp.Avail > 16<<20 || sp.Avail < 15<<20 {
		t.Fatalf("fresh store on a 16 MiB tmpfs: %+v", sp)
	}
	fill := func(chunkID uint64, n int) int {
		t.Helper()
		d := randBytes(chunkID, n)
		for v := uint64(1); ; v++ {
			k := chunk.Key{Chunk: chunkID, Version: v}
			if err := s.Claim(k, n); err != nil {
				if !errors.Is(err, ErrNoSpace) || !errors.Is(err, syscall.ENOSPC) {
					t.Fatalf("claim %v: %v, want ENOSPC", k, err)
				}
				return int(v - 1)
			}
			if err := s.Put(k, d, Checksum(d)); err != nil {
				t.Fatalf("put %v after its claim: %v", k, err)
			}
		}
	}
	n := fill(1, length)
	if n < 10 {
		t.Fatalf("only %d MiB versions fit on a 16 MiB tmpfs with a 2 MiB reserve", n)
	}
	if free := testdisk.Free(t, dir); free < 2<<20 {
		t.Fatalf("the reserve is not free: %d bytes free", free)
	}
	for v := 1; v <= n; v++ {
		if err := s.Delete(chunk.Key{Chunk: 1, Version: uint64(v)}); err != nil {
			t.Fatal(err)
		}
	}
	// The file system was full: the deletes gave it room for the reserve
	// plus a version at once; the rest may be kept.
	if free := testdisk.Free(t, dir); free < 2<<20+FileSize(length) {
		t.Fatalf("after deleting everything only %d bytes free", free)
	}
	kept := s.Space().Kept
	// Versions of another size cannot reuse those slots: claims release them.
	m := fill(2, length/2)
	if m < 2*n-2 {
		t.Fatalf("%d half-size versions fit after deleting %d full ones (%d bytes were kept)", m, n, kept)
	}
	if sp := s.Space(); sp.Kept != 0 {
		t.Fatalf("kept slots left on a full disk: %+v", sp)
	}
	t.Logf("%d MiB versions fit, %d bytes kept after deleting them, then %d half-size versions fit", n, kept, m)
}
