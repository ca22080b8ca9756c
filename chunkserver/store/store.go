// Package store keeps chunk versions durable in a data directory, copy-on-write
// (a version is never overwritten), checksummed with CRC32C and synced before a
// commit is acknowledged, so that a crash at any point leaves every acknowledged
// version intact and no half-written one visible.
//
// Layout of the data directory:
//
//	chunkd.id             the chunkserver's stable id (random, made on first open)
//	LOCK                  flock'ed while a Store has the directory open
//	chunks/XX/SSSS        slot files: SSSS is a slot number (16 hex digits), XX its
//	                      low byte; a slot holds one version or is free
//	corrupt/              files found damaged on open, kept for inspection
//
// A slot file is a header block (magic, format, chunk, version, length, CRC32C of
// the data, a write sequence number, CRC32C of the header) followed by the data,
// padded to whole 4 KiB blocks so that it can be written with direct I/O straight
// from registered memory.
//
// Slots make a durable write cheap: a version is written into a slot file whose
// name is already durable (created ahead of time, its directory fsync'ed), or, in
// place, into the file of a deleted version of the same size, so a commit costs
// the data write and one fdatasync — no file creation, rename or directory fsync
// on the way. The file mode tells recovery what it may trust: 0600 marks a free
// slot or one being written, and a slot is made 0600 durably before it is reused;
// 0400 marks a complete version (0644 did before the data directory became
// private; such slots are taken as complete and tightened to 0400). On open,
// complete slots are taken after a header check, 0600 slots only if their whole
// data matches their checksum (a write that completed but whose 0400 mark was
// lost, or a deleted version that reappears after a crash, which garbage
// collection deletes again); the rest, and every slot whose header a delete
// cleared, become free. Directories are 0700 and no file is readable by group
// or others: shards hold file data that only its owner may read on the mount.
//
// Space. The slots of deleted versions kept for reuse ("kept slots") count as
// free space: they are reused for new versions, released (unlinked) as soon as
// the file system runs short or after they have been idle for KeepIdle, and
// never make a write fail. Writes are admitted in two steps: Claim sets room
// aside for a version when its write is prepared, refusing with ErrNoSpace when
// what would be left falls under the reserve (Options.Reserve); Put then
// writes it. A Put without a claim (a repair) may use the reserve. See Space
// for the numbers chunkd reports.
package store

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rdmafs/rdmafs/chunkserver/chunk"
	"github.com/rdmafs/rdmafs/internal/private"
)

// castagnoli is the CRC32C table used for every checksum of chunk data, made once.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Checksum returns the CRC32C (Castagnoli) of data, the checksum chunkd stores and
// the chunk protocol carries.
func Checksum(data []byte) uint32 { return crc32.Checksum(data, castagnoli) }

// UpdateChecksum continues a CRC32C over more data.
func UpdateChecksum(crc uint32, data []byte) uint32 { return crc32.Update(crc, castagnoli, data) }

// Errors returned by the store; test with errors.Is.
var (
	ErrNotFound  = errors.New("store: chunk version not found")
	ErrExists    = errors.New("store: chunk version already exists")
	ErrBusy      = errors.New("store: chunk version is being written")
	ErrTooLong   = errors.New("store: length over the limit")
	ErrChecksum  = errors.New("store: checksum mismatch")
	ErrCorrupt   = errors.New("store: stored data is corrupt")
	ErrNoSpace   = fmt.Errorf("store: no space left: %w", syscall.ENOSPC)
	ErrClosed    = errors.New("store: closed")
	ErrDirLocked = errors.New("store: data directory is in use by another process")
)

// HeaderLen is the size of the encoded header at the start of a slot file.
const HeaderLen = 52

// DataOffset is where a version's data starts in its file: the header has a block
// of its own, so that the data can be written with direct I/O straight from
// page-aligned registered memory.
const DataOffset = blockSize

// blockSize is the alignment of direct I/O.
const blockSize = 4096

// FileSize returns the size of the file of a version of length bytes: the header
// block and the data padded to whole blocks.
func FileSize(length int) int64 { return DataOffset + int64(roundUp(length)) }

func roundUp(n int) int { return (n + blockSize - 1) / blockSize * blockSize }

const (
	magic      = "RDCK"
	formatV2   = 2
	idFile     = "chunkd.id"
	lockFile   = "LOCK"
	chunksDir  = "chunks"
	corruptDir = "corrupt"
	tmpPrefix  = ".tmp-"
	fanout     = 256
	// pendingMode marks a free slot or one being written, doneMode a complete
	// version.
	pendingMode = 0o600
	doneMode    = 0o400
	// spareSlots is how many empty slots are kept created ahead of time.
	spareSlots = 16
	// maxFreeSlots and maxFreeBytes bound the files of deleted versions kept for
	// reuse; more are unlinked, so that deletes give space back.
	maxFreeSlots = 256
	maxFreeBytes = 256 << 20
	// maintainEvery is the period of the maintenance goroutine, which also
	// releases kept slots that are idle or in the way.
	maintainEvery = 200 * time.Millisecond
)

// Options configure a Store.
type Options struct {
	// MaxLength is the largest version accepted, in bytes (default 16 MiB).
	MaxLength int
	// Capacity bounds the bytes stored (headers, padding and free slots kept for
	// reuse included); a Put that would exceed it fails with ErrNoSpace (kept
	// slots are released first). Zero means only the file system's own limit.
	Capacity int64
	// Reserve is the free space, in bytes, that Claim keeps back from new
	// versions: a claim is refused when the space available after it (kept
	// slots counted as available) would be under Reserve. Puts without a
	// claim (repairs) may use it. Zero means DefaultReserve of the capacity;
	// a negative value means no reserve.
	Reserve int64
	// KeepIdle is how long the slot of a deleted version is kept for reuse
	// when no write takes it (default 5s; negative: slots are not kept).
	// Under space pressure kept slots are released at once whatever their age.
	KeepIdle time.Duration
	// Now is the clock that ages kept slots (default time.Now).
	Now func() time.Time
	// Logger receives recovery notes (default slog.Default()).
	Logger *slog.Logger
	// NoDirectIO writes through the page cache even when the data is aligned
	// for direct I/O.
	NoDirectIO bool
}

// DefaultMaxLength is the default MaxLength.
const DefaultMaxLength = 16 << 20

// DefaultKeepIdle is the default Options.KeepIdle.
const DefaultKeepIdle = 5 * time.Second

