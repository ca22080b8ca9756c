package chunkserver_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	mrand "math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

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

// TestRandomRequests throws batches of random requests (random ops, ids,
// versions, lengths, lease ids, checksums) at chunkd: every one gets a status,
// the connection survives, and when the clients leave nothing stays held but
// the resident versions.
func TestRandomRequests(t *testing.T) {
	s := chunktest.Start(t, chunktest.Options{Mem: 32 << 20, MaxLength: 1 << 20})
	ctx := ctxT(t)
	r := mrand.New(mrand.NewPCG(7, 7))
	for round := 0; round < 3; round++ {
		c, env := s.Dial(t)
		put(t, c, env, 0, chunk.Key{Chunk: 1, Version: 1}, 5000)
		var leases []uint64
		for i := 0; i < 300; i++ {
			reqs := make([]proto.Request, 1+r.IntN(c.Limits().MaxBatch))
			for j := range reqs {
				q := proto.Request{
					Op:      proto.Op(1 + r.IntN(int(proto.OpClone))),
					Chunk:   uint64(r.IntN(4)),
					Version: uint64(r.IntN(4)),
					Length:  uint32(r.IntN(1 << 20)),
					CRC:     r.Uint32(),
					LeaseID: uint64(r.IntN(50)),
					Base:    uint64(r.IntN(4)),
				}
				switch r.IntN(8) {
				case 0:
					q.Length = r.Uint32()
				case 1:
					q.Chunk, q.Version = r.Uint64(), r.Uint64()
				case 2:
					if len(leases) > 0 {
						q.LeaseID = leases[r.IntN(len(leases))]
					}
				}
				reqs[j] = q
			}
			reps, err := c.Do(ctx, reqs)
			if err != nil {
				t.Fatalf("round %d batch %d: %v", round, i, err)
			}
			for j, rep := range reps {
				if rep.Op != reqs[j].Op || rep.Status > proto.StatusShuttingDown {
					t.Fatalf("reply %+v to %+v", rep, reqs[j])
				}
				if rep.Op == proto.OpReadLease && rep.Status == proto.StatusOK {
					leases = append(leases, rep.LeaseID)
				}
			}
		}
		c.Close()
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := s.Stats()
		if st.Connections == 0 && st.Leases == 0 && testutil.ToFloat64(s.Metrics().Staging) == 0 &&
			st.MemInUse == st.ResidentBytes {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("resources held after the clients left: %+v, staging %v", st, testutil.ToFloat64(s.Metrics().Staging))
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The one committed version is intact.
	c, env := s.Dial(t)
	if _, err := c.ReadAt(ctx, chunk.Key{Chunk: 1, Version: 1}, 0, []rdma.SGE{env.SGE(0, 5000)}); err != nil && !proto.IsStatus(err, proto.StatusWrongVersion) && !proto.IsStatus(err, proto.StatusUnknownChunk) {
		t.Fatal(err) // (a random Delete may have removed it)
	} else if err == nil && !bytes.Equal(env.Bytes()[:5000], content(chunk.Key{Chunk: 1, Version: 1}, 5000)) {
		t.Fatal("version damaged by random requests")
	}
}
