package rdmatest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/rdma"
)

// Run runs the conformance suite against the transport that open opens.
func Run(t *testing.T, open OpenFunc, opts Options) {
	cases := []struct {
		name string
		fn   func(t *testing.T, open OpenFunc, opts Options)
	}{
		{"Opcodes", testOpcodes},
		{"ScatterGather", testScatterGather},
		{"ZeroLength", testZeroLength},
		{"Ordering", testOrdering},
		{"Errors", testErrors},
		{"SendLongerThanReceive", testSendTooLong},
		{"ReceiverNotReady", testRNR},
		{"PeerClosed", testPeerClosed},
		{"PeerVanished", testPeerVanished},
		{"Deregistered", testDeregistered},
		{"MemoryWindows", testMemoryWindows},
		{"PostErrors", testPostErrors},
		{"Unsignaled", testUnsignaled},
		{"PrivateDataAndReject", testPrivateData},
		{"SharedCQ", testSharedCQ},
		{"Soak", testSoak},
		{"SoakFromAcceptor", testSoakFromAcceptor},
		{"ManyPairsBothWays", testManyPairs},
		{"ConcurrentPosters", testConcurrentPosters},
		{"LargeTransfers", testLargeTransfers},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { c.fn(t, open, opts) })
	}
}

func fill(b []byte, seed uint64) {
	r := rand.New(rand.NewPCG(seed, seed^0x5bd1e995))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
}

func testOpcodes(t *testing.T, open OpenFunc, _ Options) {
	a, b := Pair(t, open, PairConfig{})
	const n = 3000
	src := a.Bytes()[:n]
	fill(src, 1)

	t.Run("SEND", func(t *testing.T) {
		b.PostRecv(t, 10, b.SGE(0, 4096))
		a.PostSend(t, rdma.SendWR{ID: 1, Opcode: rdma.OpSend, Flags: rdma.SendSignaled, SGL: []rdma.SGE{a.SGE(0, n)}})
		Expect(t, WaitWC(t, a.SCQ, 1)[0], 1, rdma.WCSuccess, rdma.WCSend)
		wc := WaitWC(t, b.RCQ, 1)[0]
		Expect(t, wc, 10, rdma.WCSuccess, rdma.WCRecv)
		if wc.ByteLen != n || wc.Flags&rdma.WCWithImm != 0 {
			t.Fatalf("recv completion %+v, want byte_len %d without imm", wc, n)
		}
		if !bytes.Equal(b.Bytes()[:n], src) {
			t.Fatal("received bytes differ")
		}
	})
	t.Run("SEND_WITH_IMM", func(t *testing.T) {
		b.PostRecv(t, 11, b.SGE(8192, 4096))
		a.PostSend(t, rdma.SendWR{ID: 2, Opcode: rdma.OpSendWithImm, Flags: rdma.SendSignaled, Imm: 0xdeadbeef, SGL: []rdma.SGE{a.SGE(0, 100)}})
		Expect(t, WaitWC(t, a.SCQ, 1)[0], 2, rdma.WCSuccess, rdma.WCSend)
		wc := WaitWC(t, b.RCQ, 1)[0]
		Expect(t, wc, 11, rdma.WCSuccess, rdma.WCRecv)
		if wc.ByteLen != 100 || wc.Flags&rdma.WCWithImm == 0 || wc.Imm != 0xdeadbeef {
			t.Fatalf("recv completion %+v, want byte_len 100, imm 0xdeadbeef", wc)
		}
		if !bytes.Equal(b.Bytes()[8192:8292], src[:100]) {
			t.Fatal("received bytes differ")
		}
	})
	t.Run("RDMA_WRITE", func(t *testing.T) {
		a.PostSend(t, rdma.SendWR{ID: 3, Opcode: rdma.OpRDMAWrite, Flags: rdma.SendSignaled, SGL: []rdma.SGE{a.SGE(0, n)}, RemoteAddr: b.Addr(20000), RKey: b.MR.RKey()})
		Expect(t, WaitWC(t, a.SCQ, 1)[0], 3, rdma.WCSuccess, rdma.WCRDMAWrite)
		if !bytes.Equal(b.Bytes()[20000:20000+n], src) {
			t.Fatal("written bytes differ")
		}
		NoWC(t, b.RCQ)
	})
	t.Run("RDMA_WRITE_WITH_IMM", func(t *testing.T) {
		b.PostRecv(t, 12)
		a.PostSend(t, rdma.SendWR{ID: 4, Opcode: rdma.OpRDMAWriteWithImm, Flags: rdma.SendSignaled, Imm: 7, SGL: []rdma.SGE{a.SGE(0, n)}, RemoteAddr: b.Addr(40000), RKey: b.MR.RKey()})
		Expect(t, WaitWC(t, a.SCQ, 1)[0], 4, rdma.WCSuccess, rdma.WCRDMAWrite)
		wc := WaitWC(t, b.RCQ, 1)[0]
		Expect(t, wc, 12, rdma.WCSuccess, rdma.WCRecvRDMAWithImm)
		if wc.Imm != 7 || wc.Flags&rdma.WCWithImm == 0 || wc.ByteLen != n {
			t.Fatalf("completion %+v, want imm 7 and byte_len %d", wc, n)
		}
		if !bytes.Equal(b.Bytes()[40000:40000+n], src) {
			t.Fatal("written bytes differ")
		}
	})
	t.Run("RDMA_READ", func(t *testing.T) {
		fill(b.Bytes()[60000:60000+n], 2)
		a.PostSend(t, rdma.SendWR{ID: 5, Opcode: rdma.OpRDMARead, Flags: rdma.SendSignaled, SGL: []rdma.SGE{a.SGE(100000, n)}, RemoteAddr: b.Addr(60000), RKey: b.MR.RKey()})
		wc := WaitWC(t, a.SCQ, 1)[0]
		Expect(t, wc, 5, rdma.WCSuccess, rdma.WCRDMARead)
		if wc.ByteLen != n {
			t.Fatalf("read byte_len %d, want %d", wc.ByteLen, n)
		}
		if !bytes.Equal(a.Bytes()[100000:100000+n], b.Bytes()[60000:60000+n]) {
			t.Fatal("read bytes differ")
		}
	})
}