// DefaultReserve returns the reserve kept when none is configured, for a
// capacity of total bytes: 2% of it, at least 64 MiB and at most 4 GiB, and
// never more than half of it (a small disk keeps half for data). 2% leaves a
// large disk room for repairs and a few seconds of writes in flight while the
// metadata service learns that it is full; the 64 MiB floor covers a full
// stripe's shards of the largest unit being written at once on a small disk.
func DefaultReserve(total int64) int64 {
	r := min(max(total/50, 64<<20), 4<<30)
	return max(min(r, total/2), 0)
}

// Store is a durable, versioned chunk store in one directory. It is safe for
// concurrent use.
type Store struct {
	dir  string
	opts Options
	log  *slog.Logger
	id   string
	lock *os.File
	dirs [fanout]*os.File // chunks/XX, kept open for fsync

	hdrPages chan []byte // block-aligned header buffers for direct I/O
	hdrMem   []byte
	zeros    []byte // padding source for buffered writes
	direct   atomic.Bool
	// noDSync is set once the kernel refused RWF_DSYNC: versions are then
	// written with pwritev and made durable with a separate fdatasync.
	noDSync atomic.Bool

	kick    chan struct{} // wakes the maintenance goroutine
	stop    chan struct{}
	maintWG sync.WaitGroup

	path    *byte // dir, NUL-terminated, for statfs without allocating
	reserve int64 // resolved Options.Reserve
	now     func() time.Time

	mu        sync.Mutex
	closed    bool
	chunks    map[chunk.ID]map[chunk.Version]chunk.Info
	slotOf    map[chunk.Key]slot
	writing   map[chunk.Key]struct{}
	free      map[int64][]keptSlot // durably free slots by file size (0: empty), oldest first
	freeBytes int64
	freeCount int     // non-empty free slots
	dirty     []freed // deleted, marked free but not yet durably
	// dirtyBytes counts the slots of dirty and those maintain is making
	// durably free: kept slots too, counted as free space.
	dirtyBytes int64
	nextRow    uint64 // slot numbers are row*fanout + directory
	nextSeq    uint64
	used       int64 // bytes of committed files plus bytes reserved by writes in progress
	count      int
	claims     map[chunk.Key]int64 // room set aside by Claim, by version
	claimed    int64               // the sum of claims
	growing    int64               // bytes writes in progress add to the file system
}

// keptSlot is a durably free slot and when it became free.
type keptSlot struct {
	n     uint64
	since time.Time
}

type slot struct {
	n   uint64
	seq uint64
}

type freed struct {
	n    uint64
	size int64
}

