package stream

import (
	"bytes"
	"context"
	"net"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/rdma"
)

// FuzzEngine feeds arbitrary frames from a raw socket into a connected queue pair:
// the target must never panic or hang, and must never let the peer write into a
// region of another protection domain, even when the peer names its real key.
func FuzzEngine(f *testing.F) {
	frame := func(h header, payload []byte) []byte {
		b := make([]byte, headerSize)
		h.encode(b)
		return append(b, payload...)
	}
	f.Add(frame(header{op: opWrite, length: 4, rkey: 1, raddr: 0}, []byte("abcd")))
	f.Add(frame(header{op: opReadReq, length: 16, psn: 1}, nil))
	f.Add(frame(header{op: opSend, length: 3}, []byte("xyz")))
	f.Add(append(frame(header{op: opAck, psn: 7}, nil), frame(header{op: opReadResp, length: 2, psn: 8}, []byte("zz"))...))
	f.Add(frame(header{op: opNak, status: 10, psn: 0}, nil))
	f.Add(frame(header{op: opWrite, length: 8, rkey: 2, raddr: 0}, []byte("12345678")))

	dev, err := Open(Options{HandshakeTimeout: time.Second})
	if err != nil {
		f.Fatal(err)
	}
	pd, _ := dev.AllocPD()
	// Guard pages around the region: the region is the middle of a larger memory.
	mem, err := rdma.AllocMemory("fuzz", 3*4096)
	if err != nil {
		f.Fatal(err)
	}
	defer mem.Free()
	mr, err := pd.RegisterMemory(mem, rdma.AccessLocalWrite|rdma.AccessRemoteRead|rdma.AccessRemoteWrite)
	if err != nil {
		f.Fatal(err)
	}
	defer mr.Deregister()
	// A region of another protection domain: no request through qp may reach it.
	pd2, _ := dev.AllocPD()
	mem2, err := rdma.AllocMemory("fuzz-other", 4096)
	if err != nil {
		f.Fatal(err)
	}
	defer mem2.Free()
	other, err := pd2.RegisterMemory(mem2, rdma.AccessLocalWrite|rdma.AccessRemoteRead|rdma.AccessRemoteWrite)
	if err != nil {
		f.Fatal(err)
	}
	defer other.Deregister()
	ctx := context.Background()
	ln, err := dev.Listen(ctx, "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	defer ln.Close()

	f.Fuzz(func(t *testing.T, input []byte) {
		scq, _ := dev.CreateCQ(64)
		rcq, _ := dev.CreateCQ(64)
		qp, err := pd.CreateQP(rdma.QPAttr{SendCQ: scq, RecvCQ: rcq, RNRTimeout: time.Millisecond, RetryTimeout: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		defer qp.Close()
		qp.PostRecv([]rdma.RecvWR{{ID: 1, SGL: []rdma.SGE{{Addr: mr.Addr() + 4096, Length: 64, LKey: mr.LKey()}}}})
		// The fuzz input may name the regions' real keys and addresses: rkeys 1
		// and 2 in the first header stand for qp's region and the other one.
		in := append([]byte(nil), input...)
		var h header
		if len(in) >= headerSize && h.decode(in) == nil {
			switch h.rkey {
			case 1:
				h.rkey, h.raddr = mr.RKey(), h.raddr+mr.Addr()
			case 2:
				h.rkey, h.raddr = other.RKey(), h.raddr+other.Addr()
			}
			h.encode(in)
		}

		conn, err := net.Dial("tcp", ln.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.Write((&handshake{kind: kindHello, qpn: 1, rnrTimeoutMS: 1}).encode())
		req, err := ln.Accept(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := req.Accept(qp, nil); err != nil {
			t.Fatal(err)
		}
		reply := make([]byte, handshakeFixed)
		if _, err := conn.Read(reply); err != nil {
			t.Fatal(err)
		}
		conn.Write(in)
		// Give the engine time to act on the input, then end the connection.
		conn.SetReadDeadline(time.Now().Add(5 * time.Millisecond))
		var sink [4096]byte
		for {
			if _, err := conn.Read(sink[:]); err != nil {
				break
			}
		}
		conn.Close()
		qp.Close()
		if !bytes.Equal(mem2.Bytes(), make([]byte, 4096)) {
			t.Fatal("a request reached a region of another protection domain")
		}
	})
}