// testScatterGather moves data through SGE lists of every length up to the limit,
// with odd sizes and offsets, in every direction.
func testScatterGather(t *testing.T, open OpenFunc, _ Options) {
	a, b := Pair(t, open, PairConfig{MemSize: 4 << 20})
	max := rdma.DefaultMaxSGE
	r := rand.New(rand.NewPCG(3, 4))
	sgl := func(e *End, base, n int) ([]rdma.SGE, []int) {
		var sges []rdma.SGE
		var offs []int
		off := base
		for i := 0; i < n; i++ {
			off += 1 + r.IntN(13)
			l := 1 + r.IntN(7000)
			sges = append(sges, e.SGE(off, l))
			offs = append(offs, off)
			off += l
		}
		return sges, offs
	}
	gather := func(e *End, sges []rdma.SGE, offs []int) []byte {
		var out []byte
		for i, s := range sges {
			out = append(out, e.Bytes()[offs[i]:offs[i]+int(s.Length)]...)
		}
		return out
	}
	total := func(sges []rdma.SGE) int {
		n := 0
		for _, s := range sges {
			n += int(s.Length)
		}
		return n
	}
	for n := 1; n <= max; n++ {
		fill(a.Bytes(), uint64(n))
		fill(b.Bytes(), uint64(1000+n))
		// SEND: gather n on A, scatter into n on B.
		src, srcOff := sgl(a, 0, n)
		want := gather(a, src, srcOff)
		dst, dstOff := sgl(b, 0, n)
		for total(dst) < len(want) {
			dst, dstOff = sgl(b, 0, n)
		}
		b.QP.PostRecv([]rdma.RecvWR{{ID: uint64(n), SGL: dst}})
		a.PostSend(t, rdma.SendWR{ID: uint64(n), Opcode: rdma.OpSend, Flags: rdma.SendSignaled, SGL: src})
		Expect(t, WaitWC(t, a.SCQ, 1)[0], uint64(n), rdma.WCSuccess, rdma.WCSend)
		wc := WaitWC(t, b.RCQ, 1)[0]
		Expect(t, wc, uint64(n), rdma.WCSuccess, rdma.WCRecv)
		if got := gather(b, dst, dstOff)[:len(want)]; int(wc.ByteLen) != len(want) || !bytes.Equal(got, want) {
			t.Fatalf("SEND with %d SGEs: received bytes differ (byte_len %d, want %d)", n, wc.ByteLen, len(want))
		}
		// RDMA_WRITE: gather n on A into one remote range of B.
		src, srcOff = sgl(a, 1<<20, n)
		want = gather(a, src, srcOff)
		a.PostSend(t, rdma.SendWR{ID: 100 + uint64(n), Opcode: rdma.OpRDMAWrite, Flags: rdma.SendSignaled, SGL: src, RemoteAddr: b.Addr(2<<20 + n), RKey: b.MR.RKey()})
		Expect(t, WaitWC(t, a.SCQ, 1)[0], 100+uint64(n), rdma.WCSuccess, rdma.WCRDMAWrite)
		if !bytes.Equal(b.Bytes()[2<<20+n:2<<20+n+len(want)], want) {
			t.Fatalf("RDMA_WRITE with %d SGEs: bytes differ", n)
		}
		// RDMA_READ: one remote range of B scattered into n on A.
		dst, dstOff = sgl(a, 2<<20, n)
		l := total(dst)
		a.PostSend(t, rdma.SendWR{ID: 200 + uint64(n), Opcode: rdma.OpRDMARead, Flags: rdma.SendSignaled, SGL: dst, RemoteAddr: b.Addr(3<<20 + 7*n), RKey: b.MR.RKey()})
		Expect(t, WaitWC(t, a.SCQ, 1)[0], 200+uint64(n), rdma.WCSuccess, rdma.WCRDMARead)
		if !bytes.Equal(gather(a, dst, dstOff), b.Bytes()[3<<20+7*n:3<<20+7*n+l]) {
			t.Fatalf("RDMA_READ with %d SGEs: bytes differ", n)
		}
	}
	// More SGEs than the queue pair allows is refused at post time.
	src, _ := sgl(a, 0, max+1)
	if err := a.QP.PostSend([]rdma.SendWR{{Opcode: rdma.OpSend, SGL: src}}); !errors.Is(err, rdma.ErrInvalidWR) {
		t.Fatalf("post with %d SGEs: %v, want ErrInvalidWR", max+1, err)
	}
}

func testZeroLength(t *testing.T, open OpenFunc, _ Options) {
	a, b := Pair(t, open, PairConfig{})
	b.PostRecv(t, 1)
	a.PostSend(t,
		rdma.SendWR{ID: 1, Opcode: rdma.OpSend, Flags: rdma.SendSignaled},
		// Zero-length RDMA operations do not validate the rkey (IB spec 9.4.1).
		rdma.SendWR{ID: 2, Opcode: rdma.OpRDMAWrite, Flags: rdma.SendSignaled, RKey: 0x1234},
		rdma.SendWR{ID: 3, Opcode: rdma.OpRDMARead, Flags: rdma.SendSignaled, RKey: 0x1234},
		rdma.SendWR{ID: 4, Opcode: rdma.OpSend, Flags: rdma.SendSignaled, SGL: []rdma.SGE{a.SGE(0, 0)}},
	)
	wcs := WaitWC(t, a.SCQ, 4)
	ops := []rdma.WCOpcode{rdma.WCSend, rdma.WCRDMAWrite, rdma.WCRDMARead}
	for i, op := range ops {
		Expect(t, wcs[i], uint64(i+1), rdma.WCSuccess, op)
	}
	// The second zero-length SEND had no receive: it must wait for one.
	Expect(t, WaitWC(t, b.RCQ, 1)[0], 1, rdma.WCSuccess, rdma.WCRecv)
	Expect(t, wcs[3], 4, rdma.WCRNRRetryExcErr, 0)
}

// testOrdering checks RC ordering: requests take effect at the target in the order
// posted, and complete in that order.
func testOrdering(t *testing.T, open OpenFunc, _ Options) {
	a, b := Pair(t, open, PairConfig{MemSize: 1 << 20, Attr: rdma.QPAttr{MaxSendWR: 256, MaxRecvWR: 256}})
	// A WRITE followed by a SEND: when the receive completes, the write is visible.
	for round := 0; round < 50; round++ {
		off := (round % 8) * 65536
		fill(a.Bytes()[off:off+65536], uint64(round))
		b.PostRecv(t, uint64(round), b.SGE(900000, 64))
		a.PostSend(t,
			rdma.SendWR{ID: 1, Opcode: rdma.OpRDMAWrite, SGL: []rdma.SGE{a.SGE(off, 65536)}, RemoteAddr: b.Addr(off), RKey: b.MR.RKey()},
			rdma.SendWR{ID: 2, Opcode: rdma.OpSend, Flags: rdma.SendSignaled, SGL: []rdma.SGE{a.SGE(off, 64)}},
		)
		WaitWC(t, b.RCQ, 1)
		if !bytes.Equal(b.Bytes()[off:off+65536], a.Bytes()[off:off+65536]) {
			t.Fatalf("round %d: WRITE not visible when the following SEND arrived", round)
		}
		WaitWC(t, a.SCQ, 1)
	}
	// WRITEs and READs of the same range: each READ sees the WRITE before it.
	var wrs []rdma.SendWR
	for i := 0; i < 100; i++ {
		a.Bytes()[i] = byte(i + 1)
		wrs = append(wrs,
			// A WRITE after a READ needs a fence to be ordered after it (IB spec
			// o10-3.2): without one the READ may see a later WRITE.
			rdma.SendWR{ID: uint64(2 * i), Opcode: rdma.OpRDMAWrite, Flags: rdma.SendSignaled | rdma.SendFence, SGL: []rdma.SGE{a.SGE(i, 1)}, RemoteAddr: b.Addr(1000), RKey: b.MR.RKey()},
			rdma.SendWR{ID: uint64(2*i + 1), Opcode: rdma.OpRDMARead, Flags: rdma.SendSignaled, SGL: []rdma.SGE{a.SGE(2000+i, 1)}, RemoteAddr: b.Addr(1000), RKey: b.MR.RKey()},
		)
	}
	a.PostSend(t, wrs...)
	wcs := WaitWC(t, a.SCQ, len(wrs))
	for i, wc := range wcs {
		if wc.ID != uint64(i) || wc.Status != rdma.WCSuccess {
			t.Fatalf("completion %d: %+v, want id %d in order, success", i, wc, i)
		}
	}
	for i := 0; i < 100; i++ {
		if got := a.Bytes()[2000+i]; got != byte(i+1) {
			t.Fatalf("READ %d saw %d, want the preceding WRITE's %d", i, got, i+1)
		}
	}
}