// Open opens (creating if needed) the store in dir and recovers it (see the
// package documentation); damaged files are moved to corrupt/.
func Open(dir string, opts Options) (*Store, error) {
	if opts.MaxLength <= 0 {
		opts.MaxLength = DefaultMaxLength
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.KeepIdle == 0 {
		opts.KeepIdle = DefaultKeepIdle
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	s := &Store{
		dir: dir, opts: opts, log: opts.Logger, now: opts.Now,
		chunks:  make(map[chunk.ID]map[chunk.Version]chunk.Info),
		slotOf:  make(map[chunk.Key]slot),
		writing: make(map[chunk.Key]struct{}),
		free:    make(map[int64][]keptSlot),
		claims:  make(map[chunk.Key]int64),
		kick:    make(chan struct{}, 1),
		stop:    make(chan struct{}),
		// Row 0 is never used, so that slot 0 can mean "no slot".
		nextRow: 1,
	}
	if err := private.MkdirAll(dir, s.log); err != nil {
		return nil, fmt.Errorf("store: data dir: %w", err)
	}
	if err := private.MkdirAll(filepath.Join(dir, chunksDir), s.log); err != nil {
		return nil, fmt.Errorf("store: data dir: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, lockFile), os.O_RDWR|os.O_CREATE, private.FileMode)
	if err != nil {
		return nil, fmt.Errorf("store: open lock file: %w", err)
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		lock.Close()
		return nil, fmt.Errorf("store: lock %s: %w", dir, ErrDirLocked)
	}
	s.lock = lock
	if s.path, err = unix.BytePtrFromString(dir); err != nil {
		s.Close()
		return nil, fmt.Errorf("store: data dir %q: %w", dir, err)
	}
	fsTotal, _, err := s.statfs()
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("store: %w", err)
	}
	switch total := s.total(fsTotal); {
	case opts.Reserve == 0:
		s.reserve = DefaultReserve(total)
	case opts.Reserve > 0:
		s.reserve = opts.Reserve
	}
	const pages = 64
	mem, err := unix.Mmap(-1, 0, pages*blockSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("store: header buffers: %w", err)
	}
	s.hdrMem = mem
	s.hdrPages = make(chan []byte, pages)
	for i := 0; i < pages; i++ {
		s.hdrPages <- mem[i*blockSize : (i+1)*blockSize : (i+1)*blockSize]
	}
	s.zeros = make([]byte, blockSize)
	s.direct.Store(!opts.NoDirectIO)
	if err := s.open(); err != nil {
		s.Close()
		return nil, err
	}
	s.maintWG.Add(1)
	go s.maintain()
	return s, nil
}

func (s *Store) open() error {
	id, err := loadOrCreateID(s.dir)
	if err != nil {
		return err
	}
	s.id = id
	// Files of older versions, or made by hand, may be open to others.
	tightened := 0
	for _, name := range []string{lockFile, idFile} {
		switch changed, err := private.Tighten(filepath.Join(s.dir, name), nil); {
		case err != nil:
			return fmt.Errorf("store: %w", err)
		case changed:
			tightened++
		}
	}
	switch n, err := private.TightenTree(filepath.Join(s.dir, corruptDir), nil); {
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("store: %w", err)
	default:
		tightened += n
	}
	root := filepath.Join(s.dir, chunksDir)
	found := map[chunk.Key]found{}
	for i := 0; i < fanout; i++ {
		sub := filepath.Join(root, fmt.Sprintf("%02x", i))
		if err := os.MkdirAll(sub, private.DirMode); err != nil {
			return fmt.Errorf("store: create %s: %w", sub, err)
		}
		switch changed, err := private.Tighten(sub, nil); {
		case err != nil:
			return fmt.Errorf("store: %w", err)
		case changed:
			tightened++
		}
		d, err := os.Open(sub)
		if err != nil {
			return fmt.Errorf("store: open %s: %w", sub, err)
		}
		s.dirs[i] = d
		n, err := s.recoverDir(sub, found)
		if err != nil {
			return err
		}
		tightened += n
	}
	for _, f := range found {
		s.add(f.info, slot{n: f.slot, seq: f.seq})
		s.nextSeq = max(s.nextSeq, f.seq+1)
	}
	if tightened > 0 {
		s.log.Warn("store: removed group and world access from files and directories of the data directory",
			"dir", s.dir, "entries", tightened)
	}
	if err := syncDir(root); err != nil {
		return err
	}
	return syncDir(s.dir)
}

type found struct {
	info chunk.Info
	slot uint64
	seq  uint64
}

// recoverDir scans one fan-out directory.
func (s *Store) recoverDir(sub string, versions map[chunk.Key]found) (tightened int, err error) {
	ents, err := os.ReadDir(sub)
	if err != nil {
		return tightened, fmt.Errorf("store: scan %s: %w", sub, err)
	}
	for _, e := range ents {
		name := e.Name()
		path := filepath.Join(sub, name)
		if strings.HasPrefix(name, tmpPrefix) {
			s.log.Info("store: removing interrupted write", "file", path)
			if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return tightened, fmt.Errorf("store: remove %s: %w", path, err)
			}
			continue
		}
		n, ok := parseName(name)
		if !ok || n%fanout != slotDir(sub) {
			s.log.Warn("store: ignoring unknown file", "file", path)
			continue
		}
		s.nextRow = max(s.nextRow, n/fanout+1)
		fi, err := e.Info()
		if err != nil {
			return tightened, fmt.Errorf("store: stat %s: %w", path, err)
		}
		if fi.Size() == 0 {
			s.addFree(n, 0)
			continue
		}
		// 0600 is pending; 0400, and 0644 from before slots were private,
		// complete.
		perm := fi.Mode().Perm()
		pending := perm&0o200 != 0 && perm&0o044 == 0
		if perm&0o077 != 0 {
			mode := os.FileMode(doneMode)
			if pending {
				mode = pendingMode
			}
			if err := os.Chmod(path, mode); err != nil {
				return tightened, fmt.Errorf("store: make %s private: %w", path, err)
			}
			tightened++
		}
		info, seq, size, err := readHeaderFile(path)
		if errors.Is(err, errFreedHeader) {
			// Cleared by a delete (markFree) whose 0600 mark was lost.
			if !pending {
				s.log.Info("store: freeing the slot of a deleted version", "file", path)
				if err := os.Chmod(path, pendingMode); err != nil {
					return tightened, fmt.Errorf("store: mark %s free: %w", path, err)
				}
			}
			s.addFree(n, fi.Size())
			continue
		}
		if err == nil && size != FileSize(int(info.Length)) {
			err = fmt.Errorf("%w: header says %d bytes of data, file is %d bytes", ErrCorrupt, info.Length, size)
		}
		if pending {
			// Free, or written but not marked complete: keep it only if it
			// is whole.
			if err == nil {
				err = verifyFile(path, info)
			}
			if err != nil {
				s.addFree(n, fi.Size())
				continue
			}
			if err := os.Chmod(path, doneMode); err != nil {
				return tightened, fmt.Errorf("store: mark %s complete: %w", path, err)
			}
			s.log.Info("store: kept a whole version from a slot not marked complete", "file", path, "chunk", info.Key)
		} else if err != nil {
			s.quarantine(path, err)
			continue
		}
		if old, ok := versions[info.Key]; ok {
			// The same version twice: a deleted copy reappeared next to a
			// newer write of it. The later write wins.
			loser := found{info: info, slot: n, seq: seq}
			if seq > old.seq {
				loser, versions[info.Key] = old, loser
			}
			s.log.Info("store: dropping an older copy of a version", "chunk", info.Key, "slot", loser.slot)
			os.Remove(s.slotPath(loser.slot))
			continue
		}
		versions[info.Key] = found{info: info, slot: n, seq: seq}
	}
	return tightened, nil
}

func slotDir(sub string) uint64 {
	v, _ := strconv.ParseUint(filepath.Base(sub), 16, 8)
	return v
}

// addFree records a durably free slot (mode 0600 on disk).
func (s *Store) addFree(n uint64, size int64) {
	if size > 0 && (s.freeCount >= maxFreeSlots || s.freeBytes+size > maxFreeBytes) {
		os.Remove(s.slotPath(n))
		return
	}
	s.free[size] = append(s.free[size], keptSlot{n: n, since: s.now()})
	s.freeBytes += size
	if size > 0 {
		s.freeCount++
	}
}

// takeFree returns a durably free slot of exactly size bytes, or an empty one.
func (s *Store) takeFree(size int64) (uint64, int64, bool) {
	for _, sz := range []int64{size, 0} {
		if l := s.free[sz]; len(l) > 0 {
			n := l[len(l)-1].n
			s.free[sz] = l[:len(l)-1]
			s.freeBytes -= sz
			if sz > 0 {
				s.freeCount--
			}
			return n, sz, true
		}
	}
	return 0, 0, false
}
func (s *Store) quarantine(path string, why error) {
	s.log.Error("store: damaged version file moved aside", "file", path, "err", why)
	cdir := filepath.Join(s.dir, corruptDir)
	if err := os.MkdirAll(cdir, private.DirMode); err == nil {
		if err := os.Rename(path, filepath.Join(cdir, filepath.Base(path))); err == nil {
			return
		}
	}
	os.Remove(path)
}

// ID returns the chunkserver's stable id, kept in the data directory.
func (s *Store) ID() string { return s.id }

// Dir returns the data directory.
func (s *Store) Dir() string { return s.dir }

// MaxLength returns the largest version length accepted.
func (s *Store) MaxLength() int { return s.opts.MaxLength }

// Usage returns the bytes used by stored versions (with headers) and how many there are.
func (s *Store) Usage() (bytes int64, versions int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.used, s.count
}

// Space is a snapshot of the store's room, in bytes.
type Space struct {
	// Total is what chunk data may fill: the configured capacity or the file
	// system's size (less the blocks only root may use), whichever is smaller.
	Total int64
	// Avail is the room for new versions: the file system's free space (or
	// what the capacity leaves, if less) plus the kept slots, less the room
	// claimed for writes not yet done. The reserve is part of it.
	Avail int64
	// Kept is the bytes of slots of deleted versions kept for reuse, which
	// Avail counts.
	Kept int64
	// Used is the bytes of stored versions, headers and padding included, and
	// of Puts in progress.
	Used int64
	// Versions is the number of stored versions.
	Versions int
	// Reserve is the part of Avail that new versions may not take.
	Reserve int64
}

// Offered returns the capacity and free space to advertise for new shards:
// Total and Avail less the reserve, never negative, free at most capacity.
func (sp Space) Offered() (capacity, free int64) {
	capacity = max(sp.Total-sp.Reserve, 0)
	return capacity, min(max(sp.Avail-sp.Reserve, 0), capacity)
}

// Space returns the store's room. When the file system cannot be queried, its
// size and free space count as zero.
func (s *Store) Space() Space {
	fsTotal, fsAvail, err := s.statfs()
	if err != nil {
		s.log.Warn("store: statfs", "dir", s.dir, "err", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return Space{Total: s.total(fsTotal), Avail: max(s.availLocked(fsAvail), 0), Kept: s.keptLocked(),
		Used: s.used, Versions: s.count, Reserve: s.reserve}
}

// statfs returns the file system's size and free space as an unprivileged
// user sees them: the blocks only root may use count as neither. It does not
// allocate.
func (s *Store) statfs() (total, avail int64, err error) {
	var st unix.Statfs_t
	if _, _, e := unix.Syscall(unix.SYS_STATFS, uintptr(unsafe.Pointer(s.path)), uintptr(unsafe.Pointer(&st)), 0); e != 0 {
		return 0, 0, fmt.Errorf("statfs %s: %w", s.dir, e)
	}
	bs := st.Frsize
	if bs <= 0 {
		bs = st.Bsize
	}
	rootOnly := st.Bfree - min(st.Bavail, st.Bfree)
	return int64(st.Blocks-min(rootOnly, st.Blocks)) * bs, int64(st.Bavail) * bs, nil
}

// total returns the store's capacity given the file system's size.
func (s *Store) total(fsTotal int64) int64 {
	if c := s.opts.Capacity; c > 0 && c < fsTotal {
		return c
	}
	return fsTotal
}

// keptLocked returns the bytes of kept slots.
func (s *Store) keptLocked() int64 { return s.freeBytes + s.dirtyBytes }

// roomLocked returns the bytes a write could add now without releasing kept
// slots, given the file system's free space (claims not deducted).
func (s *Store) roomLocked(fsAvail int64) int64 {
	room := fsAvail - s.growing
	if c := s.opts.Capacity; c > 0 {
		room = min(room, c-s.used-s.keptLocked())
	}
	return room
}

// availLocked returns the room for new versions, kept slots included.
func (s *Store) availLocked(fsAvail int64) int64 {
	return s.roomLocked(fsAvail) + s.keptLocked() - s.claimed
}

// Claim sets room aside for a version of length bytes about to be written
// (chunkd claims when a write is prepared), so that the space is known to be
// there before the client sends the data. It fails with an error wrapping
// ErrNoSpace (and syscall.ENOSPC) when the room available after the claim —
// free space plus kept slots, less other claims — would be under the reserve.
// Kept slots are released (unlinked) when the file system itself is short of
// the claim plus the reserve. A Put of key takes the claim over; Unclaim
// drops a claim whose write is abandoned. Claiming a key already claimed
// fails with ErrBusy.
func (s *Store) Claim(key chunk.Key, length int) error {
	if length > s.opts.MaxLength || length < 0 {
		return fmt.Errorf("claim %v: %d bytes: %w", key, length, ErrTooLong)
	}
	need := FileSize(length)
	_, fsAvail, err := s.statfs()
	if err != nil {
		return fmt.Errorf("claim %v: %w", key, err)
	}
	s.mu.Lock()
	switch {
	case s.closed:
		s.mu.Unlock()
		return ErrClosed
	case s.claims[key] != 0:
		s.mu.Unlock()
		return fmt.Errorf("claim %v: %w", key, ErrBusy)
	}
	if avail := s.availLocked(fsAvail); avail-need < s.reserve {
		s.mu.Unlock()
		return fmt.Errorf("claim %v: %d bytes with %d available and %d reserved: %w", key, need, max(avail, 0), s.reserve, ErrNoSpace)
	}
	victims := s.releaseLocked(need + s.reserve - (s.roomLocked(fsAvail) - s.claimed))
	s.claims[key] = need
	s.claimed += need
	s.mu.Unlock()
	s.unlink(victims)
	return nil
}

// Unclaim drops the claim of key, if any.
func (s *Store) Unclaim(key chunk.Key) {
	s.mu.Lock()
	s.dropClaimLocked(key)
	s.mu.Unlock()
}

func (s *Store) dropClaimLocked(key chunk.Key) bool {
	c, ok := s.claims[key]
	if ok {
		delete(s.claims, key)
		s.claimed -= c
	}
	return ok
}

// pressureLocked returns how many bytes the file system lacks to hold the
// reserve plus one version of the largest length beyond the claims: while it
// is positive, kept slots are released rather than held.
func (s *Store) pressureLocked(fsAvail int64) int64 {
	return s.reserve + FileSize(s.opts.MaxLength) - (s.roomLocked(fsAvail) - s.claimed)
}

// Stat returns the info of a stored version: ErrNotFound when the chunk has no
// version at all, a wrapped ErrNotFound naming the versions otherwise.
func (s *Store) Stat(key chunk.Key) (chunk.Info, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	vs := s.chunks[key.Chunk]
	if info, ok := vs[key.Version]; ok {
		return info, nil
	}
	if len(vs) == 0 {
		return chunk.Info{}, fmt.Errorf("chunk %016x: %w", key.Chunk, ErrNotFound)
	}
	return chunk.Info{}, &VersionError{Key: key}
}

// VersionError reports a chunk that exists but not in the version asked for.
type VersionError struct{ Key chunk.Key }

func (e *VersionError) Error() string {
	return fmt.Sprintf("chunk %016x has no version %d: %v", e.Key.Chunk, e.Key.Version, ErrNotFound)
}

// Unwrap makes errors.Is(err, ErrNotFound) true.
func (e *VersionError) Unwrap() error { return ErrNotFound }

// List returns the stored versions of a chunk in increasing version order.
func (s *Store) List(id chunk.ID) []chunk.Info {
	s.mu.Lock()
	out := make([]chunk.Info, 0, len(s.chunks[id]))
	for _, info := range s.chunks[id] {
		out = append(out, info)
	}
	s.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out
}

// All calls fn for every stored version, in no particular order, until fn returns
// false. fn must not call back into the store.
func (s *Store) All(fn func(chunk.Info) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, vs := range s.chunks {
		for _, info := range vs {
			if !fn(info) {
				return
			}
		}
	}
}

func (s *Store) add(info chunk.Info, sl slot) {
	vs := s.chunks[info.Chunk]
	if vs == nil {
		vs = make(map[chunk.Version]chunk.Info)
		s.chunks[info.Chunk] = vs
	}
	vs[info.Version] = info
	s.slotOf[info.Key] = sl
	s.used += FileSize(int(info.Length))
	s.count++
}

// Put stores data as version key durably: when it returns nil the version survives a
// crash or power cut. crc must be the CRC32C of data (the caller has verified it).
// When data starts on a 4 KiB boundary and its capacity reaches the next one past
// its end, it is written with direct I/O, and Put zeroes data[len(data):] up to
// that boundary. Put fails with ErrExists if the version is stored, ErrBusy if
// another Put of it is in progress, ErrTooLong over the length limit and an error
// wrapping ErrNoSpace (and syscall.ENOSPC) when the disk or the capacity is full.
// A failed Put leaves no version behind.
//
// A Put of a claimed key (see Claim) takes the claim over, whatever its
// outcome, once it gets past the checks above. A Put without a claim (a
// repair) fails with ErrNoSpace only when the room available, kept slots
// counted, is short of the version: it may use the reserve. Kept slots are
// released when the file system lacks the room; when it refuses a write
// anyway (another writer filled it), every kept slot is released.
func (s *Store) Put(key chunk.Key, data []byte, crc uint32) error {
	if len(data) > s.opts.MaxLength {
		return fmt.Errorf("put %v: %d bytes: %w", key, len(data), ErrTooLong)
	}
	need := FileSize(len(data))
	_, fsAvail, err := s.statfs()
	if err != nil {
		return fmt.Errorf("put %v: %w", key, err)
	}
	s.mu.Lock()
	switch {
	case s.closed:
		s.mu.Unlock()
		return ErrClosed
	case s.has(key):
		s.mu.Unlock()
		return fmt.Errorf("put %v: %w", key, ErrExists)
	}
	if _, ok := s.writing[key]; ok {
		s.mu.Unlock()
		return fmt.Errorf("put %v: %w", key, ErrBusy)
	}
	if !s.dropClaimLocked(key) && s.availLocked(fsAvail)-need < 0 {
		s.mu.Unlock()
		return fmt.Errorf("put %v: %d bytes with %d available: %w", key, need, max(s.availLocked(fsAvail), 0), ErrNoSpace)
	}
	n, size, reuse := s.takeFree(need)
	grow := need - size
	s.used += need
	s.growing += grow
	// Make the room physically there, other claims included, from kept slots.
	victims := s.releaseLocked(-(s.roomLocked(fsAvail) - s.claimed))
	if c := s.opts.Capacity; c > 0 && c-s.used-s.keptLocked() < 0 {
		s.used -= need
		s.growing -= grow
		if reuse {
			s.addFree(n, size)
		}
		s.mu.Unlock()
		s.unlink(victims)
		return fmt.Errorf("put %v: %w", key, ErrNoSpace)
	}
	s.writing[key] = struct{}{}
	seq := s.nextSeq
	s.nextSeq++
	low := len(s.free[0]) < spareSlots/2
	s.mu.Unlock()
	s.unlink(victims)
	if low {
		s.poke() // replenish the spare slots
	}

	if !reuse {
		n, err = s.newSlot()
	}
	info := chunk.Info{Key: key, Length: uint32(len(data)), CRC: crc}
	if err == nil {
		err = s.write(n, info, seq, data)
	}

	s.mu.Lock()
	delete(s.writing, key)
	s.used -= need
	s.growing -= grow
	if err == nil {
		s.add(info, slot{n: n, seq: seq})
	} else if reuse || n != 0 {
		// The slot is still durably free (0600): give it back with whatever
		// it holds now.
		if fi, serr := os.Stat(s.slotPath(n)); serr == nil {
			s.addFree(n, fi.Size())
		}
	}
	var spill []uint64
	if errors.Is(err, syscall.ENOSPC) {
		// Something else filled the file system: give the kept slots back
		// to it, so that what is refused here can go elsewhere.
		spill = s.releaseLocked(s.keptLocked())
	}
	s.mu.Unlock()
	s.unlink(spill)
	if err != nil {
		if errors.Is(err, syscall.ENOSPC) {
			return fmt.Errorf("put %v: %w (%v)", key, ErrNoSpace, err)
		}
		return fmt.Errorf("put %v: %w", key, err)
	}
	return nil
}

func (s *Store) has(key chunk.Key) bool {
	_, ok := s.chunks[key.Chunk][key.Version]
	return ok
}

// releaseLocked takes kept slots holding at least want bytes (all of them if
// they hold less) off the books: slots not yet durably free first, then the
// oldest of each size. The caller unlinks the returned slots (see unlink)
// once it has let go of the lock.
func (s *Store) releaseLocked(want int64) []uint64 {
	if want <= 0 {
		return nil
	}
	var out []uint64
	for want > 0 && len(s.dirty) > 0 {
		d := s.dirty[len(s.dirty)-1]
		s.dirty = s.dirty[:len(s.dirty)-1]
		s.dirtyBytes -= d.size
		want -= d.size
		out = append(out, d.n)
	}
	for size, l := range s.free {
		if want <= 0 {
			break
		}
		if size == 0 {
			continue
		}
		k := min(len(l), int((want+size-1)/size))
		out = s.dropOldestLocked(out, size, k)
		want -= size * int64(k)
	}
	return out
}

// expireLocked takes the kept slots idle since before cutoff off the books,
// appending them to out for unlink.
func (s *Store) expireLocked(out []uint64, cutoff time.Time) []uint64 {
	for size, l := range s.free {
		if size == 0 {
			continue
		}
		k := sort.Search(len(l), func(i int) bool { return !l[i].since.Before(cutoff) })
		out = s.dropOldestLocked(out, size, k)
	}
	return out
}

// dropOldestLocked removes the k oldest kept slots of size from the free
// lists, appending their numbers to out.
func (s *Store) dropOldestLocked(out []uint64, size int64, k int) []uint64 {
	if k <= 0 {
		return out
	}
	l := s.free[size]
	for _, ks := range l[:k] {
		out = append(out, ks.n)
	}
	if k == len(l) {
		delete(s.free, size)
	} else {
		s.free[size] = append(l[:0], l[k:]...)
	}
	s.freeBytes -= size * int64(k)
	s.freeCount -= k
	return out
}

// unlink removes released slots' files. Without the lock: unlinking a large
// file may take a while.
func (s *Store) unlink(slots []uint64) {
	for _, n := range slots {
		if err := os.Remove(s.slotPath(n)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			s.log.Warn("store: release a kept slot", "slot", n, "err", err)
		}
	}
}

// write writes version info into slot n, whose file exists durably with mode
// 0600: header and data (padded) from offset 0, fdatasync, then mode 0644. No
// name is created or changed, so no directory needs syncing. The 0644 mark need
// not be synced: if it is lost, recovery verifies the checksum and keeps the
// version.
func (s *Store) write(n uint64, info chunk.Info, seq uint64, data []byte) error {
	path := s.slotPath(n)
	hdr := <-s.hdrPages
	defer func() { s.hdrPages <- hdr }()
	clear(hdr)
	encodeHeader(hdr, info, seq)
	padded := roundUp(len(data))
	// Direct I/O whenever the data is block aligned with room for its padding,
	// as staging buffers in registered memory are: no copy into the page cache.
	// This holds for writes that allocate too: filling fresh page-cache pages
	// is dear on a virtual machine (docs/performance.md), and the data is
	// synced at once anyway.
	direct := s.direct.Load() && len(data) > 0 && cap(data) >= padded &&
		uintptr(unsafe.Pointer(unsafe.SliceData(data)))%blockSize == 0
	iov := [3][]byte{hdr, data}
	if direct {
		clear(data[len(data):padded])
		iov[1] = data[:padded]
	} else {
		iov[2] = s.zeros[:padded-len(data)]
	}
	flags := unix.O_WRONLY | unix.O_CLOEXEC
	if direct {
		flags |= unix.O_DIRECT
	}
	fd, err := unix.Open(path, flags, 0)
	if err == unix.EINVAL && direct { // the file system has no direct I/O
		s.noDirect(err)
		return s.write(n, info, seq, data)
	}
	if err != nil {
		return fmt.Errorf("open slot %s: %w", path, err)
	}
	defer unix.Close(fd)
	// RWF_DSYNC makes the write durable as it completes (as write plus
	// fdatasync would): one blocking system call instead of two, each of
	// which costs the Go scheduler a thread hand-off.
	dsync := !s.noDSync.Load()
	wflags := 0
	if dsync {
		wflags = unix.RWF_DSYNC
	}
	err = pwriteAll(fd, iov[:], wflags)
	if err == unix.EOPNOTSUPP && dsync {
		s.noDSync.Store(true)
		s.log.Info("store: RWF_DSYNC not supported, syncing with fdatasync", "dir", s.dir)
		dsync = false
		err = pwriteAll(fd, iov[:], 0)
	}
	if err != nil {
		if err == unix.EINVAL && direct { // alignment the device does not take
			s.noDirect(err)
			return s.write(n, info, seq, data)
		}
		return fmt.Errorf("write %s: %w", path, err)
	}
	if !dsync {
		if err := unix.Fdatasync(fd); err != nil {
			return fmt.Errorf("fdatasync %s: %w", path, err)
		}
	}
	if err := unix.Fchmod(fd, doneMode); err != nil {
		return fmt.Errorf("mark %s complete: %w", path, err)
	}
	return nil
}

func (s *Store) noDirect(err error) {
	if s.direct.Swap(false) {
		s.log.Info("store: direct I/O not available, using buffered writes", "dir", s.dir, "err", err)
	}
}

// newSlot creates an empty slot file durably: created with mode 0600, its
// directory fsync'ed.
func (s *Store) newSlot() (uint64, error) {
	s.mu.Lock()
	n := s.nextRow*fanout + s.nextRow%fanout
	s.nextRow++
	s.mu.Unlock()
	path := s.slotPath(n)
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, pendingMode)
	if err != nil {
		return 0, fmt.Errorf("create slot %s: %w", path, err)
	}
	unix.Close(fd)
	if err := s.dirs[n%fanout].Sync(); err != nil {
		os.Remove(path)
		return 0, fmt.Errorf("fsync dir of %s: %w", path, err)
	}
	return n, nil
}

// poke wakes the maintenance goroutine.
func (s *Store) poke() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// maintain keeps spare empty slots created and makes the slots of deleted
// versions durably free, off the write path.
func (s *Store) maintain() {
	defer s.maintWG.Done()
	t := time.NewTicker(maintainEvery)
	defer t.Stop()
	for {
		// Deleted versions: make their 0600 mark durable, then reuse them.
		s.mu.Lock()
		dirty := s.dirty
		s.dirty = nil
		spares := len(s.free[0])
		s.mu.Unlock()
		for _, d := range dirty {
			f, err := os.Open(s.slotPath(d.n))
			if err != nil {
				s.mu.Lock()
				s.dirtyBytes -= d.size
				s.mu.Unlock()
				continue
			}
			err = f.Sync()
			f.Close()
			s.mu.Lock()
			s.dirtyBytes -= d.size
			if err == nil && !s.closed {
				s.addFree(d.n, d.size)
			} else {
				os.Remove(s.slotPath(d.n))
			}
			s.mu.Unlock()
		}
		// Spare empty slots, made in batches in one directory, so that one
		// directory fsync covers a batch.
		var made []uint64
		var dir uint64
		if spares < spareSlots/2 {
			s.mu.Lock()
			row := s.nextRow
			s.nextRow += spareSlots
			s.mu.Unlock()
			dir = row % fanout
			for i := spares; i < spareSlots; i++ {
				n := (row+uint64(i))*fanout + dir
				fd, err := unix.Open(s.slotPath(n), unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, pendingMode)
				if err != nil {
					break
				}
				unix.Close(fd)
				made = append(made, n)
			}
		}
		ok := len(made) == 0 || s.dirs[dir].Sync() == nil
		s.mu.Lock()
		for _, n := range made {
			if ok && !s.closed {
				s.addFree(n, 0)
			} else {
				os.Remove(s.slotPath(n))
			}
		}
		s.mu.Unlock()
		s.trim()
		select {
		case <-s.stop:
			return
		case <-s.kick:
		case <-t.C:
		}
	}
}

// trim releases the kept slots idle for longer than KeepIdle, and as many more
// as the file system lacks to hold the reserve plus a version of the largest
// length (see pressureLocked).
func (s *Store) trim() {
	_, fsAvail, err := s.statfs()
	s.mu.Lock()
	var victims []uint64
	if err == nil {
		victims = s.releaseLocked(s.pressureLocked(fsAvail))
	}
	victims = s.expireLocked(victims, s.now().Add(-s.opts.KeepIdle))
	s.mu.Unlock()
	s.unlink(victims)
}

// ReadInto reads version key into dst, which must hold its length, verifies the
// checksum and returns the version's info. Damaged data fails with ErrCorrupt.
func (s *Store) ReadInto(key chunk.Key, dst []byte) (chunk.Info, error) {
	return s.read(key, dst, false)
}

// read is ReadInto, and Verify with uncached.
func (s *Store) read(key chunk.Key, dst []byte, uncached bool) (chunk.Info, error) {
	info, err := s.readInto(key, dst, uncached)
	if err != nil && errors.Is(err, ErrCorrupt) {
		// Deleted while we read, and its slot already reused?
		if _, serr := s.Stat(key); serr != nil {
			return chunk.Info{}, serr
		}
	}
	return info, err
}

// Verify reads version key from the disk, not the page cache (its cached
// pages are dropped first), into dst, which must hold its length, and
// checks it as ReadInto does: damaged data, or a file gone from under the
// store, fails with ErrCorrupt; a version deleted meanwhile with
// ErrNotFound. Scrubbing calls it.
func (s *Store) Verify(key chunk.Key, dst []byte) (chunk.Info, error) {
	return s.read(key, dst, true)
}

func (s *Store) readInto(key chunk.Key, dst []byte, uncached bool) (chunk.Info, error) {
	s.mu.Lock()
	info, ok := s.chunks[key.Chunk][key.Version]
	sl := s.slotOf[key]
	s.mu.Unlock()
	if !ok {
		_, err := s.Stat(key)
		return chunk.Info{}, err
	}
	if len(dst) < int(info.Length) {
		return chunk.Info{}, fmt.Errorf("read %v: buffer of %d bytes for %d: %w", key, len(dst), info.Length, ErrTooLong)
	}
	f, err := os.Open(s.slotPath(sl.n))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			// The version is indexed but its file is gone: lost, unless
			// deleted meanwhile (ReadInto tells).
			return chunk.Info{}, fmt.Errorf("read %v: %w: its file is missing", key, ErrCorrupt)
		}
		return chunk.Info{}, fmt.Errorf("read %v: %w", key, err)
	}
	defer f.Close()
	if uncached {
		_ = unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED) // advice: a failure only means cached reads
	}
	var hdr [HeaderLen]byte
	if _, err := f.ReadAt(hdr[:], 0); err != nil {
		return chunk.Info{}, fmt.Errorf("read %v header: %w: %v", key, ErrCorrupt, err)
	}
	got, _, err := decodeHeader(hdr[:])
	if err != nil || got != info {
		return chunk.Info{}, fmt.Errorf("read %v: %w: header %+v, expected %+v (%v)", key, ErrCorrupt, got, info, err)
	}
	data := dst[:info.Length]
	if _, err := f.ReadAt(data, DataOffset); err != nil {
		return chunk.Info{}, fmt.Errorf("read %v data: %w: %v", key, ErrCorrupt, err)
	}
	if c := Checksum(data); c != info.CRC {
		return chunk.Info{}, fmt.Errorf("read %v: %w: crc32c %08x, stored %08x", key, ErrCorrupt, c, info.CRC)
	}
	return info, nil
}

