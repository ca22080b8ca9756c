package tcp_test

import (
	"context"
	"testing"

	"github.com/rdmafs/rdmafs/rdma"
	"github.com/rdmafs/rdmafs/rdma/rdmatest"
)

// TestNoAllocsPerRequest checks the steady-state path — post, serve on the target,
// complete, poll — allocates nothing, for each opcode and with batches.
func TestNoAllocsPerRequest(t *testing.T) {
	if testing.Short() {
		t.Skip("allocation counts are noisy in -short runs")
	}
	a, b := rdmatest.Pair(t, open, rdmatest.PairConfig{})
	ctx := context.Background()
	wcs := make([]rdma.WorkCompletion, 16)
	recvs := make([]rdma.RecvWR, 16)
	rsge := []rdma.SGE{b.SGE(0, 4096)}
	for i := range recvs {
		recvs[i] = rdma.RecvWR{ID: uint64(i), SGL: rsge}
	}
	for _, op := range []rdma.Opcode{rdma.OpRDMARead, rdma.OpRDMAWrite, rdma.OpSend} {
		for _, n := range []int{1, 16} {
			wrs := make([]rdma.SendWR, n)
			sges := make([]rdma.SGE, n)
			for i := range wrs {
				sges[i] = a.SGE(i*4096, 4096)
				wrs[i] = rdma.SendWR{ID: uint64(i), Opcode: op, Flags: rdma.SendSignaled, SGL: sges[i : i+1], RemoteAddr: b.Addr(i * 4096), RKey: b.MR.RKey()}
			}
			run := func() {
				if op == rdma.OpSend {
					if err := b.QP.PostRecv(recvs[:n]); err != nil {
						t.Fatal(err)
					}
				}
				if err := a.QP.PostSend(wrs); err != nil {
					t.Fatal(err)
				}
				for got := 0; got < n; {
					k := a.SCQ.Poll(wcs)
					for _, wc := range wcs[:k] {
						if wc.Status != rdma.WCSuccess {
							t.Fatalf("%v: %v", op, wc.Status)
						}
					}
					got += k
					if k == 0 {
						a.SCQ.Wait(ctx)
					}
				}
				if op == rdma.OpSend {
					for got := 0; got < n; {
						k := b.RCQ.Poll(wcs)
						got += k
						if k == 0 {
							b.RCQ.Wait(ctx)
						}
					}
				}
			}
			for i := 0; i < 100; i++ {
				run()
			}
			if allocs := testing.AllocsPerRun(500, run); allocs > 0.05 {
				t.Errorf("%v x%d: %.2f allocations per batch, want 0", op, n, allocs)
			}
		}
	}
}