// testErrors covers remote access violations: each completes the initiator's
// request with the verbs status, moves the queue pair to ERR, flushes what was
// posted behind it, and never touches memory outside the region.
func testErrors(t *testing.T, open OpenFunc, _ Options) {
	cases := []struct {
		name   string
		op     rdma.Opcode
		access rdma.AccessFlags // of B's region
		length int
		rkey   func(b *End, other rdma.MemoryRegion) uint32
		addr   func(b *End) uint64
		status rdma.WCStatus
	}{
		{"WriteBadRKey", rdma.OpRDMAWrite, 0, 64, func(b *End, _ rdma.MemoryRegion) uint32 { return b.MR.RKey() ^ 0x5a5a }, nil, rdma.WCRemAccessErr},
		{"ReadBadRKey", rdma.OpRDMARead, 0, 64, func(b *End, _ rdma.MemoryRegion) uint32 { return b.MR.RKey() + 1 }, nil, rdma.WCRemAccessErr},
		{"WriteNoRemoteWrite", rdma.OpRDMAWrite, rdma.AccessLocalWrite | rdma.AccessRemoteRead, 64, nil, nil, rdma.WCRemAccessErr},
		{"ReadNoRemoteRead", rdma.OpRDMARead, rdma.AccessLocalWrite | rdma.AccessRemoteWrite, 64, nil, nil, rdma.WCRemAccessErr},
		{"WritePastEnd", rdma.OpRDMAWrite, 0, 64, nil, func(b *End) uint64 { return b.Addr(b.MR.Len() - 32) }, rdma.WCRemAccessErr},
		{"ReadPastEnd", rdma.OpRDMARead, 0, 64, nil, func(b *End) uint64 { return b.Addr(b.MR.Len() - 1) }, rdma.WCRemAccessErr},
		{"WriteBeforeStart", rdma.OpRDMAWrite, 0, 64, nil, func(b *End) uint64 { return b.Addr(0) - 16 }, rdma.WCRemAccessErr},
		{"WriteAddressOverflow", rdma.OpRDMAWrite, 0, 64, nil, func(*End) uint64 { return ^uint64(0) - 8 }, rdma.WCRemAccessErr},
		{"ReadHugeLength", rdma.OpRDMARead, 0, 2 << 20, nil, nil, rdma.WCLocProtErr},
		{"WriteOtherPD", rdma.OpRDMAWrite, 0, 64, func(_ *End, other rdma.MemoryRegion) uint32 { return other.RKey() }, nil, rdma.WCRemAccessErr},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			access := c.access
			a, b := Pair(t, open, PairConfig{Access: access})
			if c.access != 0 {
				// A's own region needs local write for READ sinks.
				a2, err := a.PD.RegisterMemory(a.Mem, rdma.AccessLocalWrite)
				if err != nil {
					t.Fatal(err)
				}
				defer a2.Deregister()
				a.MR.Deregister()
				a.MR = a2
			}
			// A region in another protection domain of B's device.
			pd2, err := b.Dev.AllocPD()
			if err != nil {
				t.Fatal(err)
			}
			mem2, err := rdma.AllocMemory("other", 4096)
			if err != nil {
				t.Fatal(err)
			}
			other, err := pd2.RegisterMemory(mem2, rdma.AccessLocalWrite|rdma.AccessRemoteWrite|rdma.AccessRemoteRead)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { other.Deregister(); mem2.Free(); pd2.Close() }()
			fill(b.Bytes(), 9)
			before := append([]byte(nil), b.Bytes()...)
			otherBefore := append([]byte(nil), mem2.Bytes()...)
			rkey := b.MR.RKey()
			if c.rkey != nil {
				rkey = c.rkey(b, other)
			}
			addr := b.Addr(128)
			if c.addr != nil {
				addr = c.addr(b)
			}
			fill(a.Bytes(), 10)
			a.PostSend(t,
				rdma.SendWR{ID: 1, Opcode: rdma.OpRDMAWrite, Flags: rdma.SendSignaled, SGL: []rdma.SGE{a.SGE(0, 8)}, RemoteAddr: b.Addr(0), RKey: b.MR.RKey()},
			)
			if c.access == 0 || c.access&rdma.AccessRemoteWrite != 0 {
				Expect(t, WaitWC(t, a.SCQ, 1)[0], 1, rdma.WCSuccess, rdma.WCRDMAWrite)
				copy(before, a.Bytes()[:8])
			} else {
				// The warm-up write itself is refused.
				Expect(t, WaitWC(t, a.SCQ, 1)[0], 1, rdma.WCRemAccessErr, 0)
				if st := a.QP.State(); st != rdma.QPStateErr {
					t.Fatalf("queue pair in %v after an access error, want ERR", st)
				}
				if !bytes.Equal(b.Bytes(), before) {
					t.Fatal("target memory changed by a refused write")
				}
				return
			}
			a.PostSend(t,
				rdma.SendWR{ID: 2, Opcode: c.op, Flags: rdma.SendSignaled, SGL: []rdma.SGE{a.SGE(4096, c.length)}, RemoteAddr: addr, RKey: rkey},
				rdma.SendWR{ID: 3, Opcode: rdma.OpRDMAWrite, Flags: rdma.SendSignaled, SGL: []rdma.SGE{a.SGE(0, 8)}, RemoteAddr: b.Addr(0), RKey: b.MR.RKey()},
				rdma.SendWR{ID: 4, Opcode: rdma.OpSend, SGL: []rdma.SGE{a.SGE(0, 8)}},
			)
			wcs := WaitWC(t, a.SCQ, 3)
			Expect(t, wcs[0], 2, c.status, 0)
			Expect(t, wcs[1], 3, rdma.WCWRFlushErr, 0)
			Expect(t, wcs[2], 4, rdma.WCWRFlushErr, 0)
			if st := a.QP.State(); st != rdma.QPStateErr {
				t.Fatalf("queue pair in %v after %v, want ERR", st, c.status)
			}
			if !bytes.Equal(b.Bytes(), before) || !bytes.Equal(mem2.Bytes(), otherBefore) {
				t.Fatal("target memory changed by a refused request")
			}
			// Posting on a queue pair in ERR completes with WR_FLUSH_ERR.
			a.PostSend(t, rdma.SendWR{ID: 5, Opcode: rdma.OpRDMAWrite, SGL: []rdma.SGE{a.SGE(0, 8)}, RemoteAddr: b.Addr(0), RKey: b.MR.RKey()})
			Expect(t, WaitWC(t, a.SCQ, 1)[0], 5, rdma.WCWRFlushErr, 0)
		})
	}
}

