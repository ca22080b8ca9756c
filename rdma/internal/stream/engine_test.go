package stream

import (
	"bytes"
	"testing"

	"github.com/rdmafs/rdmafs/rdma"
	"github.com/rdmafs/rdmafs/rdma/rdmatest"
)

// opener returns what opens a device of the mode for the conformance helpers.
func opener(name string, mode Mode) rdmatest.OpenFunc {
	return func(t testing.TB) rdma.Device {
		d, err := Open(Options{Name: name, Mode: mode})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
}

// TestPostWhileSocketLocked posts work requests while another goroutine holds
// the socket lock, as a poster or the reader writing at the same moment does,
// and checks that they go out once that goroutine lets go of it the way every
// holder does (unlock, then tryFlush). Nothing else would write them: the
// connection is otherwise idle, so a post left behind never completes.
func TestPostWhileSocketLocked(t *testing.T) {
	a, b := rdmatest.Pair(t, opener("tcp", ModeTCP), rdmatest.PairConfig{})
	for i := range 4096 {
		b.Bytes()[i] = byte(i*7 + 3)
	}
	qa := a.QP.(*queuePair)
	for round := range 3 {
		qa.w.mu.Lock()
		var wrs []rdma.SendWR
		for i := range round + 1 {
			off := 512 * i
			wr := rdma.SendWR{ID: uint64(i), Opcode: rdma.OpRDMARead, Flags: rdma.SendSignaled, SGL: []rdma.SGE{a.SGE(off, 512)}, RemoteAddr: b.Addr(off), RKey: b.MR.RKey()}
			wrs = append(wrs, wr)
			a.PostSend(t, wr) // finds the lock taken
		}
		rdmatest.NoWC(t, a.SCQ)
		qa.w.mu.Unlock()
		qa.tryFlush()
		for i, wc := range rdmatest.WaitWC(t, a.SCQ, len(wrs)) {
			rdmatest.Expect(t, wc, uint64(i), rdma.WCSuccess, rdma.WCRDMARead)
		}
		if n := 512 * len(wrs); !bytes.Equal(a.Bytes()[:n], b.Bytes()[:n]) {
			t.Fatalf("round %d: the READs returned other bytes", round)
		}
		clear(a.Bytes()[:4096])
	}
}