// Delete removes a stored version; deleting a missing one returns ErrNotFound.
// Its slot is marked free (header cleared, mode 0600) and reused once that is
// durable, or unlinked at once when enough free slots are kept, when slots are
// not kept (Options.KeepIdle) or when the file system is short of room (see
// trim): then the space is the file system's again when Delete returns.
// Deletes are not synced: after a crash a deleted version may reappear, and the
// metadata service's garbage collection deletes it again.
func (s *Store) Delete(key chunk.Key) error {
	_, fsAvail, statErr := s.statfs()
	s.mu.Lock()
	info, ok := s.chunks[key.Chunk][key.Version]
	if !ok {
		s.mu.Unlock()
		return fmt.Errorf("delete %v: %w", key, ErrNotFound)
	}
	sl := s.slotOf[key]
	delete(s.chunks[key.Chunk], key.Version)
	if len(s.chunks[key.Chunk]) == 0 {
		delete(s.chunks, key.Chunk)
	}
	delete(s.slotOf, key)
	size := FileSize(int(info.Length))
	s.used -= size
	s.count--
	keep := !s.closed && s.opts.KeepIdle > 0 && s.freeCount+len(s.dirty) < maxFreeSlots &&
		s.keptLocked()+size <= maxFreeBytes && statErr == nil
	if keep {
		// Counted as kept from now on; kept only if that leaves the file
		// system the room trim wants.
		s.dirtyBytes += size
		if keep = s.pressureLocked(fsAvail) <= 0; !keep {
			s.dirtyBytes -= size
		}
	}
	s.mu.Unlock()
	path := s.slotPath(sl.n)
	if keep {
		err := s.markFree(path)
		s.mu.Lock()
		if err == nil {
			s.dirty = append(s.dirty, freed{n: sl.n, size: size})
		} else {
			s.dirtyBytes -= size
		}
		s.mu.Unlock()
		if err == nil {
			s.poke()
			return nil
		}
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("delete %v: %w", key, err)
	}
	return nil
}