func testSendTooLong(t *testing.T, open OpenFunc, _ Options) {
	a, b := Pair(t, open, PairConfig{})
	b.PostRecv(t, 1, b.SGE(0, 100))
	b.PostRecv(t, 2, b.SGE(100, 100))
	a.PostSend(t, rdma.SendWR{ID: 1, Opcode: rdma.OpSend, Flags: rdma.SendSignaled, SGL: []rdma.SGE{a.SGE(0, 101)}})
	Expect(t, WaitWC(t, a.SCQ, 1)[0], 1, rdma.WCRemInvReqErr, 0)
	wcs := WaitWC(t, b.RCQ, 2)
	Expect(t, wcs[0], 1, rdma.WCLocLenErr, 0)
	Expect(t, wcs[1], 2, rdma.WCWRFlushErr, 0)
}

func testRNR(t *testing.T, open OpenFunc, _ Options) {
	a, b := Pair(t, open, PairConfig{Attr: rdma.QPAttr{RNRTimeout: 100 * time.Millisecond}})
	// A receive posted while the SEND waits satisfies it.
	a.PostSend(t, rdma.SendWR{ID: 1, Opcode: rdma.OpSend, Flags: rdma.SendSignaled, SGL: []rdma.SGE{a.SGE(0, 10)}})
	time.Sleep(20 * time.Millisecond)
	b.PostRecv(t, 1, b.SGE(0, 10))
	Expect(t, WaitWC(t, a.SCQ, 1)[0], 1, rdma.WCSuccess, rdma.WCSend)
	WaitWC(t, b.RCQ, 1)
	// None posted: the sender gives up with RNR_RETRY_EXC_ERR.
	start := time.Now()
	a.PostSend(t, rdma.SendWR{ID: 2, Opcode: rdma.OpSend, Flags: rdma.SendSignaled, SGL: []rdma.SGE{a.SGE(0, 10)}})
	Expect(t, WaitWC(t, a.SCQ, 1)[0], 2, rdma.WCRNRRetryExcErr, 0)
	if d := time.Since(start); d < 50*time.Millisecond {
		t.Fatalf("RNR error after %v: the SEND did not wait for a receive", d)
	}
}

func testPeerClosed(t *testing.T, open OpenFunc, _ Options) {
	a, b := Pair(t, open, PairConfig{})
	a.PostRecv(t, 7, a.SGE(0, 10))
	b.QP.Close()
	select {
	case <-a.QP.Disconnected():
	case <-time.After(5 * time.Second):
		t.Fatal("peer's close not noticed")
	}
	Expect(t, WaitWC(t, a.RCQ, 1)[0], 7, rdma.WCWRFlushErr, 0)
	a.PostSend(t, rdma.SendWR{ID: 8, Opcode: rdma.OpSend, SGL: []rdma.SGE{a.SGE(0, 10)}})
	Expect(t, WaitWC(t, a.SCQ, 1)[0], 8, rdma.WCWRFlushErr, 0)
	// A destroyed queue pair refuses work with an error, never a crash.
	b.QP.Close()
	if err := b.QP.PostRecv([]rdma.RecvWR{{ID: 9, SGL: []rdma.SGE{b.SGE(0, 10)}}}); err == nil {
		t.Fatal("post recv on a destroyed queue pair succeeded")
	}
	if err := b.QP.PostSend([]rdma.SendWR{{ID: 10, Opcode: rdma.OpSend}}); err == nil {
		t.Fatal("post send on a destroyed queue pair succeeded")
	}
}

func testPeerVanished(t *testing.T, open OpenFunc, opts Options) {
	if opts.Blackhole == nil {
		t.Skip("transport cannot be cut off from its peer")
	}
	var cut func()
	a, b := Pair(t, open, PairConfig{
		Attr:      rdma.QPAttr{RetryTimeout: 300 * time.Millisecond},
		ProxyAddr: func(addr string) string { p, c := opts.Blackhole(t, addr); cut = c; return p },
	})
	a.PostSend(t, rdma.SendWR{ID: 1, Opcode: rdma.OpRDMAWrite, Flags: rdma.SendSignaled, SGL: []rdma.SGE{a.SGE(0, 8)}, RemoteAddr: b.Addr(0), RKey: b.MR.RKey()})
	Expect(t, WaitWC(t, a.SCQ, 1)[0], 1, rdma.WCSuccess, rdma.WCRDMAWrite)
	cut()
	start := time.Now()
	a.PostSend(t,
		rdma.SendWR{ID: 2, Opcode: rdma.OpRDMARead, Flags: rdma.SendSignaled, SGL: []rdma.SGE{a.SGE(0, 8)}, RemoteAddr: b.Addr(0), RKey: b.MR.RKey()},
		rdma.SendWR{ID: 3, Opcode: rdma.OpRDMAWrite, Flags: rdma.SendSignaled, SGL: []rdma.SGE{a.SGE(0, 8)}, RemoteAddr: b.Addr(0), RKey: b.MR.RKey()},
	)
	wcs := WaitWC(t, a.SCQ, 2)
	Expect(t, wcs[0], 2, rdma.WCRetryExcErr, 0)
	Expect(t, wcs[1], 3, rdma.WCWRFlushErr, 0)
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("vanished peer noticed after %v", d)
	}
}

