package soft

import (
	crand "crypto/rand"
	"encoding/binary"
	"math/rand/v2"
	"sync"
	"sync/atomic"

	"github.com/rdmafs/rdmafs/rdma"
)

// invalidBit marks a region whose keys have been revoked; the bits below it count
// accesses in progress.
const invalidBit = int64(1) << 62

// Region is the target of a key: a registered memory region, or a memory window
// bound to part of one. Accesses hold it with Acquire/Release; Invalidate revokes it
// and waits for the accesses in progress.
type Region struct {
	key    uint32
	pd     *PD
	mem    *rdma.Memory
	owner  any // for a window: the queue pair it is bound to; nil for a region
	base   uint64
	buf    []byte
	access rdma.AccessFlags

	state   atomic.Int64
	drained chan struct{}
	once    sync.Once

	rmu      sync.Mutex
	revokers []Revoker
	revoked  bool
}

// Revoker is a holder of a key outside this process's key table — a peer that
// may access the region directly through shared memory — that must give it up
// before an invalidation completes.
type Revoker interface {
	// Revoke returns once the holder can no longer access the region.
	Revoke(key uint32)
}

func newRegion(pd *PD, owner any, mem *rdma.Memory, base uint64, buf []byte, access rdma.AccessFlags) *Region {
	return &Region{pd: pd, owner: owner, mem: mem, base: base, buf: buf, access: access, drained: make(chan struct{})}
}

// Key returns the region's key.
func (r *Region) Key() uint32 { return r.key }

// Base returns the address of the region's first byte.
func (r *Region) Base() uint64 { return r.base }

// Len returns the region's length.
func (r *Region) Len() int { return len(r.buf) }

// Access returns the region's rights.
func (r *Region) Access() rdma.AccessFlags { return r.access }

// Memory returns the registered memory the region lies in.
func (r *Region) Memory() *rdma.Memory { return r.mem }

// AddRevoker registers a holder to revoke when the region is invalidated. It
// returns false when the region is already invalid.
func (r *Region) AddRevoker(rv Revoker) bool {
	r.rmu.Lock()
	defer r.rmu.Unlock()
	if r.revoked {
		return false
	}
	r.revokers = append(r.revokers, rv)
	return true
}

// RemoveRevoker forgets a holder that went away.
func (r *Region) RemoveRevoker(rv Revoker) {
	r.rmu.Lock()
	defer r.rmu.Unlock()
	for i, x := range r.revokers {
		if x == rv {
			r.revokers = append(r.revokers[:i], r.revokers[i+1:]...)
			return
		}
	}
}

func (r *Region) acquire() bool {
	if r.state.Add(1)&invalidBit != 0 {
		r.Release()
		return false
	}
	return true
}

// Release ends an access begun by a successful lookup.
func (r *Region) Release() {
	if r.state.Add(-1) == invalidBit {
		r.once.Do(func() { close(r.drained) })
	}
}

// invalidate revokes the region and waits until no access is in progress.
func (r *Region) invalidate() {
	for {
		s := r.state.Load()
		if s&invalidBit != 0 {
			break
		}
		if r.state.CompareAndSwap(s, s|invalidBit) {
			if s == 0 {
				r.once.Do(func() { close(r.drained) })
			}
			break
		}
	}
	<-r.drained
	r.rmu.Lock()
	revokers := r.revokers
	r.revokers, r.revoked = nil, true
	r.rmu.Unlock()
	for _, rv := range revokers {
		rv.Revoke(r.key)
	}
}

// slice returns the bytes [addr, addr+length) of the region, or false when the range
// is not inside it. The check cannot overflow.
func (r *Region) slice(addr uint64, length uint32) ([]byte, bool) {
	if addr < r.base {
		return nil, false
	}
	off := addr - r.base
	size := uint64(len(r.buf))
	if off > size || uint64(length) > size-off {
		return nil, false
	}
	return r.buf[off : off+uint64(length) : off+uint64(length)], true
}

// Keys is a device's table of lkeys and rkeys. Keys are random 32-bit values, so
// a peer cannot guess a key it was not given; a revoked key is never valid again.
type Keys struct {
	mu  sync.RWMutex
	m   map[uint32]*Region
	rng *rand.ChaCha8
}

// NewKeys returns an empty key table.
func NewKeys() *Keys {
	var seed [32]byte
	if _, err := crand.Read(seed[:]); err != nil {
		// crypto/rand does not fail on Linux; a fixed seed would only make keys
		// guessable, never wrong.
		binary.LittleEndian.PutUint64(seed[:], 0x9e3779b97f4a7c15)
	}
	return &Keys{m: make(map[uint32]*Region), rng: rand.NewChaCha8(seed)}
}

func (t *Keys) insert(r *Region) uint32 {
	t.mu.Lock()
	defer t.mu.Unlock()
	for {
		k := uint32(t.rng.Uint64())
		if k == 0 {
			continue
		}
		if _, taken := t.m[k]; !taken {
			r.key = k
			t.m[k] = r
			return k
		}
	}
}

func (t *Keys) remove(r *Region) {
	t.mu.Lock()
	if t.m[r.key] == r {
		delete(t.m, r.key)
	}
	t.mu.Unlock()
	r.invalidate()
}

func (t *Keys) lookup(key uint32) *Region {
	t.mu.RLock()
	r := t.m[key]
	t.mu.RUnlock()
	return r
}

// Remote checks a remote access the way a verbs target does — key valid, protection
// domain, window binding, access rights, then bounds — and on success returns the
// region held for the access (Release it when done) and the bytes to move.
func (t *Keys) Remote(rkey uint32, pd *PD, qp any, addr uint64, length uint32, want rdma.AccessFlags) (*Region, []byte, rdma.WCStatus) {
	r := t.lookup(rkey)
	if r == nil || !r.acquire() {
		return nil, nil, rdma.WCRemAccessErr
	}
	if r.pd != pd || (r.owner != nil && r.owner != qp) || r.access&want != want {
		r.Release()
		return nil, nil, rdma.WCRemAccessErr
	}
	b, ok := r.slice(addr, length)
	if !ok {
		r.Release()
		return nil, nil, rdma.WCRemAccessErr
	}
	return r, b, rdma.WCSuccess
}

// Local resolves a local SGE of a work request posted in pd. write says whether the
// operation stores into the memory (a receive or the sink of an RDMA_READ), which
// requires LOCAL_WRITE. On success the region is held; Release it when done.
func (t *Keys) Local(sge rdma.SGE, pd *PD, write bool) (*Region, []byte, rdma.WCStatus) {
	r := t.lookup(sge.LKey)
	if r == nil || r.owner != nil || !r.acquire() {
		return nil, nil, rdma.WCLocProtErr
	}
	if r.pd != pd || (write && r.access&rdma.AccessLocalWrite == 0) {
		r.Release()
		return nil, nil, rdma.WCLocProtErr
	}
	b, ok := r.slice(sge.Addr, sge.Length)
	if !ok {
		r.Release()
		return nil, nil, rdma.WCLocProtErr
	}
	return r, b, rdma.WCSuccess
}