// markFree turns a version's slot into a free one: its mode becomes 0600, then its
// header is cleared, so the version cannot reappear. maintain makes both durable
// before the slot is reused. In this order a process killed in between leaves a
// 0600 slot that still holds the whole version, which recovery keeps (a deleted
// version may reappear); the reverse order would leave a version marked complete
// without a header, which recovery would have to call damaged. A power cut may
// still persist the cleared header without the mode: recovery knows an all-zero
// header as this mark and frees the slot.
func (s *Store) markFree(path string) error {
	// The mode first: a complete slot (0400) may be opened for writing by
	// its owner only once it is 0600 again.
	if err := os.Chmod(path, pendingMode); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = f.WriteAt(s.zeros[:blockSize], 0)
	return err
}

// Close stops the store's background work and releases the directory lock.
// Puts in progress must have finished.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	idle := len(s.writing) == 0
	s.mu.Unlock()
	close(s.stop)
	s.maintWG.Wait()
	if idle && s.hdrMem != nil { // a Put still running keeps its buffer mapped
		unix.Munmap(s.hdrMem)
		s.hdrMem = nil
	}
	for i, d := range s.dirs {
		if d != nil {
			d.Close()
			s.dirs[i] = nil
		}
	}
	if s.lock != nil {
		unix.Flock(int(s.lock.Fd()), unix.LOCK_UN)
		s.lock.Close()
		s.lock = nil
	}
	return nil
}

