package soft

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/rdmafs/rdmafs/rdma"
)

// QPFactory creates a transport's queue pair in a protection domain.
type QPFactory func(pd *PD, attr rdma.QPAttr) (rdma.QueuePair, error)

// PD is a software protection domain.
type PD struct {
	Keys  *Keys
	newQP QPFactory
	live  atomic.Int64 // regions, windows and queue pairs not yet closed

	mu  sync.Mutex
	mrs []*MR // registered regions, in registration order
}

// Regions returns the domain's registered memory regions.
func (pd *PD) Regions() []*MR {
	pd.mu.Lock()
	defer pd.mu.Unlock()
	return append([]*MR(nil), pd.mrs...)
}

// NewPD returns a protection domain whose keys live in keys and whose queue pairs
// newQP creates.
func NewPD(keys *Keys, newQP QPFactory) *PD { return &PD{Keys: keys, newQP: newQP} }

// RegisterMemory implements rdma.ProtectionDomain.
func (pd *PD) RegisterMemory(mem *rdma.Memory, access rdma.AccessFlags) (rdma.MemoryRegion, error) {
	if access&rdma.AccessRemoteWrite != 0 && access&rdma.AccessLocalWrite == 0 {
		return nil, fmt.Errorf("register memory: REMOTE_WRITE requires LOCAL_WRITE: %w", rdma.ErrInvalidArgument)
	}
	if err := mem.Pin(); err != nil {
		return nil, fmt.Errorf("register memory: %w", err)
	}
	r := newRegion(pd, nil, mem, mem.Addr(), mem.Bytes(), access)
	pd.Keys.insert(r)
	pd.live.Add(1)
	mr := &MR{pd: pd, mem: mem, r: r}
	pd.mu.Lock()
	pd.mrs = append(pd.mrs, mr)
	pd.mu.Unlock()
	return mr, nil
}

// AllocMW implements rdma.ProtectionDomain.
func (pd *PD) AllocMW() (rdma.MemoryWindow, error) {
	pd.live.Add(1)
	return &MW{pd: pd}, nil
}

// CreateQP implements rdma.ProtectionDomain.
func (pd *PD) CreateQP(attr rdma.QPAttr) (rdma.QueuePair, error) {
	if attr.SendCQ == nil || attr.RecvCQ == nil {
		return nil, fmt.Errorf("create qp: send and receive completion queues are required: %w", rdma.ErrInvalidArgument)
	}
	if attr.MaxSGE > rdma.MaxSGELimit {
		return nil, fmt.Errorf("create qp: %d SGEs over the limit of %d: %w", attr.MaxSGE, rdma.MaxSGELimit, rdma.ErrInvalidArgument)
	}
	qp, err := pd.newQP(pd, attr.WithDefaults())
	if err != nil {
		return nil, err
	}
	pd.live.Add(1)
	return qp, nil
}

// Released is called by a transport when one of the domain's queue pairs is closed.
func (pd *PD) Released() { pd.live.Add(-1) }

// Close implements rdma.ProtectionDomain: like ibv_dealloc_pd it fails with EBUSY
// while objects of the domain are still open.
func (pd *PD) Close() error {
	if n := pd.live.Load(); n > 0 {
		return fmt.Errorf("dealloc pd: %d objects still open: %w", n, rdma.ErrBusy)
	}
	return nil
}

// MR is a software memory region.
type MR struct {
	pd      *PD
	mem     *rdma.Memory
	r       *Region
	windows atomic.Int64
	once    sync.Once
}

// Addr implements rdma.MemoryRegion.
func (m *MR) Addr() uint64 { return m.r.base }

// Len implements rdma.MemoryRegion.
func (m *MR) Len() int { return len(m.r.buf) }

// LKey implements rdma.MemoryRegion.
func (m *MR) LKey() uint32 { return m.r.key }

// RKey implements rdma.MemoryRegion.
func (m *MR) RKey() uint32 { return m.r.key }

