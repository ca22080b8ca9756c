package fileio

import (
	"context"
	"fmt"
	"sort"
	"sync"

	"github.com/rdmafs/rdmafs/rdma"
)

// pool hands out pieces of one registered memory region: stripe buffers for
// dirty data and buffers for reads. Allocation is first fit over a sorted free
// list; a caller that finds no room waits until something is freed, so a full
// pool is backpressure, not a sleeping loop.
type pool struct {
	mr      rdma.MemoryRegion
	mu      sync.Mutex
	free    []extent      // sorted by offset, coalesced
	spare   []*buffer     // buffer records given back, reused (no allocation per I/O)
	freed   chan struct{} // closed and replaced by a put while waiters > 0
	waiters int           // gets waiting on freed
}

type extent struct{ off, n int }

// buffer is a piece of registered memory.
type buffer struct {
	p   *pool
	off int
	b   []byte
	one [1]rdma.SGE // backs sgl
}

const poolAlign = 4096

func newPool(mr rdma.MemoryRegion) *pool {
	return &pool{mr: mr, free: []extent{{0, mr.Len()}}, freed: make(chan struct{})}
}

// get returns n bytes (rounded up to 4 KiB), waiting for room until ctx ends.
func (p *pool) get(ctx context.Context, n int) (*buffer, error) {
	n = (n + poolAlign - 1) / poolAlign * poolAlign
	if n > p.mr.Len() {
		return nil, fmt.Errorf("buffer of %d bytes exceeds the %d-byte memory pool", n, p.mr.Len())
	}
	for {
		p.mu.Lock()
		b := p.takeLocked(n)
		wait := p.freed
		if b == nil {
			p.waiters++
		}
		p.mu.Unlock()
		if b != nil {
			return b, nil
		}
		var err error
		sctx, done := slow(ctx)
		select {
		case <-wait:
		case <-sctx.Done():
			err = fmt.Errorf("waiting for %d bytes of buffer memory: %w", n, sctx.Err())
		}
		done()
		p.mu.Lock()
		p.waiters--
		p.mu.Unlock()
		if err != nil {
			return nil, err
		}
	}
}

// tryGet returns n bytes (rounded up to 4 KiB), or nil when there is no room now.
func (p *pool) tryGet(n int) *buffer {
	n = (n + poolAlign - 1) / poolAlign * poolAlign
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.takeLocked(n)
}

// takeLocked carves n bytes out of the first free extent that holds them.
func (p *pool) takeLocked(n int) *buffer {
	for i, e := range p.free {
		if e.n >= n {
			if e.n == n {
				p.free = append(p.free[:i], p.free[i+1:]...)
			} else {
				p.free[i] = extent{e.off + n, e.n - n}
			}
			var b *buffer
			if k := len(p.spare); k > 0 {
				b, p.spare = p.spare[k-1], p.spare[:k-1]
			} else {
				b = &buffer{p: p}
			}
			b.off, b.b = e.off, p.mr.Bytes()[e.off:e.off+n:e.off+n]
			return b
		}
	}
	return nil
}

// put returns b to the pool and wakes the waiters. b must not be used after.
func (p *pool) put(b *buffer) {
	if b == nil {
		return
	}
	p.mu.Lock()
	e := extent{b.off, len(b.b)}
	b.b = nil
	p.spare = append(p.spare, b)
	i := sort.Search(len(p.free), func(i int) bool { return p.free[i].off > e.off })
	p.free = append(p.free, extent{})
	copy(p.free[i+1:], p.free[i:])
	p.free[i] = e
	// Coalesce with the neighbours.
	if i+1 < len(p.free) && p.free[i].off+p.free[i].n == p.free[i+1].off {
		p.free[i].n += p.free[i+1].n
		p.free = append(p.free[:i+1], p.free[i+2:]...)
	}
	if i > 0 && p.free[i-1].off+p.free[i-1].n == p.free[i].off {
		p.free[i-1].n += p.free[i].n
		p.free = append(p.free[:i], p.free[i+1:]...)
	}
	if p.waiters > 0 {
		close(p.freed)
		p.freed = make(chan struct{})
	}
	p.mu.Unlock()
}

// sge returns the SGE for [off, off+n) of the buffer.
func (b *buffer) sge(off, n int) rdma.SGE {
	return rdma.SGE{Addr: b.p.mr.Addr() + uint64(b.off+off), Length: uint32(n), LKey: b.p.mr.LKey()}
}

// sgl returns a one-entry scatter-gather list of [off, off+n) of b, stored in
// b so that a read in a loop allocates nothing: it is valid until the next
// call, so only one operation at a time may use it.
func (b *buffer) sgl(off, n int) []rdma.SGE {
	b.one[0] = b.sge(off, n)
	return b.one[:]
}