// pathOf returns the file of a stored version.
func (s *Store) pathOf(key chunk.Key) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sl, ok := s.slotOf[key]
	return s.slotPath(sl.n), ok
}

func (s *Store) slotPath(n uint64) string {
	return filepath.Join(s.dir, chunksDir, fmt.Sprintf("%02x", n%fanout), fileName(n))
}

func fileName(n uint64) string { return fmt.Sprintf("%016x", n) }

func parseName(name string) (uint64, bool) {
	if len(name) != 16 {
		return 0, false
	}
	n, err := strconv.ParseUint(name, 16, 64)
	return n, err == nil
}

func encodeHeader(b []byte, info chunk.Info, seq uint64) {
	copy(b[0:4], magic)
	binary.LittleEndian.PutUint16(b[4:], formatV2)
	binary.LittleEndian.PutUint16(b[6:], 0)
	binary.LittleEndian.PutUint64(b[8:], info.Chunk)
	binary.LittleEndian.PutUint64(b[16:], info.Version)
	binary.LittleEndian.PutUint64(b[24:], uint64(info.Length))
	binary.LittleEndian.PutUint32(b[32:], info.CRC)
	binary.LittleEndian.PutUint32(b[36:], 0)
	binary.LittleEndian.PutUint64(b[40:], seq)
	binary.LittleEndian.PutUint32(b[48:], Checksum(b[:48]))
}

