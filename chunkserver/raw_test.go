package chunkserver_test

import (
	"context"
	"crypto/rand"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/chunkserver"
	"github.com/rdmafs/rdmafs/chunkserver/chunk"
	"github.com/rdmafs/rdmafs/chunkserver/chunktest"
	"github.com/rdmafs/rdmafs/chunkserver/proto"
	"github.com/rdmafs/rdmafs/rdma"
)

// rawConn is a queue pair connected to chunkd without the client stub, to send
// what a well-behaved client never would.
type rawConn struct {
	qp  rdma.QueuePair
	cq  rdma.CompletionQueue
	env *chunktest.ClientEnv
}

func dialRaw(t *testing.T, addr string, private []byte) (*rawConn, error) {
	t.Helper()
	env := chunktest.NewClientEnv(t, 1<<20)
	cq, err := env.Dev.CreateCQ(64)
	if err != nil {
		t.Fatal(err)
	}
	qp, err := env.PD.CreateQP(rdma.QPAttr{SendCQ: cq, RecvCQ: cq, RNRTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		qp.Close()
		cq.Close()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := env.Dev.Connect(ctx, qp, addr, private); err != nil {
		return nil, err
	}
	return &rawConn{qp: qp, cq: cq, env: env}, nil
}

func token(secret []byte) []byte {
	cd := proto.ConnectData{Time: time.Now()}
	rand.Read(cd.Nonce[:])
	return proto.EncodeConnect(secret, cd)
}

func rejectReason(err error) string {
	var re *rdma.RejectError
	if errors.As(err, &re) {
		return string(re.PrivateData)
	}
	return ""
}

// TestMalformedMessageDisconnects: a connection that sends bytes that are not a
// request message is dropped; the server and other clients are unaffected.
func TestMalformedMessageDisconnects(t *testing.T) {
	s := chunktest.Start(t, chunktest.Options{})
	good, env := s.Dial(t)
	key := chunk.Key{Chunk: 40, Version: 1}
	put(t, good, env, 0, key, 4096)
	for _, msg := range [][]byte{
		[]byte("garbage that is not a message"),
		{0xD4, 0xC3, 1, 1, 0xff, 0xff, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0}, // 65535 requests claimed
		{},
	} {
		rc, err := dialRaw(t, s.Addr(), token(s.Secret))
		if err != nil {
			t.Fatal(err)
		}
		copy(rc.env.Bytes(), msg)
		if err := rc.qp.PostSend([]rdma.SendWR{{ID: 1, Opcode: rdma.OpSend, Flags: rdma.SendSignaled, SGL: []rdma.SGE{rc.env.SGE(0, len(msg))}}}); err != nil {
			t.Fatal(err)
		}
		select {
		case <-rc.qp.Disconnected():
		case <-time.After(10 * time.Second):
			t.Fatalf("connection that sent %q not dropped", msg)
		}
	}
	if _, err := good.Stat(ctxT(t), key); err != nil {
		t.Fatalf("well-behaved client after malformed peers: %v", err)
	}
}

func TestConnectRejections(t *testing.T) {
	s := chunktest.Start(t, chunktest.Options{Mem: 4 << 20, Config: chunkserver.Config{MaxConns: 2, Credits: 8, MaxMsg: 4096}})
	tok := token(s.Secret)
	if _, err := dialRaw(t, s.Addr(), tok); err != nil {
		t.Fatal(err)
	}
	// The same token again is a replay.
	_, err := dialRaw(t, s.Addr(), tok)
	if !strings.Contains(rejectReason(err), "replayed") {
		t.Fatalf("replayed token: %v (%q)", err, rejectReason(err))
	}
	// No token at all.
	_, err = dialRaw(t, s.Addr(), []byte("hello"))
	if !strings.Contains(rejectReason(err), "not authorized") {
		t.Fatalf("no token: %v (%q)", err, rejectReason(err))
	}
	// A token made too long ago.
	old := proto.EncodeConnect(s.Secret, proto.ConnectData{Time: time.Now().Add(-time.Hour)})
	_, err = dialRaw(t, s.Addr(), old)
	if !strings.Contains(rejectReason(err), "not authorized") {
		t.Fatalf("stale token: %v (%q)", err, rejectReason(err))
	}
	if _, err := dialRaw(t, s.Addr(), token(s.Secret)); err != nil {
		t.Fatal(err)
	}
	// Over MaxConns.
	_, err = dialRaw(t, s.Addr(), token(s.Secret))
	if !strings.Contains(rejectReason(err), "busy") {
		t.Fatalf("connection over the limit: %v (%q)", err, rejectReason(err))
	}
}

// TestConnectionMemoryBounded: connections take their message buffers from the
// registered pool; when it cannot hold another connection's, chunkd says busy
// instead of growing.
func TestConnectionMemoryBounded(t *testing.T) {
	// Each connection needs (8 + 12) x 64 KiB = 1.25 MiB of the 4 MiB pool.
	s := chunktest.Start(t, chunktest.Options{Mem: 4 << 20, Config: chunkserver.Config{Credits: 8, MaxMsg: 64 << 10}})
	var n int
	var err error
	for n = 0; n < 10; n++ {
		if _, err = dialRaw(t, s.Addr(), token(s.Secret)); err != nil {
			break
		}
	}
	if n != 3 || !strings.Contains(rejectReason(err), "busy") {
		t.Fatalf("%d connections, then %v (%q); want 3 then busy", n, err, rejectReason(err))
	}
}
