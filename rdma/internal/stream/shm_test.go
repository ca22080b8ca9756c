package stream

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/rdma"
	"github.com/rdmafs/rdmafs/rdma/rdmatest"
)

var openShm = opener("shm", ModeShm)

// TestShmDirectAccess checks that once a key is granted, RDMA_READ and RDMA_WRITE
// no longer reach the target's engine, that they move the right bytes, and that
// invalidating the key stops them.
func TestShmDirectAccess(t *testing.T) {
	a, b := rdmatest.Pair(t, openShm, rdmatest.PairConfig{})
	qa, qb := a.QP.(*queuePair), b.QP.(*queuePair)
	mw, err := b.PD.AllocMW()
	if err != nil {
		t.Fatal(err)
	}
	defer mw.Close()
	rkey, err := b.QP.BindMW(mw, b.MR, b.Addr(8192), 65536, rdma.AccessRemoteRead|rdma.AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	read := func(id uint64, off, n int) rdma.WorkCompletion {
		a.PostSend(t, rdma.SendWR{ID: id, Opcode: rdma.OpRDMARead, Flags: rdma.SendSignaled, SGL: []rdma.SGE{a.SGE(0, n)}, RemoteAddr: b.Addr(off), RKey: rkey})
		return rdmatest.WaitWC(t, a.SCQ, 1)[0]
	}
	rdmatest.Expect(t, read(1, 8192, 64), 1, rdma.WCSuccess, rdma.WCRDMARead)
	// The target queues the GRANT before the read's response and the
	// initiator reads frames in order: the grant is in place once the read
	// has completed, nothing to wait for.
	qa.shm.mu.RLock()
	_, granted := qa.shm.grants[rkey]
	qa.shm.mu.RUnlock()
	if !granted {
		t.Fatal("no grant when the served read completed")
	}
	before := qb.progress.Load()
	for i := 0; i < 100; i++ {
		copy(a.Bytes()[4096:], bytes.Repeat([]byte{byte(i)}, 1000))
		a.PostSend(t, rdma.SendWR{ID: 2, Opcode: rdma.OpRDMAWrite, Flags: rdma.SendSignaled, SGL: []rdma.SGE{a.SGE(4096, 1000)}, RemoteAddr: b.Addr(8192 + i*100), RKey: rkey})
		rdmatest.Expect(t, rdmatest.WaitWC(t, a.SCQ, 1)[0], 2, rdma.WCSuccess, rdma.WCRDMAWrite)
		if !bytes.Equal(b.Bytes()[8192+i*100:8192+i*100+1000], a.Bytes()[4096:5096]) {
			t.Fatalf("write %d: bytes differ", i)
		}
		rdmatest.Expect(t, read(3, 8192+i*100, 1000), 3, rdma.WCSuccess, rdma.WCRDMARead)
		if !bytes.Equal(a.Bytes()[:1000], a.Bytes()[4096:5096]) {
			t.Fatalf("read %d: bytes differ", i)
		}
	}
	if after := qb.progress.Load(); after != before {
		t.Fatalf("the target's engine read %d times during direct accesses", after-before)
	}
	// Outside the window: refused locally, with the verbs status.
	rdmatest.Expect(t, read(4, 8192+65536-10, 64), 4, rdma.WCRemAccessErr, 0)
}

// TestShmRevokeWaitsForCopies invalidates a window while another goroutine copies
// 4 MiB at a time through it: Invalidate must not deadlock with the copies, and
// the first access after it fails with REM_ACCESS_ERR.
func TestShmRevokeWaitsForCopies(t *testing.T) {
	a, b := rdmatest.Pair(t, openShm, rdmatest.PairConfig{MemSize: 8 << 20})
	mw, _ := b.PD.AllocMW()
	defer mw.Close()
	rkey, err := b.QP.BindMW(mw, b.MR, b.Addr(0), 4<<20, rdma.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stopped := make(chan rdma.WCStatus, 1)
	direct := make(chan struct{}) // closed after the first read: the rest are direct copies
	go func() {
		wcs := make([]rdma.WorkCompletion, 1)
		for i := uint64(0); ; i++ {
			if i == 1 {
				close(direct)
			}
			if err := a.QP.PostSend([]rdma.SendWR{{ID: i, Opcode: rdma.OpRDMARead, Flags: rdma.SendSignaled, SGL: []rdma.SGE{a.SGE(0, 4<<20)}, RemoteAddr: b.Addr(0), RKey: rkey}}); err != nil {
				stopped <- rdma.WCGeneralErr
				return
			}
			for a.SCQ.Poll(wcs) == 0 {
				if err := a.SCQ.Wait(ctx); err != nil {
					stopped <- rdma.WCGeneralErr
					return
				}
			}
			if wcs[0].Status != rdma.WCSuccess {
				stopped <- wcs[0].Status
				return
			}
			if ctx.Err() != nil { // reads that never fail end here
				stopped <- rdma.WCSuccess
				return
			}
		}
	}()
	// Invalidate once the reads go through shared memory (the first one,
	// on the wire, brought the grant), while copies follow each other.
	select {
	case <-direct:
	case st := <-stopped:
		t.Fatalf("the first read ended with %v", st)
	}
	if err := b.QP.InvalidateMW(mw); err != nil {
		t.Fatal(err)
	}
	// The reader goroutine's next access after the revocation must fail.
	if st := <-stopped; st != rdma.WCRemAccessErr {
		t.Fatalf("reads after invalidation ended with %v, want REM_ACCESS_ERR", st)
	}
}