func decodeHeader(b []byte) (chunk.Info, uint64, error) {
	if len(b) < HeaderLen || string(b[0:4]) != magic {
		return chunk.Info{}, 0, errors.New("bad magic")
	}
	if c := Checksum(b[:48]); c != binary.LittleEndian.Uint32(b[48:]) {
		return chunk.Info{}, 0, errors.New("header checksum mismatch")
	}
	if f := binary.LittleEndian.Uint16(b[4:]); f != formatV2 {
		return chunk.Info{}, 0, fmt.Errorf("unknown format %d", f)
	}
	length := binary.LittleEndian.Uint64(b[24:])
	if length > 1<<32-1 {
		return chunk.Info{}, 0, fmt.Errorf("length %d out of range", length)
	}
	return chunk.Info{
		Key:    chunk.Key{Chunk: binary.LittleEndian.Uint64(b[8:]), Version: binary.LittleEndian.Uint64(b[16:])},
		Length: uint32(length),
		CRC:    binary.LittleEndian.Uint32(b[32:]),
	}, binary.LittleEndian.Uint64(b[40:]), nil
}

// pwriteAll writes the buffers at offset 0 on with pwritev2 flags, continuing
// after short writes (which keep block alignment for direct I/O, or do not
// happen at all).
func pwriteAll(fd int, iov [][]byte, flags int) error {
	var off int64
	for len(iov) > 0 {
		for len(iov) > 0 && len(iov[0]) == 0 {
			iov = iov[1:]
		}
		if len(iov) == 0 {
			break
		}
		n, err := unix.Pwritev2(fd, iov, off, flags)
		if err != nil {
			return err
		}
		if n == 0 {
			return syscall.EIO
		}
		off += int64(n)
		for n > 0 {
			if n >= len(iov[0]) {
				n -= len(iov[0])
				iov = iov[1:]
			} else {
				iov[0] = iov[0][n:]
				n = 0
			}
		}
	}
	return nil
}

