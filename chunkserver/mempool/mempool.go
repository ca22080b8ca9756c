// Package mempool carves buffers out of one block of registered memory: chunkd
// allocates and registers its memory once at start and hands out extents of it for
// resident chunk versions, write staging and control-message rings, so that no I/O
// ever registers memory.
package mempool

import (
	"fmt"
	"sort"
	"sync"

	"github.com/rdmafs/rdmafs/rdma"
)

// Access is the access the pool's memory region is registered with: local writes
// (loading from disk, receiving messages), remote reads and writes, and binding of
// memory windows, through which alone clients get remote access.
const Access = rdma.AccessLocalWrite | rdma.AccessRemoteRead | rdma.AccessRemoteWrite | rdma.AccessMWBind

// Granularity is the allocation unit: extents are page aligned.
const Granularity = 4096

// Buf is an extent of the pool.
type Buf struct {
	Off  int // offset in the pool
	Size int // bytes reserved (a multiple of Granularity)
	Len  int // bytes asked for
}

// Pool is a registered memory region with an extent allocator. It is safe for
// concurrent use.
type Pool struct {
	mem *rdma.Memory
	mr  rdma.MemoryRegion

	mu    sync.Mutex
	alloc *Allocator
}

// New allocates size bytes of memory (outside the Go heap) and registers it once
// with pd.
func New(pd rdma.ProtectionDomain, name string, size int) (*Pool, error) {
	size = roundUp(size, Granularity)
	mem, err := rdma.AllocMemory(name, size)
	if err != nil {
		return nil, fmt.Errorf("mempool: %w", err)
	}
	mr, err := pd.RegisterMemory(mem, Access)
	if err != nil {
		mem.Free()
		return nil, fmt.Errorf("mempool: register %d bytes: %w", size, err)
	}
	return &Pool{mem: mem, mr: mr, alloc: NewAllocator(mem.Len(), Granularity)}, nil
}

// MR returns the pool's memory region.
func (p *Pool) MR() rdma.MemoryRegion { return p.mr }

// Size returns the pool's size in bytes.
func (p *Pool) Size() int { return p.mem.Len() }

// Alloc reserves n bytes; ok is false when no free extent is large enough.
func (p *Pool) Alloc(n int) (b Buf, ok bool) {
	if n <= 0 {
		n = 1
	}
	size := roundUp(n, Granularity)
	p.mu.Lock()
	off, ok := p.alloc.Alloc(size)
	p.mu.Unlock()
	if !ok {
		return Buf{}, false
	}
	return Buf{Off: off, Size: size, Len: n}, true
}

// Free returns b to the pool.
func (p *Pool) Free(b Buf) {
	if b.Size == 0 {
		return
	}
	p.mu.Lock()
	p.alloc.Free(b.Off, b.Size)
	p.mu.Unlock()
}

// InUse returns the bytes allocated.
func (p *Pool) InUse() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.alloc.InUse()
}

// Bytes returns b's first b.Len bytes.
func (p *Pool) Bytes(b Buf) []byte { return p.mem.Bytes()[b.Off : b.Off+b.Len : b.Off+b.Size] }

// Addr returns the virtual address of b's first byte.
func (p *Pool) Addr(b Buf) uint64 { return p.mr.Addr() + uint64(b.Off) }

// SGE returns a scatter-gather element covering n bytes of b from off.
func (p *Pool) SGE(b Buf, off, n int) rdma.SGE {
	return rdma.SGE{Addr: p.Addr(b) + uint64(off), Length: uint32(n), LKey: p.mr.LKey()}
}

// Close deregisters and frees the memory. Every memory window bound to it must be
// invalidated first.
func (p *Pool) Close() error {
	if err := p.mr.Deregister(); err != nil {
		return fmt.Errorf("mempool: deregister: %w", err)
	}
	if err := p.mem.Free(); err != nil {
		return fmt.Errorf("mempool: free: %w", err)
	}
	return nil
}

func roundUp(n, g int) int { return (n + g - 1) / g * g }

// Allocator manages extents of [0, size): best fit over a sorted free list with
// coalescing. It is not safe for concurrent use.
type Allocator struct {
	size  int
	gran  int
	inUse int
	free  []extent // sorted by off, never adjacent
}

type extent struct{ off, size int }

// NewAllocator returns an allocator of size bytes in units of gran.
func NewAllocator(size, gran int) *Allocator {
	size = size / gran * gran
	a := &Allocator{size: size, gran: gran}
	if size > 0 {
		a.free = []extent{{0, size}}
	}
	return a
}

// InUse returns the bytes allocated.
func (a *Allocator) InUse() int { return a.inUse }

// Alloc reserves n bytes (rounded up to the unit) and returns their offset.
func (a *Allocator) Alloc(n int) (int, bool) {
	n = roundUp(n, a.gran)
	best := -1
	for i, e := range a.free {
		if e.size >= n && (best < 0 || e.size < a.free[best].size) {
			best = i
			if e.size == n {
				break
			}
		}
	}
	if best < 0 {
		return 0, false
	}
	e := &a.free[best]
	off := e.off
	if e.size == n {
		a.free = append(a.free[:best], a.free[best+1:]...)
	} else {
		e.off += n
		e.size -= n
	}
	a.inUse += n
	return off, true
}

// Free releases the n bytes at off (as returned by Alloc for n).
func (a *Allocator) Free(off, n int) {
	n = roundUp(n, a.gran)
	if off < 0 || off+n > a.size || n <= 0 {
		panic(fmt.Sprintf("mempool: free of [%d,+%d) outside [0,%d)", off, n, a.size))
	}
	i := sort.Search(len(a.free), func(i int) bool { return a.free[i].off >= off })
	if (i < len(a.free) && a.free[i].off < off+n) || (i > 0 && a.free[i-1].off+a.free[i-1].size > off) {
		panic(fmt.Sprintf("mempool: double free of [%d,+%d)", off, n))
	}
	a.inUse -= n
	prev := i > 0 && a.free[i-1].off+a.free[i-1].size == off
	next := i < len(a.free) && a.free[i].off == off+n
	switch {
	case prev && next:
		a.free[i-1].size += n + a.free[i].size
		a.free = append(a.free[:i], a.free[i+1:]...)
	case prev:
		a.free[i-1].size += n
	case next:
		a.free[i].off = off
		a.free[i].size += n
	default:
		a.free = append(a.free, extent{})
		copy(a.free[i+1:], a.free[i:])
		a.free[i] = extent{off, n}
	}
}
