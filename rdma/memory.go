package rdma

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Memory is a block of memory outside the Go heap, suitable for registration: a memfd
// mapped MAP_SHARED and prefaulted. The same memory can be registered with a NIC,
// read into by a software transport, or mapped by a same-host peer through Fd.
//
// Memory is not garbage collected: call Free when no memory region uses it.
type Memory struct {
	mu   sync.Mutex
	buf  []byte
	file *os.File
	regs int // live registrations; Free refuses while positive
}

// AllocMemory allocates size bytes of registrable memory, rounded up to whole pages,
// and touches every page so that the first I/O does not pay for page faults. name
// shows in /proc/PID/fd for debugging.
func AllocMemory(name string, size int) (*Memory, error) {
	if size <= 0 {
		return nil, fmt.Errorf("rdma: alloc memory %q: size %d must be positive", name, size)
	}
	page := os.Getpagesize()
	size = (size + page - 1) / page * page
	fd, err := unix.MemfdCreate("rdma:"+name, unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("rdma: memfd_create %q: %w", name, err)
	}
	file := os.NewFile(uintptr(fd), "memfd:"+name)
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		file.Close()
		return nil, fmt.Errorf("rdma: size memfd %q to %d bytes: %w", name, size, err)
	}
	buf, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		file.Close()
		return nil, fmt.Errorf("rdma: mmap %d bytes for %q: %w", size, name, err)
	}
	prefault(buf, page)
	return &Memory{buf: buf, file: file}, nil
}

// prefault makes sure no I/O on buf pays for first-touch faults: it has the
// kernel write every page through this mapping, by reading /dev/zero into it,
// and then touches every page from user code too (MAP_POPULATE has already
// faulted the pages in).
//
// Both sides touch every page because both use them — the software transports
// have the kernel copy between sockets and these pages, chunkd and the client
// read and write them from Go — and on some virtual machines the first access
// from each side is slow whatever the other did (docs/performance.md).
func prefault(buf []byte, page int) {
	zero, err := unix.Open("/dev/zero", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err == nil {
		defer unix.Close(zero)
		const step = 1 << 20
		for off := 0; off < len(buf); {
			n, err := unix.Read(zero, buf[off:min(off+step, len(buf))])
			if err != nil || n <= 0 {
				break
			}
			off += n
		}
	}
	for i := 0; i < len(buf); i += page {
		buf[i] = 0
	}
}

// Bytes returns the memory as a byte slice. It stays valid until Free.
func (m *Memory) Bytes() []byte { return m.buf }

// Len returns the size of the memory in bytes.
func (m *Memory) Len() int { return len(m.buf) }

// Addr returns the virtual address of the first byte, as used in SGEs and remote
// addresses.
func (m *Memory) Addr() uint64 { return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(m.buf)))) }

// File returns the memfd backing the memory, for transports that share it with a
// same-host peer. The caller must not close it.
func (m *Memory) File() *os.File { return m.file }

// ErrMemoryRegistered is returned by Free while a memory region still uses the memory.
var ErrMemoryRegistered = errors.New("rdma: memory is still registered")

// Pin records a registration of the memory; transports call it when they register
// a memory region over it, and Unpin when they deregister it.
func (m *Memory) Pin() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.buf == nil {
		return errors.New("rdma: memory already freed")
	}
	m.regs++
	return nil
}

// Unpin undoes one Pin.
func (m *Memory) Unpin() {
	m.mu.Lock()
	m.regs--
	m.mu.Unlock()
}

// Free unmaps the memory and closes its memfd. It fails with ErrMemoryRegistered
// while a memory region is registered over it.
func (m *Memory) Free() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.buf == nil {
		return nil
	}
	if m.regs > 0 {
		return ErrMemoryRegistered
	}
	err := unix.Munmap(m.buf)
	m.buf = nil
	if cerr := m.file.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("rdma: free memory: %w", err)
	}
	return nil
}
