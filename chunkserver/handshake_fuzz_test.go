package chunkserver_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/rdmafs/rdmafs/chunkserver/chunk"
	"github.com/rdmafs/rdmafs/chunkserver/chunktest"
	"github.com/rdmafs/rdmafs/chunkserver/proto"
	"github.com/rdmafs/rdmafs/chunkserver/store"
	"github.com/rdmafs/rdmafs/rdma"
)

// FuzzHandshake offers chunkd arbitrary connect private data. Unless the
// bytes are a fresh token made with the cluster secret, the connection is
// refused and counted, and its queue pair reads no byte of chunkd's memory:
// not even with the address and rkey of a live read lease that an
// authenticated client holds.
func FuzzHandshake(f *testing.F) {
	secret := []byte("fuzz-handshake-secret")
	reg := prometheus.NewRegistry()
	// The fuzz target may not log through f: the server logs nowhere.
	s := chunktest.Start(f, chunktest.Options{Secret: secret, Registerer: reg, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	good, env := s.Dial(f)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	key := chunk.Key{Chunk: 7, Version: 1}
	data := env.Bytes()[:4096]
	for i := range data {
		data[i] = byte(i*7 + 1)
	}
	if err := good.WriteVersion(ctx, key, []rdma.SGE{env.SGE(0, len(data))}, store.Checksum(data)); err != nil {
		f.Fatal(err)
	}
	lease, err := good.ReadLease(ctx, key)
	if err != nil {
		f.Fatal(err)
	}
	valid := token(secret)
	f.Add(valid) // replayed: refused as a replay
	f.Add(token([]byte("another cluster's secret")))
	f.Add(valid[:len(valid)-1])
	f.Add([]byte{})
	f.Add(bytes.Repeat([]byte{0xff}, 56))

	f.Fuzz(func(t *testing.T, private []byte) {
		refusedBefore := testutil.ToFloat64(s.Metrics().Errors.WithLabelValues("auth"))
		_, decodeErr := proto.DecodeConnect(secret, private, time.Now(), 5*time.Minute)
		cenv := chunktest.NewClientEnv(t, 1<<16)
		cq, err := cenv.Dev.CreateCQ(16)
		if err != nil {
			t.Fatal(err)
		}
		defer cq.Close()
		qp, err := cenv.PD.CreateQP(rdma.QPAttr{SendCQ: cq, RecvCQ: cq, RNRTimeout: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		defer qp.Close()
		cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer ccancel()
		_, connErr := cenv.Dev.Connect(cctx, qp, s.Addr(), private)
		if connErr == nil {
			if decodeErr != nil {
				t.Fatalf("chunkd accepted connect data that is no valid token (%v): %x", decodeErr, private)
			}
			return // a fresh valid token: the fuzzer cannot forge one
		}
		if len(private) > rdma.MaxConnectPrivateData {
			return // refused by the transport before it reached chunkd
		}
		if got := testutil.ToFloat64(s.Metrics().Errors.WithLabelValues("auth")); got != refusedBefore+1 {
			t.Fatalf("refused handshake counted %v times, want 1", got-refusedBefore)
		}
		// The refused queue pair cannot read the leased version.
		buf := cenv.Bytes()[:lease.Length]
		clear(buf)
		err = qp.PostSend([]rdma.SendWR{{ID: 1, Opcode: rdma.OpRDMARead, Flags: rdma.SendSignaled,
			SGL: []rdma.SGE{cenv.SGE(0, int(lease.Length))}, RemoteAddr: lease.Addr, RKey: lease.RKey}})
		if err == nil {
			// Posted: it must fail or never complete, and leave buf as it was.
			wc := make([]rdma.WorkCompletion, 1)
			timeout := time.After(2 * time.Second)
		wait:
			for {
				if cq.Poll(wc) == 1 {
					if wc[0].Status == rdma.WCSuccess {
						t.Fatal("an RDMA READ on a refused connection completed")
					}
					break
				}
				select {
				case <-qp.Disconnected():
					break wait
				case <-timeout:
					break wait
				case <-time.After(time.Millisecond):
				}
			}
		}
		if bytes.Contains(buf, data[:64]) {
			t.Fatal("a refused connection read chunkd's memory")
		}
	})
}
