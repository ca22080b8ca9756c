// Package store keeps chunk versions durable in a data directory: one file per
// version, written copy-on-write, checksummed with CRC32C and synced before a commit
// is acknowledged, so that a crash at any point leaves every acknowledged version
// intact and no half-written one visible.
//
// Layout of the data directory:
//
//	chunkd.id              the chunkserver's stable id (random, made on first open)
//	LOCK                   flock'ed while a Store has the directory open
//	chunks/XX/CCCC.VVVV    one version: XX = low byte of the chunk id, CCCC the chunk
//	                       id and VVVV the version, both 16 hex digits
//	chunks/XX/.tmp-...     left by older versions of chunkd; removed on open
//	corrupt/               files found damaged on open, kept for inspection
//
// A version file is a 40-byte header (magic, format, chunk, version, length, CRC32C
// of the data, CRC32C of the header) followed by the data. A version is created
// under its final name with mode 0600 ("pending"), written, fdatasync'ed, its
// directory fsync'ed, and then marked complete with mode 0644; see Store.write for
// why this is crash safe. Files with damaged headers are moved to corrupt/.
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
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rdmafs/rdmafs/chunkserver/chunk"
)

// Castagnoli is the CRC32C table used for every checksum of chunk data.
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

// HeaderLen is the size of the encoded header at the start of a version file.
const HeaderLen = 40

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
	formatV1   = 1
	idFile     = "chunkd.id"
	lockFile   = "LOCK"
	chunksDir  = "chunks"
	corruptDir = "corrupt"
	tmpPrefix  = ".tmp-"
	fanout     = 256
	// pendingMode marks a version file being written, doneMode a complete one.
	pendingMode = 0o600
	doneMode    = 0o644
)

// Options configure a Store.
type Options struct {
	// MaxLength is the largest version accepted, in bytes (default 16 MiB).
	MaxLength int
	// Capacity bounds the bytes stored (headers included); a Put that would exceed
	// it fails with ErrNoSpace. Zero means only the file system's own limit.
	Capacity int64
	// Logger receives recovery notes (default slog.Default()).
	Logger *slog.Logger
	// NoDirectIO writes through the page cache even when the data is aligned
	// for direct I/O.
	NoDirectIO bool
}

// DefaultMaxLength is the default MaxLength.
const DefaultMaxLength = 16 << 20

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

	mu      sync.Mutex
	closed  bool
	chunks  map[chunk.ID]map[chunk.Version]chunk.Info
	writing map[chunk.Key]struct{}
	used    int64 // bytes of committed files plus bytes reserved by writes in progress
	count   int
}

