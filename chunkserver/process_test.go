package chunkserver_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/chunkserver/chunk"
	"github.com/rdmafs/rdmafs/chunkserver/chunktest"
	"github.com/rdmafs/rdmafs/chunkserver/client"
	"github.com/rdmafs/rdmafs/chunkserver/store"
	"github.com/rdmafs/rdmafs/rdma"
)

// TestCrashRecovery kills a real chunkd with SIGKILL in the middle of a write and
// delete load (so slots are freed and reused in place),
// restarts it on the same data dir and checks that every acknowledged version is
// there byte for byte and that whatever else is there is whole.
func TestCrashRecovery(t *testing.T) {
	bin := chunktest.BuildChunkd(t) // skips in -short mode
	dir := t.TempDir()
	const writers = 4
	acked := map[chunk.Key]int{} // version -> length
	writes := 0                  // acknowledged writes in all
	var mu sync.Mutex
	nextVersion := make([]uint64, writers)
	for round := 0; round < 3; round++ {
		p := chunktest.StartProcess(t, chunktest.ProcOptions{Bin: bin, Dir: dir})
		verifyAll(t, p, acked)
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		for w := 0; w < writers; w++ {
			env := chunktest.NewClientEnv(t, 2<<20)
			c, err := client.Dial(ctx, env.Dev, env.PD, p.Addr, client.Options{Secret: p.Secret})
			if err != nil {
				t.Fatal(err)
			}
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				defer c.Close()
				for ctx.Err() == nil {
					nextVersion[w]++
					key := chunk.Key{Chunk: uint64(1000 + w), Version: nextVersion[w]}
					n := 4096 + int(key.Version*7919%(1<<20))
					buf := env.Bytes()[:n]
					fill(buf, key)
					if err := c.WriteVersion(ctx, key, []rdma.SGE{env.SGE(0, n)}, store.Checksum(buf)); err != nil {
						return // killed
					}
					mu.Lock()
					acked[key] = n
					writes++
					mu.Unlock()
					// Delete the version before last, so that slots are
					// freed and reused in place during the load too.
					// From the moment the delete is sent, the version may be
					// there (whole) or gone: a kill can land before, during or
					// after the delete's work, and before or after its reply.
					old := chunk.Key{Chunk: key.Chunk, Version: key.Version - 2}
					mu.Lock()
					_, had := acked[old]
					delete(acked, old)
					mu.Unlock()
					if had {
						if err := c.Delete(ctx, old); err != nil {
							return // killed
						}
					}
				}
			}(w)
		}
		// Let the load run (at least a few acknowledged writes, however slow the
		// machine), then kill at some point in the middle of it.
		mu.Lock()
		before := writes
		mu.Unlock()
		deadline := time.Now().Add(20 * time.Second)
		for {
			mu.Lock()
			n := writes
			mu.Unlock()
			if n >= before+2*writers || time.Now().After(deadline) {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		// Not synchronization: the kill lands at a different point of the
		// load each round. chunkd is another process, with no clock to inject.
		time.Sleep(time.Duration(50+150*round) * time.Millisecond)
		p.Kill() // SIGKILL by PID, mid-write
		cancel()
		wg.Wait()
		mu.Lock()
		t.Logf("round %d: %d writes acknowledged so far, %d versions kept", round, writes, len(acked))
		mu.Unlock()
	}
	p := chunktest.StartProcess(t, chunktest.ProcOptions{Bin: bin, Dir: dir})
	if writes < 3*2*writers {
		t.Fatalf("only %d writes acknowledged: the load did not run", writes)
	}
	verifyAll(t, p, acked)
	if err := p.Stop(); err != nil {
		t.Fatalf("SIGTERM: chunkd did not exit cleanly: %v", err)
	}
}

// verifyAll reads every acknowledged version back and checks that every version
// present (acknowledged or not) holds exactly its content.
func verifyAll(t *testing.T, p *chunktest.Process, acked map[chunk.Key]int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	env := chunktest.NewClientEnv(t, 2<<20)
	c := env.Dial(t, p.Addr, p.Secret)
	chunks := map[uint64]bool{}
	for key, n := range acked {
		chunks[key.Chunk] = true
		l, err := c.ReadLease(ctx, key)
		if err != nil {
			t.Fatalf("acknowledged version %v lost: %v", key, err)
		}
		if int(l.Length) != n {
			t.Fatalf("version %v: length %d, want %d", key, l.Length, n)
		}
		if err := c.Read(ctx, l, 0, []rdma.SGE{env.SGE(0, n)}); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(env.Bytes()[:n], content(key, n)) {
			t.Fatalf("acknowledged version %v damaged", key)
		}
		c.ReleaseLease(ctx, l)
	}
	for id := range chunks {
		vs, err := c.List(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range vs {
			if _, ok := acked[v.Key]; ok {
				continue
			}
			// Durable but not acknowledged (killed between fsync and ack): it
			// must be whole.
			n := int(v.Length)
			if _, err := c.ReadAt(ctx, v.Key, 0, []rdma.SGE{env.SGE(0, n)}); err != nil || !bytes.Equal(env.Bytes()[:n], content(v.Key, n)) {
				t.Fatalf("unacknowledged version %v present but not whole: %v", v.Key, err)
			}
		}
	}
}

func TestProcessSIGTERM(t *testing.T) {
	bin := chunktest.BuildChunkd(t) // skips in -short mode
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	metricsAddr := ln.Addr().String()
	ln.Close()
	p := chunktest.StartProcess(t, chunktest.ProcOptions{Bin: bin, Args: []string{"--metrics", metricsAddr, "--zone", "rack1"}})
	c, env := func() (*client.Client, *chunktest.ClientEnv) {
		env := chunktest.NewClientEnv(t, 1<<20)
		return env.Dial(t, p.Addr, p.Secret), env
	}()
	key := chunk.Key{Chunk: 1, Version: 1}
	put(t, c, env, 0, key, 1000)
	if _, err := c.ReadAt(ctxT(t), key, 0, []rdma.SGE{env.SGE(0, 1000)}); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatalf("scrape metrics: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, m := range []string{"rdmafs_chunkd_disk_written_bytes_total 1000", "rdmafs_chunkd_leases 1", "rdmafs_chunkd_connections 1",
		`rdmafs_chunkd_requests_total{op="Commit",status="ok"} 1`, "rdmafs_chunkd_request_seconds_bucket", "rdmafs_chunkd_resident_bytes 4096"} {
		if !strings.Contains(string(body), m) {
			t.Errorf("metrics lack %q", m)
		}
	}
	if err := p.Stop(); err != nil {
		t.Fatalf("chunkd exit after SIGTERM: %v", err)
	}
	select {
	case <-c.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("client not disconnected by the shutdown")
	}
}
