// Package rdmatest is the conformance suite every rdma transport must pass, and the
// helpers to set up connected queue pairs in tests. A transport's test calls Run
// with a function that opens one of its devices.
package rdmatest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/rdma"
)

// OpenFunc opens a fresh device of the transport under test.
type OpenFunc func(t testing.TB) rdma.Device

// Options tune the suite for a transport.
type Options struct {
	// Blackhole, when set, returns an address that forwards to addr until cut is
	// called, after which it silently drops all traffic in both directions without
	// closing anything: a peer that vanished from the network. Transports that
	// cannot be interposed (shared memory) leave it nil and the case is skipped.
	Blackhole func(t testing.TB, addr string) (proxy string, cut func())
}

// End is one side of a connected pair: its protection domain, completion queues,
// queue pair and a registered memory region.
type End struct {
	Dev  rdma.Device
	PD   rdma.ProtectionDomain
	SCQ  rdma.CompletionQueue
	RCQ  rdma.CompletionQueue
	QP   rdma.QueuePair
	Mem  *rdma.Memory
	MR   rdma.MemoryRegion
	Priv []byte // private data received from the peer during connection setup
}

// PairConfig describes a pair to set up. Zero values pick sensible defaults.
type PairConfig struct {
	Attr      rdma.QPAttr      // queue pair attributes (the CQs are filled in)
	MemSize   int              // registered memory per end (default 1 MiB)
	Access    rdma.AccessFlags // access of each end's region (default all)
	ProxyAddr func(addr string) string
	Private   []byte // private data the initiator connects with
}

// Pair sets up two ends, each on its own device, connects them (A connects to B's
// listener) and registers everything for cleanup.
func Pair(t testing.TB, open OpenFunc, cfg PairConfig) (a, b *End) {
	t.Helper()
	if cfg.MemSize == 0 {
		cfg.MemSize = 1 << 20
	}
	if cfg.Access == 0 {
		cfg.Access = rdma.AccessLocalWrite | rdma.AccessRemoteRead | rdma.AccessRemoteWrite | rdma.AccessMWBind
	}
	a, b = NewEnd(t, open(t), cfg), NewEnd(t, open(t), cfg)
	Connect(t, a, b, cfg.Private, cfg.ProxyAddr)
	return a, b
}

// NewEnd creates the resources of one end on dev, without connecting it.
func NewEnd(t testing.TB, dev rdma.Device, cfg PairConfig) *End {
	t.Helper()
	if cfg.MemSize == 0 {
		cfg.MemSize = 1 << 20
	}
	if cfg.Access == 0 {
		cfg.Access = rdma.AccessLocalWrite | rdma.AccessRemoteRead | rdma.AccessRemoteWrite | rdma.AccessMWBind
	}
	e := &End{Dev: dev}
	var err error
	if e.PD, err = dev.AllocPD(); err != nil {
		t.Fatalf("alloc pd: %v", err)
	}
	if e.SCQ, err = dev.CreateCQ(1024); err != nil {
		t.Fatalf("create send cq: %v", err)
	}
	if e.RCQ, err = dev.CreateCQ(1024); err != nil {
		t.Fatalf("create recv cq: %v", err)
	}
	attr := cfg.Attr
	attr.SendCQ, attr.RecvCQ = e.SCQ, e.RCQ
	if e.QP, err = e.PD.CreateQP(attr); err != nil {
		t.Fatalf("create qp: %v", err)
	}
	if e.Mem, err = rdma.AllocMemory(t.Name(), cfg.MemSize); err != nil {
		t.Fatalf("alloc memory: %v", err)
	}
	if e.MR, err = e.PD.RegisterMemory(e.Mem, cfg.Access); err != nil {
		t.Fatalf("register memory: %v", err)
	}
	t.Cleanup(func() {
		e.QP.Close()
		e.MR.Deregister()
		if err := e.Mem.Free(); err != nil {
			t.Errorf("free memory: %v", err)
		}
		e.SCQ.Close()
		e.RCQ.Close()
		e.PD.Close()
		e.Dev.Close()
	})
	return e
}

// Connect connects a to b: b listens on 127.0.0.1, a connects with private data.
// proxy, when set, maps b's address to the one a dials.
func Connect(t testing.TB, a, b *End, private []byte, proxy func(string) string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ln, err := b.Dev.Listen(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	defer ln.Close()
	errc := make(chan error, 1)
	go func() {
		req, err := ln.Accept(ctx)
		if err != nil {
			errc <- err
			return
		}
		b.Priv = req.PrivateData()
		errc <- req.Accept(b.QP, []byte("accepted"))
	}()
	addr := ln.Addr()
	if proxy != nil {
		addr = proxy(addr)
	}
	a.Priv, err = a.Dev.Connect(ctx, a.QP, addr, private)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("accept: %v", err)
	}
}

// SGE returns an SGE for [off, off+n) of e's region.
func (e *End) SGE(off, n int) rdma.SGE {
	return rdma.SGE{Addr: e.MR.Addr() + uint64(off), Length: uint32(n), LKey: e.MR.LKey()}
}

// Addr returns the virtual address of offset off of e's region.
func (e *End) Addr(off int) uint64 { return e.MR.Addr() + uint64(off) }

// Bytes returns e's registered memory.
func (e *End) Bytes() []byte { return e.MR.Bytes() }

// PostSend posts wrs and fails the test on error.
func (e *End) PostSend(t testing.TB, wrs ...rdma.SendWR) {
	t.Helper()
	if err := e.QP.PostSend(wrs); err != nil {
		t.Fatalf("post send: %v", err)
	}
}

// PostRecv posts a receive of the given SGEs and fails the test on error.
func (e *End) PostRecv(t testing.TB, id uint64, sgl ...rdma.SGE) {
	t.Helper()
	if err := e.QP.PostRecv([]rdma.RecvWR{{ID: id, SGL: sgl}}); err != nil {
		t.Fatalf("post recv: %v", err)
	}
}

// WaitWC waits for n completions on cq (10 seconds at most) and returns them.
func WaitWC(t testing.TB, cq rdma.CompletionQueue, n int) []rdma.WorkCompletion {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	wcs := make([]rdma.WorkCompletion, 0, n)
	buf := make([]rdma.WorkCompletion, n)
	for len(wcs) < n {
		k := cq.Poll(buf[:n-len(wcs)])
		wcs = append(wcs, buf[:k]...)
		if len(wcs) == n {
			break
		}
		if err := cq.Wait(ctx); err != nil {
			t.Fatalf("waiting for %d completions, got %d: %v %v", n, len(wcs), err, wcs)
		}
	}
	return wcs
}

// NoWC checks that cq stays empty for a short while.
func NoWC(t testing.TB, cq rdma.CompletionQueue) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := cq.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		var wc [4]rdma.WorkCompletion
		n := cq.Poll(wc[:])
		t.Fatalf("unexpected completions: %v", wc[:n])
	}
}

// Expect checks a completion's id, status and opcode.
func Expect(t testing.TB, wc rdma.WorkCompletion, id uint64, st rdma.WCStatus, op rdma.WCOpcode) {
	t.Helper()
	if wc.ID != id || wc.Status != st || (st == rdma.WCSuccess && wc.Opcode != op) {
		t.Fatalf("completion %+v (status %v, opcode %v), want id %d status %v opcode %v", wc, wc.Status, wc.Opcode, id, st, op)
	}
}