var errHalfWritten = errors.New("store: version was not completely written")

// errFreedHeader is what readHeaderFile reports for a header cleared by markFree.
var errFreedHeader = errors.New("store: slot header cleared by a delete")

// verifyFile checks the data of a version file against its header's checksum.
func verifyFile(path string, info chunk.Info) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	data := make([]byte, info.Length)
	if _, err := f.ReadAt(data, DataOffset); err != nil {
		return fmt.Errorf("%w: %v", errHalfWritten, err)
	}
	if c := Checksum(data); c != info.CRC {
		return fmt.Errorf("%w: crc32c %08x, header says %08x", errHalfWritten, c, info.CRC)
	}
	return nil
}

func readHeaderFile(path string) (chunk.Info, uint64, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return chunk.Info{}, 0, 0, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return chunk.Info{}, 0, 0, err
	}
	var hdr [HeaderLen]byte
	if _, err := f.ReadAt(hdr[:], 0); err != nil {
		return chunk.Info{}, 0, st.Size(), fmt.Errorf("%w: short header: %v", ErrCorrupt, err)
	}
	if hdr == ([HeaderLen]byte{}) {
		return chunk.Info{}, 0, st.Size(), errFreedHeader
	}
	info, seq, err := decodeHeader(hdr[:])
	if err != nil {
		return chunk.Info{}, 0, st.Size(), fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	return info, seq, st.Size(), nil
}

func loadOrCreateID(dir string) (string, error) {
	path := filepath.Join(dir, idFile)
	b, err := os.ReadFile(path)
	if err == nil {
		id := strings.TrimSpace(string(b))
		if len(id) == 32 {
			if _, err := hex.DecodeString(id); err == nil {
				return id, nil
			}
		}
		return "", fmt.Errorf("store: %s holds no valid id (%q)", path, id)
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("store: read id: %w", err)
	}
	var raw [16]byte
	rand.Read(raw[:])
	id := hex.EncodeToString(raw[:])
	tmp := path + ".tmp"
	if err := writeFileSync(tmp, []byte(id+"\n")); err != nil {
		return "", fmt.Errorf("store: write id: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return "", fmt.Errorf("store: write id: %w", err)
	}
	if err := syncDir(dir); err != nil {
		return "", err
	}
	return id, nil
}

func writeFileSync(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, private.FileMode)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("store: open dir %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("store: fsync dir %s: %w", dir, err)
	}
	return nil
}