// Access implements rdma.MemoryRegion.
func (m *MR) Access() rdma.AccessFlags { return m.r.access }

// Bytes implements rdma.MemoryRegion.
func (m *MR) Bytes() []byte { return m.r.buf }

// Memory returns the memory the region registers.
func (m *MR) Memory() *rdma.Memory { return m.mem }

// Deregister implements rdma.MemoryRegion.
func (m *MR) Deregister() error {
	if n := m.windows.Load(); n > 0 {
		return fmt.Errorf("dereg mr: %d memory windows bound: %w", n, rdma.ErrBusy)
	}
	m.once.Do(func() {
		m.pd.Keys.remove(m.r)
		m.mem.Unpin()
		m.pd.live.Add(-1)
		m.pd.mu.Lock()
		for i, x := range m.pd.mrs {
			if x == m {
				m.pd.mrs = append(m.pd.mrs[:i], m.pd.mrs[i+1:]...)
				break
			}
		}
		m.pd.mu.Unlock()
	})
	return nil
}

// MW is a software type 2 memory window.
type MW struct {
	pd     *PD
	mu     sync.Mutex
	bound  *Region
	mr     *MR
	closed bool
}

// RKey implements rdma.MemoryWindow.
func (w *MW) RKey() uint32 {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.bound == nil {
		return 0
	}
	return w.bound.key
}

// Bind binds the window to [addr, addr+length) of mr for access through qp only,
// revoking its previous binding, and returns the new rkey.
func (w *MW) Bind(qp any, mr rdma.MemoryRegion, addr, length uint64, access rdma.AccessFlags) (uint32, error) {
	m, ok := mr.(*MR)
	if !ok || m.pd != w.pd {
		return 0, fmt.Errorf("bind mw: region is not of the window's protection domain: %w", rdma.ErrInvalidArgument)
	}
	if m.r.access&rdma.AccessMWBind == 0 {
		return 0, fmt.Errorf("bind mw: region was not registered with MW_BIND: %w", rdma.ErrInvalidArgument)
	}
	if access&^(rdma.AccessRemoteRead|rdma.AccessRemoteWrite|rdma.AccessRemoteAtomic) != 0 {
		return 0, fmt.Errorf("bind mw: access %#x: only remote rights can be granted: %w", access, rdma.ErrInvalidArgument)
	}
	if access&rdma.AccessRemoteWrite != 0 && m.r.access&rdma.AccessLocalWrite == 0 {
		return 0, fmt.Errorf("bind mw: remote write needs a LOCAL_WRITE region: %w", rdma.ErrInvalidArgument)
	}
	if length > uint64(^uint32(0)) {
		return 0, fmt.Errorf("bind mw: length %d: %w", length, rdma.ErrInvalidArgument)
	}
	buf, ok := m.r.slice(addr, uint32(length))
	if !ok {
		return 0, fmt.Errorf("bind mw: [%#x, +%d) outside the region: %w", addr, length, rdma.ErrInvalidArgument)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return 0, fmt.Errorf("bind mw: %w", rdma.ErrClosed)
	}
	w.unbindLocked()
	r := newRegion(w.pd, qp, m.mem, addr, buf, access)
	w.pd.Keys.insert(r)
	w.bound, w.mr = r, m
	m.windows.Add(1)
	return r.key, nil
}

// Invalidate revokes the window's binding, waiting for accesses in progress.
func (w *MW) Invalidate() {
	w.mu.Lock()
	w.unbindLocked()
	w.mu.Unlock()
}

func (w *MW) unbindLocked() {
	if w.bound == nil {
		return
	}
	w.pd.Keys.remove(w.bound)
	w.mr.windows.Add(-1)
	w.bound, w.mr = nil, nil
}

// Close implements rdma.MemoryWindow.
func (w *MW) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil
	}
	w.unbindLocked()
	w.closed = true
	w.pd.live.Add(-1)
	return nil
}