func testDeregistered(t *testing.T, open OpenFunc, _ Options) {
	a, b := Pair(t, open, PairConfig{})
	rkey := b.MR.RKey()
	a.PostSend(t, rdma.SendWR{ID: 1, Opcode: rdma.OpRDMARead, Flags: rdma.SendSignaled, SGL: []rdma.SGE{a.SGE(0, 64)}, RemoteAddr: b.Addr(0), RKey: rkey})
	Expect(t, WaitWC(t, a.SCQ, 1)[0], 1, rdma.WCSuccess, rdma.WCRDMARead)
	if err := b.MR.Deregister(); err != nil {
		t.Fatal(err)
	}
	a.PostSend(t, rdma.SendWR{ID: 2, Opcode: rdma.OpRDMARead, Flags: rdma.SendSignaled, SGL: []rdma.SGE{a.SGE(0, 64)}, RemoteAddr: b.Addr(0), RKey: rkey})
	Expect(t, WaitWC(t, a.SCQ, 1)[0], 2, rdma.WCRemAccessErr, 0)
	// Freeing registered memory is refused; after deregistration it works.
	mem, _ := rdma.AllocMemory("x", 4096)
	mr, err := a.PD.RegisterMemory(mem, rdma.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	if err := mem.Free(); !errors.Is(err, rdma.ErrMemoryRegistered) {
		t.Fatalf("free of registered memory: %v, want ErrMemoryRegistered", err)
	}
	mr.Deregister()
	if err := mem.Free(); err != nil {
		t.Fatal(err)
	}
	// A local SGE naming a deregistered region fails with LOC_PROT_ERR.
	a2, b2 := Pair(t, open, PairConfig{})
	lkey := a2.MR.LKey()
	a2.MR.Deregister()
	a2.PostSend(t, rdma.SendWR{ID: 3, Opcode: rdma.OpRDMAWrite, Flags: rdma.SendSignaled, SGL: []rdma.SGE{{Addr: a2.Addr(0), Length: 8, LKey: lkey}}, RemoteAddr: b2.Addr(0), RKey: b2.MR.RKey()})
	Expect(t, WaitWC(t, a2.SCQ, 1)[0], 3, rdma.WCLocProtErr, 0)
}

func testMemoryWindows(t *testing.T, open OpenFunc, _ Options) {
	a, b := Pair(t, open, PairConfig{})
	c, d := Pair(t, open, PairConfig{}) // an unrelated connection
	_ = d
	mw, err := b.PD.AllocMW()
	if err != nil {
		t.Fatal(err)
	}
	defer mw.Close()
	fill(b.Bytes()[:8192], 11)
	rkey, err := b.QP.BindMW(mw, b.MR, b.Addr(4096), 4096, rdma.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	if rkey == 0 || rkey == b.MR.RKey() || mw.RKey() != rkey {
		t.Fatalf("window rkey %#x (region %#x, window reports %#x)", rkey, b.MR.RKey(), mw.RKey())
	}
	read := func(id uint64, addr uint64, n int) rdma.WorkCompletion {
		a.PostSend(t, rdma.SendWR{ID: id, Opcode: rdma.OpRDMARead, Flags: rdma.SendSignaled, SGL: []rdma.SGE{a.SGE(0, n)}, RemoteAddr: addr, RKey: rkey})
		return WaitWC(t, a.SCQ, 1)[0]
	}
	Expect(t, read(1, b.Addr(4096), 4096), 1, rdma.WCSuccess, rdma.WCRDMARead)
	if !bytes.Equal(a.Bytes()[:4096], b.Bytes()[4096:8192]) {
		t.Fatal("read through window: bytes differ")
	}
	// Rebinding revokes the old key.
	old := rkey
	if rkey, err = b.QP.BindMW(mw, b.MR, b.Addr(0), 100, rdma.AccessRemoteRead|rdma.AccessRemoteWrite); err != nil {
		t.Fatal(err)
	}
	if rkey == old {
		t.Fatal("rebinding kept the key")
	}
	Expect(t, read(2, b.Addr(0), 100), 2, rdma.WCSuccess, rdma.WCRDMARead)
	// Outside the window, though inside the region.
	Expect(t, read(3, b.Addr(50), 100), 3, rdma.WCRemAccessErr, 0)

	// A second pair for the remaining checks, since errors end a connection.
	a, b = Pair(t, open, PairConfig{})
	mw2, _ := b.PD.AllocMW()
	defer mw2.Close()
	rkey, err = b.QP.BindMW(mw2, b.MR, b.Addr(0), 4096, rdma.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	// A read-only window refuses writes.
	a.PostSend(t, rdma.SendWR{ID: 4, Opcode: rdma.OpRDMAWrite, Flags: rdma.SendSignaled, SGL: []rdma.SGE{a.SGE(0, 8)}, RemoteAddr: b.Addr(0), RKey: rkey})
	Expect(t, WaitWC(t, a.SCQ, 1)[0], 4, rdma.WCRemAccessErr, 0)

	// Invalidated: a read that worked fails.
	a, b = Pair(t, open, PairConfig{})
	mw3, _ := b.PD.AllocMW()
	defer mw3.Close()
	if rkey, err = b.QP.BindMW(mw3, b.MR, b.Addr(0), 4096, rdma.AccessRemoteRead); err != nil {
		t.Fatal(err)
	}
	Expect(t, read(5, b.Addr(0), 64), 5, rdma.WCSuccess, rdma.WCRDMARead)
	if err := b.MR.Deregister(); !errors.Is(err, rdma.ErrBusy) {
		t.Fatalf("deregister with a bound window: %v, want ErrBusy", err)
	}
	if err := b.QP.InvalidateMW(mw3); err != nil {
		t.Fatal(err)
	}
	Expect(t, read(6, b.Addr(0), 64), 6, rdma.WCRemAccessErr, 0)

	// A window of one protection domain cannot be bound to a region of another.
	mw4, _ := c.PD.AllocMW()
	defer mw4.Close()
	if _, err := d.QP.BindMW(mw4, d.MR, d.Addr(0), 64, rdma.AccessRemoteRead); err == nil {
		t.Fatal("binding a window to a region of another protection domain succeeded")
	}

	// A window is usable only through the queue pair that bound it: two
	// connections into the same protection domain, the window bound on the first.
	devB := open(t)
	a1, b1 := NewEnd(t, open(t), PairConfig{}), NewEnd(t, devB, PairConfig{})
	Connect(t, a1, b1, nil, nil)
	a2, b2 := NewEnd(t, open(t), PairConfig{}), NewEnd(t, devB, PairConfig{})
	b2.QP.Close()
	if b2.QP, err = b1.PD.CreateQP(rdma.QPAttr{SendCQ: b2.SCQ, RecvCQ: b2.RCQ}); err != nil {
		t.Fatal(err)
	}
	Connect(t, a2, b2, nil, nil)
	mw5, _ := b1.PD.AllocMW()
	defer mw5.Close()
	rkey5, err := b1.QP.BindMW(mw5, b1.MR, b1.Addr(0), 64, rdma.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	a1.PostSend(t, rdma.SendWR{ID: 7, Opcode: rdma.OpRDMARead, Flags: rdma.SendSignaled, SGL: []rdma.SGE{a1.SGE(0, 64)}, RemoteAddr: b1.Addr(0), RKey: rkey5})
	Expect(t, WaitWC(t, a1.SCQ, 1)[0], 7, rdma.WCSuccess, rdma.WCRDMARead)
	a2.PostSend(t, rdma.SendWR{ID: 8, Opcode: rdma.OpRDMARead, Flags: rdma.SendSignaled, SGL: []rdma.SGE{a2.SGE(0, 64)}, RemoteAddr: b1.Addr(0), RKey: rkey5})
	Expect(t, WaitWC(t, a2.SCQ, 1)[0], 8, rdma.WCRemAccessErr, 0)
	b1.QP.InvalidateMW(mw5)
}

func testPostErrors(t *testing.T, open OpenFunc, _ Options) {
	dev := open(t)
	e := NewEnd(t, dev, PairConfig{Attr: rdma.QPAttr{MaxSendWR: 4, MaxRecvWR: 4}})
	if err := e.QP.PostSend([]rdma.SendWR{{Opcode: rdma.OpSend}}); !errors.Is(err, rdma.ErrInvalidState) {
		t.Fatalf("post send before connecting: %v, want ErrInvalidState", err)
	}
	recvs := make([]rdma.RecvWR, 5)
	if err := e.QP.PostRecv(recvs); !errors.Is(err, rdma.ErrQueueFull) {
		t.Fatalf("posting 5 receives on a queue of 4: %v, want ErrQueueFull", err)
	}
	a, b := Pair(t, open, PairConfig{Attr: rdma.QPAttr{MaxSendWR: 4}})
	if err := a.QP.PostSend([]rdma.SendWR{{Opcode: rdma.Opcode(99)}}); !errors.Is(err, rdma.ErrInvalidWR) {
		t.Fatalf("post with a bad opcode: %v, want ErrInvalidWR", err)
	}
	wrs := make([]rdma.SendWR, 5)
	for i := range wrs {
		wrs[i] = rdma.SendWR{ID: uint64(i), Opcode: rdma.OpRDMAWrite, SGL: []rdma.SGE{a.SGE(0, 8)}, RemoteAddr: b.Addr(0), RKey: b.MR.RKey()}
	}
	if err := a.QP.PostSend(wrs); !errors.Is(err, rdma.ErrQueueFull) {
		t.Fatalf("posting 5 sends on a queue of 4: %v, want ErrQueueFull", err)
	}
	if err := a.QP.PostSend(wrs[:4]); err != nil {
		t.Fatalf("posting 4 sends on a queue of 4: %v", err)
	}
	if _, err := a.Dev.Connect(context.Background(), a.QP, "127.0.0.1:1", nil); !errors.Is(err, rdma.ErrInvalidState) {
		t.Fatalf("connecting a connected queue pair: %v, want ErrInvalidState", err)
	}
	if _, err := e.Dev.Connect(context.Background(), e.QP, "127.0.0.1:1", make([]byte, rdma.MaxConnectPrivateData+1)); !errors.Is(err, rdma.ErrInvalidArgument) {
		t.Fatalf("connect with too much private data: %v, want ErrInvalidArgument", err)
	}
}

func testUnsignaled(t *testing.T, open OpenFunc, _ Options) {
	a, b := Pair(t, open, PairConfig{})
	var wrs []rdma.SendWR
	for i := 0; i < 10; i++ {
		wr := rdma.SendWR{ID: uint64(i), Opcode: rdma.OpRDMAWrite, SGL: []rdma.SGE{a.SGE(i, 1)}, RemoteAddr: b.Addr(i), RKey: b.MR.RKey()}
		if i == 9 {
			wr.Flags = rdma.SendSignaled
		}
		wrs = append(wrs, wr)
	}
	a.PostSend(t, wrs...)
	Expect(t, WaitWC(t, a.SCQ, 1)[0], 9, rdma.WCSuccess, rdma.WCRDMAWrite)
	NoWC(t, a.SCQ)
	// An unsignaled request that fails still completes.
	a.PostSend(t, rdma.SendWR{ID: 20, Opcode: rdma.OpRDMAWrite, SGL: []rdma.SGE{a.SGE(0, 1)}, RemoteAddr: b.Addr(0), RKey: 1})
	Expect(t, WaitWC(t, a.SCQ, 1)[0], 20, rdma.WCRemAccessErr, 0)

	// SignalAll: every request completes.
	c, d := Pair(t, open, PairConfig{Attr: rdma.QPAttr{SignalAll: true}})
	c.PostSend(t, rdma.SendWR{ID: 1, Opcode: rdma.OpRDMAWrite, SGL: []rdma.SGE{c.SGE(0, 1)}, RemoteAddr: d.Addr(0), RKey: d.MR.RKey()})
	Expect(t, WaitWC(t, c.SCQ, 1)[0], 1, rdma.WCSuccess, rdma.WCRDMAWrite)
}

func testPrivateData(t *testing.T, open OpenFunc, _ Options) {
	a, b := Pair(t, open, PairConfig{Private: []byte("hello from a")})
	if string(b.Priv) != "hello from a" || string(a.Priv) != "accepted" {
		t.Fatalf("private data: b got %q, a got %q", b.Priv, a.Priv)
	}
	// Rejection carries private data back.
	x := NewEnd(t, open(t), PairConfig{})
	y := NewEnd(t, open(t), PairConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ln, err := y.Dev.Listen(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		req, err := ln.Accept(ctx)
		if err == nil {
			req.Reject([]byte("go away"))
		}
	}()
	_, err = x.Dev.Connect(ctx, x.QP, ln.Addr(), []byte("knock"))
	var rej *rdma.RejectError
	if !errors.Is(err, rdma.ErrRejected) || !errors.As(err, &rej) || string(rej.PrivateData) != "go away" {
		t.Fatalf("connect to a rejecting listener: %v, want ErrRejected with %q", err, "go away")
	}
	if x.QP.State() != rdma.QPStateInit {
		t.Fatalf("rejected queue pair in %v, want INIT", x.QP.State())
	}
	// Nobody listening.
	addr := ln.Addr()
	ln.Close()
	if _, err := x.Dev.Connect(ctx, x.QP, addr, nil); err == nil {
		t.Fatal("connect to a closed listener succeeded")
	}
}

// testSharedCQ runs many queue pairs, all completing on one completion queue.
func testSharedCQ(t *testing.T, open OpenFunc, _ Options) {
	const pairs, per = 8, 50
	devA, devB := open(t), open(t)
	shared, err := devA.CreateCQ(16)
	if err != nil {
		t.Fatal(err)
	}
	defer shared.Close()
	type conn struct{ a, b *End }
	var conns []conn
	byQP := map[uint32]int{}
	for i := 0; i < pairs; i++ {
		a := NewEnd(t, devA, PairConfig{MemSize: 64 << 10})
		b := NewEnd(t, devB, PairConfig{MemSize: 64 << 10})
		a.QP.Close()
		attr := rdma.QPAttr{SendCQ: shared, RecvCQ: shared}
		if a.QP, err = a.PD.CreateQP(attr); err != nil {
			t.Fatal(err)
		}
		Connect(t, a, b, nil, nil)
		conns = append(conns, conn{a, b})
		byQP[a.QP.Num()] = i
	}
	for i, c := range conns {
		fill(c.b.Bytes(), uint64(i))
		var wrs []rdma.SendWR
		for j := 0; j < per; j++ {
			wrs = append(wrs, rdma.SendWR{ID: uint64(i*1000 + j), Opcode: rdma.OpRDMARead, Flags: rdma.SendSignaled, SGL: []rdma.SGE{c.a.SGE(j*1024, 1024)}, RemoteAddr: c.b.Addr(j * 1024), RKey: c.b.MR.RKey()})
		}
		c.a.PostSend(t, wrs...)
	}
	wcs := WaitWC(t, shared, pairs*per)
	next := make([]int, pairs)
	for _, wc := range wcs {
		i, ok := byQP[wc.QPNum]
		if !ok || wc.Status != rdma.WCSuccess || wc.ID != uint64(i*1000+next[i]) {
			t.Fatalf("completion %+v: unknown queue pair, failure, or out of order (want id %d)", wc, i*1000+next[i])
		}
		next[i]++
	}
	for i, c := range conns {
		if !bytes.Equal(c.a.Bytes()[:per*1024], c.b.Bytes()[:per*1024]) {
			t.Fatalf("pair %d: read bytes differ", i)
		}
	}
}

// soakSize is the memory each end of a soak reads and writes.
const soakSize = 256 << 10

// testSoak runs soak with the connecting end as the initiator.
func testSoak(t *testing.T, open OpenFunc, _ Options) {
	a, b := Pair(t, open, PairConfig{MemSize: 2 * soakSize, Attr: rdma.QPAttr{MaxSendWR: 64, MaxRecvWR: 64}})
	soak(t, a, b)
}

// testSoakFromAcceptor runs soak with the accepting end as the initiator: a
// transport may run the two ends of a connection differently (the stream
// transports read an accepted connection on a thread of its own).
func testSoakFromAcceptor(t *testing.T, open OpenFunc, _ Options) {
	a, b := Pair(t, open, PairConfig{MemSize: 2 * soakSize, Attr: rdma.QPAttr{MaxSendWR: 64, MaxRecvWR: 64}})
	soak(t, b, a)
}

// soak runs 10,000 random WRITEs, READs and SENDs from a to b in batches and
// checks every byte against a model of b's memory.
func soak(t *testing.T, a, b *End) {
	const size = soakSize
	// Each side's memory: [0, size) is the data the peer reads and writes, modelled;
	// [size, 2*size) is local scratch for sources and sinks.
	fill(a.Bytes(), 100)
	fill(b.Bytes(), 200)
	modelB := append([]byte(nil), b.Bytes()[:size]...)
	r := rand.New(rand.NewPCG(5, 6))
	ops := 10000
	if testing.Short() {
		ops = 2000
	}
	const batch = 16
	for done := 0; done < ops; done += batch {
		var wrs []rdma.SendWR
		type check struct {
			sink, src, n int
			sinkMem      []byte
		}
		var reads []check
		var recvs []check
		scratch := size
		for i := 0; i < batch; i++ {
			n := 1 + r.IntN(3000)
			remote := r.IntN(size - n)
			local := scratch
			scratch += n + r.IntN(7)
			switch r.IntN(3) {
			case 0: // WRITE A -> B
				fill(a.Bytes()[local:local+n], r.Uint64())
				copy(modelB[remote:], a.Bytes()[local:local+n])
				// Fenced: a WRITE must not overtake the READs before it.
				wrs = append(wrs, rdma.SendWR{ID: uint64(done + i), Opcode: rdma.OpRDMAWrite, Flags: rdma.SendSignaled | rdma.SendFence, SGL: []rdma.SGE{a.SGE(local, n)}, RemoteAddr: b.Addr(remote), RKey: b.MR.RKey()})
			case 1: // READ B -> A: what B holds at this point in the sequence
				reads = append(reads, check{sink: local, n: n, sinkMem: append([]byte(nil), modelB[remote:remote+n]...)})
				wrs = append(wrs, rdma.SendWR{ID: uint64(done + i), Opcode: rdma.OpRDMARead, Flags: rdma.SendSignaled, SGL: []rdma.SGE{a.SGE(local, n)}, RemoteAddr: b.Addr(remote), RKey: b.MR.RKey()})
			case 2: // SEND A -> B into B's scratch
				fill(a.Bytes()[local:local+n], r.Uint64())
				b.PostRecv(t, uint64(done+i), b.SGE(size+local-size, n))
				recvs = append(recvs, check{sink: local, src: local, n: n, sinkMem: append([]byte(nil), a.Bytes()[local:local+n]...)})
				wrs = append(wrs, rdma.SendWR{ID: uint64(done + i), Opcode: rdma.OpSend, Flags: rdma.SendSignaled, SGL: []rdma.SGE{a.SGE(local, n)}})
			}
		}
		a.PostSend(t, wrs...)
		wcs := WaitWC(t, a.SCQ, len(wrs))
		for i, wc := range wcs {
			if wc.Status != rdma.WCSuccess || wc.ID != wrs[i].ID {
				t.Fatalf("op %d: completion %+v, want success in order", done+i, wc)
			}
		}
		if len(recvs) > 0 {
			WaitWC(t, b.RCQ, len(recvs))
		}
		for _, c := range reads {
			if !bytes.Equal(a.Bytes()[c.sink:c.sink+c.n], c.sinkMem) {
				t.Fatalf("ops %d..%d: a READ returned bytes that differ from the model", done, done+batch)
			}
		}
		for _, c := range recvs {
			if !bytes.Equal(b.Bytes()[c.sink:c.sink+c.n], c.sinkMem) {
				t.Fatalf("ops %d..%d: a SEND delivered bytes that differ", done, done+batch)
			}
		}
	}
	if !bytes.Equal(b.Bytes()[:size], modelB) {
		t.Fatalf("after %d operations the target memory differs from the model", ops)
	}
}

// testManyPairs keeps more queue pairs busy than the Go scheduler has
// processors, with RDMA_READs in both directions of every pair at once, and
// checks every byte read. A transport that parks a thread per connection must
// not starve any of them.
func testManyPairs(t *testing.T, open OpenFunc, _ Options) {
	const (
		data   = 64 << 10 // each end's memory [0, data) is what the peer reads
		chunk  = 4 << 10
		rounds = 200
	)
	pairs := 2*runtime.GOMAXPROCS(0) + 2
	if testing.Short() {
		pairs = runtime.GOMAXPROCS(0) + 1
	}
	type job struct{ from, to *End }
	var jobs []job
	for i := 0; i < pairs; i++ {
		a, b := Pair(t, open, PairConfig{MemSize: 2 * data})
		fill(a.Bytes()[:data], uint64(2*i+1))
		fill(b.Bytes()[:data], uint64(2*i+2))
		jobs = append(jobs, job{a, b}, job{b, a})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	errc := make(chan error, len(jobs))
	for j, jb := range jobs {
		go func() {
			r := rand.New(rand.NewPCG(uint64(j), 7))
			wcs := make([]rdma.WorkCompletion, 1)
			for i := 0; i < rounds; i++ {
				remote := r.IntN(data - chunk)
				sink := data + r.IntN(data-chunk)
				wr := rdma.SendWR{ID: uint64(i), Opcode: rdma.OpRDMARead, Flags: rdma.SendSignaled, SGL: []rdma.SGE{jb.from.SGE(sink, chunk)}, RemoteAddr: jb.to.Addr(remote), RKey: jb.to.MR.RKey()}
				if err := jb.from.QP.PostSend([]rdma.SendWR{wr}); err != nil {
					errc <- fmt.Errorf("job %d round %d: post: %w", j, i, err)
					return
				}
				for jb.from.SCQ.Poll(wcs) == 0 {
					if err := jb.from.SCQ.Wait(ctx); err != nil {
						errc <- fmt.Errorf("job %d round %d: waiting for the READ: %w", j, i, err)
						return
					}
				}
				if wcs[0].Status != rdma.WCSuccess || wcs[0].ID != uint64(i) {
					errc <- fmt.Errorf("job %d round %d: completion %+v", j, i, wcs[0])
					return
				}
				if !bytes.Equal(jb.from.Bytes()[sink:sink+chunk], jb.to.Bytes()[remote:remote+chunk]) {
					errc <- fmt.Errorf("job %d round %d: READ of [%d,+%d) returned other bytes", j, i, remote, chunk)
					return
				}
			}
			errc <- nil
		}()
	}
	for range jobs {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
}

// testConcurrentPosters has several goroutines on each end of one pair post
// small RDMA_READs at once, each waiting for its own, while the other end does
// the same: posts race each other and the reader answering the peer for the
// socket. Every READ must complete with the peer's bytes. (A request left
// unwritten by a lost flush may still go out with the next flush the reader
// makes, so this is not what catches one: a transport needs its own test of
// that, as the stream engine's TestPostWhileSocketLocked.)
func testConcurrentPosters(t *testing.T, open OpenFunc, _ Options) {
	const (
		data    = 64 << 10 // each end's memory [0, data) is what the peer reads
		posters = 8        // per end
		n       = 512
	)
	rounds := 500
	if testing.Short() {
		rounds = 100
	}
	a, b := Pair(t, open, PairConfig{MemSize: data + posters*n, Attr: rdma.QPAttr{MaxSendWR: 2 * posters, MaxRecvWR: 16}})
	fill(a.Bytes()[:data], 11)
	fill(b.Bytes()[:data], 12)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	errc := make(chan error, 2*posters+2)
	for _, e := range []*End{a, b} {
		// One goroutine polls the end's send CQ and hands each completion to
		// the poster whose READ it is (the ID is the poster's index).
		done := make([]chan rdma.WorkCompletion, posters)
		for i := range done {
			done[i] = make(chan rdma.WorkCompletion, 1)
		}
		go func() {
			wcs := make([]rdma.WorkCompletion, 2*posters)
			for got := 0; got < posters*rounds; {
				k := e.SCQ.Poll(wcs)
				if k == 0 {
					if err := e.SCQ.Wait(ctx); err != nil {
						errc <- fmt.Errorf("%d of %d READs completed: %w", got, posters*rounds, err)
						return
					}
					continue
				}
				for _, wc := range wcs[:k] {
					if wc.ID >= posters {
						errc <- fmt.Errorf("completion %+v of no poster", wc)
						return
					}
					done[wc.ID] <- wc
				}
				got += k
			}
			errc <- nil
		}()
		peer := b
		if e == b {
			peer = a
		}
		for p := range posters {
			go func() {
				r := rand.New(rand.NewPCG(uint64(p), uint64(len(e.Bytes()))))
				sink := data + p*n
				for i := range rounds {
					l := 1 + r.IntN(n)
					remote := r.IntN(data - l)
					wr := rdma.SendWR{ID: uint64(p), Opcode: rdma.OpRDMARead, Flags: rdma.SendSignaled, SGL: []rdma.SGE{e.SGE(sink, l)}, RemoteAddr: peer.Addr(remote), RKey: peer.MR.RKey()}
					if err := e.QP.PostSend([]rdma.SendWR{wr}); err != nil {
						errc <- fmt.Errorf("poster %d round %d: post: %w", p, i, err)
						return
					}
					select {
					case wc := <-done[p]:
						if wc.Status != rdma.WCSuccess {
							errc <- fmt.Errorf("poster %d round %d: completion %+v", p, i, wc)
							return
						}
					case <-ctx.Done():
						errc <- fmt.Errorf("poster %d round %d: READ of [%d,+%d) never completed", p, i, remote, l)
						return
					}
					if !bytes.Equal(e.Bytes()[sink:sink+l], peer.Bytes()[remote:remote+l]) {
						errc <- fmt.Errorf("poster %d round %d: READ of [%d,+%d) returned other bytes", p, i, remote, l)
						return
					}
				}
				errc <- nil
			}()
		}
	}
	for range 2*posters + 2 {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
}

// testLargeTransfers moves 1 MiB RDMA_WRITEs and RDMA_READs one at a time, as
// a client writing and reading whole shards does, in both directions, and
// checks every byte. A transport that waits for more of a payload than the
// peer's window lets through stalls here for seconds per transfer (until its
// retry watchdog fails the queue pair).
func testLargeTransfers(t *testing.T, open OpenFunc, _ Options) {
	const (
		size   = 1 << 20
		rounds = 24
	)
	a, b := Pair(t, open, PairConfig{MemSize: 2 * size})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	wcs := make([]rdma.WorkCompletion, 1)
	for _, dir := range []struct {
		name     string
		from, to *End
	}{{"from connector", a, b}, {"from acceptor", b, a}} {
		for i := 0; i < rounds; i++ {
			op, src, dst := rdma.OpRDMAWrite, dir.from.Bytes()[:size], dir.to.Bytes()[size:]
			if i%2 == 1 {
				op, src, dst = rdma.OpRDMARead, dir.to.Bytes()[size:], dir.from.Bytes()[:size]
			}
			fill(src, uint64(i))
			wr := rdma.SendWR{ID: uint64(i), Opcode: op, Flags: rdma.SendSignaled, SGL: []rdma.SGE{dir.from.SGE(0, size)}, RemoteAddr: dir.to.Addr(size), RKey: dir.to.MR.RKey()}
			start := time.Now()
			dir.from.PostSend(t, wr)
			for dir.from.SCQ.Poll(wcs) == 0 {
				if err := dir.from.SCQ.Wait(ctx); err != nil {
					t.Fatalf("%s: %v %d: waiting for completion: %v", dir.name, op, i, err)
				}
			}
			if wcs[0].Status != rdma.WCSuccess {
				t.Fatalf("%s: %v %d: %v", dir.name, op, i, wcs[0].Status)
			}
			if !bytes.Equal(src, dst) {
				t.Fatalf("%s: %v %d: bytes differ", dir.name, op, i)
			}
			// A loopback megabyte takes about a millisecond; five seconds
			// means a transfer stalled, not a slow or loaded machine.
			if d := time.Since(start); d > 5*time.Second {
				t.Fatalf("%s: %v %d of %d bytes took %v", dir.name, op, i, size, d)
			}
		}
	}
}