// Open opens (creating if needed) the store in dir and recovers it: temporary files
// of interrupted writes are removed and every version file's header is checked;
// damaged files are moved to corrupt/.
func Open(dir string, opts Options) (*Store, error) {
	if opts.MaxLength <= 0 {
		opts.MaxLength = DefaultMaxLength
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	s := &Store{
		dir: dir, opts: opts, log: opts.Logger,
		chunks:  make(map[chunk.ID]map[chunk.Version]chunk.Info),
		writing: make(map[chunk.Key]struct{}),
	}
	if err := os.MkdirAll(filepath.Join(dir, chunksDir), 0o755); err != nil {
		return nil, fmt.Errorf("store: create data dir: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, lockFile), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("store: open lock file: %w", err)
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		lock.Close()
		return nil, fmt.Errorf("store: lock %s: %w", dir, ErrDirLocked)
	}
	s.lock = lock
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
	return s, nil
}

func (s *Store) open() error {
	id, err := loadOrCreateID(s.dir)
	if err != nil {
		return err
	}
	s.id = id
	root := filepath.Join(s.dir, chunksDir)
	for i := 0; i < fanout; i++ {
		sub := filepath.Join(root, fmt.Sprintf("%02x", i))
		if err := os.MkdirAll(sub, 0o755); err != nil {
			return fmt.Errorf("store: create %s: %w", sub, err)
		}
		d, err := os.Open(sub)
		if err != nil {
			return fmt.Errorf("store: open %s: %w", sub, err)
		}
		s.dirs[i] = d
		if err := s.recoverDir(sub); err != nil {
			return err
		}
	}
	if err := syncDir(root); err != nil {
		return err
	}
	return syncDir(s.dir)
}

// recoverDir scans one fan-out directory.
func (s *Store) recoverDir(sub string) error {
	ents, err := os.ReadDir(sub)
	if err != nil {
		return fmt.Errorf("store: scan %s: %w", sub, err)
	}
	for _, e := range ents {
		name := e.Name()
		path := filepath.Join(sub, name)
		if strings.HasPrefix(name, tmpPrefix) {
			s.log.Info("store: removing interrupted write", "file", path)
			if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("store: remove %s: %w", path, err)
			}
			continue
		}
		key, ok := parseName(name)
		if !ok {
			s.log.Warn("store: ignoring unknown file", "file", path)
			continue
		}
		fi, err := e.Info()
		if err != nil {
			return fmt.Errorf("store: stat %s: %w", path, err)
		}
		pending := fi.Mode().Perm()&0o044 == 0
		info, size, err := readHeaderFile(path)
		if err == nil && (info.Key != key || size != FileSize(int(info.Length))) {
			err = fmt.Errorf("%w: header names %v length %d, file is %v of %d bytes", ErrCorrupt, info.Key, info.Length, key, size)
		}
		if pending {
			// Written but not marked complete: a crash hit the write or the
			// mark. Keep it only if it is whole.
			if err == nil {
				err = verifyFile(path, info)
			}
			if err != nil {
				s.log.Info("store: removing half-written version", "file", path, "err", err)
				if err := os.Remove(path); err != nil {
					return fmt.Errorf("store: remove %s: %w", path, err)
				}
				continue
			}
			if err := os.Chmod(path, doneMode); err != nil {
				return fmt.Errorf("store: mark %s complete: %w", path, err)
			}
			s.log.Info("store: kept a complete version whose completion mark was lost", "file", path)
		} else if err != nil {
			s.quarantine(path, err)
			continue
		}
		s.add(info)
	}
	return nil
}

func (s *Store) quarantine(path string, why error) {
	s.log.Error("store: damaged version file moved aside", "file", path, "err", why)
	cdir := filepath.Join(s.dir, corruptDir)
	if err := os.MkdirAll(cdir, 0o755); err == nil {
		if err := os.Rename(path, filepath.Join(cdir, filepath.Base(path))); err == nil {
			return
		}
	}
	os.Remove(path)
}

func (s *Store) add(info chunk.Info) {
	vs := s.chunks[info.Chunk]
	if vs == nil {
		vs = make(map[chunk.Version]chunk.Info)
		s.chunks[info.Chunk] = vs
	}
	vs[info.Version] = info
	s.used += FileSize(int(info.Length))
	s.count++
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

// Capacity returns the configured capacity, or the file system's size when none
// is configured, and the bytes free.
func (s *Store) Capacity() (total, free int64) {
	if s.opts.Capacity > 0 {
		used, _ := s.Usage()
		return s.opts.Capacity, max(s.opts.Capacity-used, 0)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(s.dir, &st); err != nil {
		return 0, 0
	}
	return int64(st.Blocks) * st.Bsize, int64(st.Bavail) * st.Bsize
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

// Put stores data as version key durably: when it returns nil the version survives a
// crash or power cut. When data starts on a 4 KiB boundary and its capacity
// reaches the next one past its end, it is written with direct I/O, and Put
// zeroes data[len(data):] up to that boundary. crc must be the CRC32C of data (the caller has verified it). It
// fails with ErrExists if the version is stored, ErrBusy if another Put of it is in
// progress, ErrTooLong over the length limit and an error wrapping ErrNoSpace (and
// syscall.ENOSPC) when the disk or the capacity is full. A failed Put leaves nothing
// behind.
func (s *Store) Put(key chunk.Key, data []byte, crc uint32) (err error) {
	if len(data) > s.opts.MaxLength {
		return fmt.Errorf("put %v: %d bytes: %w", key, len(data), ErrTooLong)
	}
	need := FileSize(len(data))
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
	if s.opts.Capacity > 0 && s.used+need > s.opts.Capacity {
		s.mu.Unlock()
		return fmt.Errorf("put %v: %w", key, ErrNoSpace)
	}
	s.writing[key] = struct{}{}
	s.used += need
	s.mu.Unlock()

	info := chunk.Info{Key: key, Length: uint32(len(data)), CRC: crc}
	err = s.write(info, data)

	s.mu.Lock()
	delete(s.writing, key)
	s.used -= need
	if err == nil {
		s.add(info)
	}
	s.mu.Unlock()
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

// write makes the version file. The file is created under its final name with
// mode 0600, which marks it "not yet known complete"; header and data are written
// and fdatasync'ed, the directory is fsync'ed (the new entry was committed with the
// file, so this is cheap), and only then is the mode set to 0644. Recovery trusts
// 0644 files after a header check and verifies the whole checksum of 0600 ones,
// keeping those that are complete and discarding half-written ones. So a commit
// costs one journal commit, and a crash at any point loses no acknowledged
// version and shows no partial one.
func (s *Store) write(info chunk.Info, data []byte) error {
	slot := int(info.Chunk % fanout)
	sub := filepath.Join(s.dir, chunksDir, fmt.Sprintf("%02x", slot))
	final := filepath.Join(sub, fileName(info.Key))

	hdr := <-s.hdrPages
	defer func() { s.hdrPages <- hdr }()
	clear(hdr)
	encodeHeader(hdr, info)
	padded := roundUp(len(data))
	// Direct I/O when the data is block aligned with room for its padding, as
	// staging buffers in registered memory are: no copy into the page cache.
	direct := s.direct.Load() && len(data) > 0 && cap(data) >= padded &&
		uintptr(unsafe.Pointer(unsafe.SliceData(data)))%blockSize == 0
	iov := [3][]byte{hdr, data}
	if direct {
		clear(data[len(data):padded])
		iov[1] = data[:padded]
	} else {
		iov[2] = s.zeros[:padded-len(data)]
	}
	flags := unix.O_WRONLY | unix.O_CREAT | unix.O_EXCL | unix.O_CLOEXEC
	if direct {
		flags |= unix.O_DIRECT
	}
	fd, err := unix.Open(final, flags, pendingMode)
	if err == unix.EINVAL && direct { // the file system has no direct I/O
		s.direct.Store(false)
		s.log.Info("store: direct I/O not supported, using buffered writes", "dir", s.dir)
		direct = false
		iov[1], iov[2] = data, s.zeros[:padded-len(data)]
		fd, err = unix.Open(final, flags&^unix.O_DIRECT, pendingMode)
	}
	if err != nil {
		return fmt.Errorf("create %s: %w", final, err)
	}
	ok := false
	defer func() {
		if fd >= 0 {
			unix.Close(fd)
		}
		if !ok {
			os.Remove(final)
		}
	}()
	if err := pwriteAll(fd, iov[:]); err != nil {
		if err == unix.EINVAL && direct { // alignment the device does not take
			s.direct.Store(false)
			s.log.Info("store: direct I/O refused, using buffered writes", "dir", s.dir, "err", err)
			unix.Close(fd)
			fd = -1
			os.Remove(final)
			ok = true // removed already; the retry owns the name now
			return s.write(info, data)
		}
		return fmt.Errorf("write %s: %w", final, err)
	}
	if err := unix.Fdatasync(fd); err != nil {
		return fmt.Errorf("fdatasync %s: %w", final, err)
	}
	if err := s.dirs[slot].Sync(); err != nil {
		return fmt.Errorf("fsync dir %s: %w", sub, err)
	}
	// Durable: mark complete. The mode change itself need not be synced: if it
	// is lost, recovery verifies the checksum and keeps the file.
	if err := unix.Fchmod(fd, doneMode); err != nil {
		return fmt.Errorf("mark %s complete: %w", final, err)
	}
	ok = true
	err = unix.Close(fd)
	fd = -1
	if err != nil {
		return fmt.Errorf("close %s: %w", final, err)
	}
	return nil
}

// ReadInto reads version key into dst, which must hold its length, verifies the
// checksum and returns the version's info. Damaged data fails with ErrCorrupt.
func (s *Store) ReadInto(key chunk.Key, dst []byte) (chunk.Info, error) {
	info, err := s.Stat(key)
	if err != nil {
		return chunk.Info{}, err
	}
	if len(dst) < int(info.Length) {
		return chunk.Info{}, fmt.Errorf("read %v: buffer of %d bytes for %d: %w", key, len(dst), info.Length, ErrTooLong)
	}
	path := s.path(key)
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return chunk.Info{}, fmt.Errorf("read %v: %w", key, ErrNotFound)
		}
		return chunk.Info{}, fmt.Errorf("read %v: %w", key, err)
	}
	defer f.Close()
	var hdr [HeaderLen]byte
	if _, err := f.ReadAt(hdr[:], 0); err != nil {
		return chunk.Info{}, fmt.Errorf("read %v header: %w: %v", key, ErrCorrupt, err)
	}
	got, err := decodeHeader(hdr[:])
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

// Delete removes a stored version. Deleting a missing version returns ErrNotFound.
// Deletes are not synced: after a crash a deleted version may reappear, and the
// metadata service's garbage collection deletes it again.
func (s *Store) Delete(key chunk.Key) error {
	s.mu.Lock()
	info, ok := s.chunks[key.Chunk][key.Version]
	if !ok {
		s.mu.Unlock()
		return fmt.Errorf("delete %v: %w", key, ErrNotFound)
	}
	delete(s.chunks[key.Chunk], key.Version)
	if len(s.chunks[key.Chunk]) == 0 {
		delete(s.chunks, key.Chunk)
	}
	s.used -= FileSize(int(info.Length))
	s.count--
	s.mu.Unlock()
	if err := os.Remove(s.path(key)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("delete %v: %w", key, err)
	}
	return nil
}

// Close releases the directory lock. Puts in progress finish first only if the
// caller waited for them.
func (s *Store) Close() error {
	s.mu.Lock()
	s.closed = true
	idle := len(s.writing) == 0
	s.mu.Unlock()
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

func (s *Store) path(key chunk.Key) string {
	return filepath.Join(s.dir, chunksDir, fmt.Sprintf("%02x", key.Chunk%fanout), fileName(key))
}

func fileName(key chunk.Key) string { return fmt.Sprintf("%016x.%016x", key.Chunk, key.Version) }

func parseName(name string) (chunk.Key, bool) {
	if len(name) != 33 || name[16] != '.' {
		return chunk.Key{}, false
	}
	c, err1 := strconv.ParseUint(name[:16], 16, 64)
	v, err2 := strconv.ParseUint(name[17:], 16, 64)
	if err1 != nil || err2 != nil {
		return chunk.Key{}, false
	}
	return chunk.Key{Chunk: c, Version: v}, true
}

func encodeHeader(b []byte, info chunk.Info) {
	copy(b[0:4], magic)
	binary.LittleEndian.PutUint16(b[4:], formatV1)
	binary.LittleEndian.PutUint16(b[6:], 0)
	binary.LittleEndian.PutUint64(b[8:], info.Chunk)
	binary.LittleEndian.PutUint64(b[16:], info.Version)
	binary.LittleEndian.PutUint64(b[24:], uint64(info.Length))
	binary.LittleEndian.PutUint32(b[32:], info.CRC)
	binary.LittleEndian.PutUint32(b[36:], Checksum(b[:36]))
}

func decodeHeader(b []byte) (chunk.Info, error) {
	if len(b) < HeaderLen || string(b[0:4]) != magic {
		return chunk.Info{}, errors.New("bad magic")
	}
	if c := Checksum(b[:36]); c != binary.LittleEndian.Uint32(b[36:]) {
		return chunk.Info{}, errors.New("header checksum mismatch")
	}
	if f := binary.LittleEndian.Uint16(b[4:]); f != formatV1 {
		return chunk.Info{}, fmt.Errorf("unknown format %d", f)
	}
	length := binary.LittleEndian.Uint64(b[24:])
	if length > 1<<32-1 {
		return chunk.Info{}, fmt.Errorf("length %d out of range", length)
	}
	return chunk.Info{
		Key:    chunk.Key{Chunk: binary.LittleEndian.Uint64(b[8:]), Version: binary.LittleEndian.Uint64(b[16:])},
		Length: uint32(length),
		CRC:    binary.LittleEndian.Uint32(b[32:]),
	}, nil
}

// pwriteAll writes the buffers at offset 0 on, continuing after short writes
// (which keep block alignment for direct I/O, or do not happen at all).
func pwriteAll(fd int, iov [][]byte) error {
	var off int64
	for len(iov) > 0 {
		for len(iov) > 0 && len(iov[0]) == 0 {
			iov = iov[1:]
		}
		if len(iov) == 0 {
			break
		}
		n, err := unix.Pwritev(fd, iov, off)
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

func readHeaderFile(path string) (chunk.Info, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return chunk.Info{}, 0, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return chunk.Info{}, 0, err
	}
	var hdr [HeaderLen]byte
	if _, err := f.ReadAt(hdr[:], 0); err != nil {
		return chunk.Info{}, st.Size(), fmt.Errorf("%w: short header: %v", ErrCorrupt, err)
	}
	info, err := decodeHeader(hdr[:])
	if err != nil {
		return chunk.Info{}, st.Size(), fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	return info, st.Size(), nil
}

// loadOrCreateID reads the chunkserver id from dir, making a random one durably on
// first use.
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
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
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
