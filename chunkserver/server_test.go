package chunkserver_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/rdmafs/rdmafs/chunkserver"
	"github.com/rdmafs/rdmafs/chunkserver/chunk"
	"github.com/rdmafs/rdmafs/chunkserver/chunktest"
	"github.com/rdmafs/rdmafs/chunkserver/client"
	"github.com/rdmafs/rdmafs/chunkserver/proto"
	"github.com/rdmafs/rdmafs/chunkserver/store"
	"github.com/rdmafs/rdmafs/rdma"
)

// fill writes the deterministic content of version key into b.
func fill(b []byte, key chunk.Key) {
	x := key.Chunk*0x9e3779b97f4a7c15 ^ key.Version*0xbf58476d1ce4e5b9
	i := 0
	for ; i+8 <= len(b); i += 8 {
		x ^= x >> 31
		x *= 0x94d049bb133111eb
		x += 0x632be59bd9b4e5d
		binary.LittleEndian.PutUint64(b[i:], x)
	}
	for ; i < len(b); i++ {
		b[i] = byte(x >> (8 * (i % 8)))
	}
}

func content(key chunk.Key, n int) []byte {
	b := make([]byte, n)
	fill(b, key)
	return b
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// put writes a version through the protocol from offset off of env's buffer.
func put(t *testing.T, c *client.Client, env *chunktest.ClientEnv, off int, key chunk.Key, n int) []byte {
	t.Helper()
	buf := env.Bytes()[off : off+n]
	fill(buf, key)
	if err := c.WriteVersion(ctxT(t), key, []rdma.SGE{env.SGE(off, n)}, store.Checksum(buf)); err != nil {
		t.Fatalf("write %v: %v", key, err)
	}
	return append([]byte(nil), buf...)
}

// putVersions writes versions 1 to n of chunk chunkID, each of size bytes,
// with put.
func putVersions(t *testing.T, c *client.Client, env *chunktest.ClientEnv, chunkID, n uint64, size int) {
	t.Helper()
	for v := uint64(1); v <= n; v++ {
		put(t, c, env, 0, chunk.Key{Chunk: chunkID, Version: v}, size)
	}
}

func TestWriteReadStatListDelete(t *testing.T) {
	s := chunktest.Start(t, chunktest.Options{})
	c, env := s.Dial(t)
	ctx := ctxT(t)
	sizes := []int{0, 1, 4095, 4096, 100000, 1 << 20, 3<<20 + 17}
	for i, n := range sizes {
		key := chunk.Key{Chunk: 42, Version: uint64(i + 1)}
		want := put(t, c, env, 0, key, n)
		clear(env.Bytes()[:n+8192])
		// Scatter the read over three SGEs of the client's buffer.
		a, b := n/3, n/3
		sgl := []rdma.SGE{env.SGE(8<<20, a), env.SGE(16<<20, b), env.SGE(24<<20, n-a-b)}
		l, err := c.ReadAt(ctx, key, 0, sgl)
		if err != nil {
			t.Fatalf("read %v: %v", key, err)
		}
		got := append(append(append([]byte(nil), env.Bytes()[8<<20:8<<20+a]...), env.Bytes()[16<<20:16<<20+b]...), env.Bytes()[24<<20:24<<20+n-a-b]...)
		if !bytes.Equal(got, want) || l.Length != uint32(n) || l.CRC != store.Checksum(want) {
			t.Fatalf("version %v of %d bytes read back wrong (lease %+v)", key, n, l)
		}
		if n > 10 { // a read at an offset
			if err := c.Read(ctx, l, n-10, []rdma.SGE{env.SGE(0, 10)}); err != nil || !bytes.Equal(env.Bytes()[:10], want[n-10:]) {
				t.Fatalf("read at offset: %v", err)
			}
		}
	}
	info, err := c.Stat(ctx, chunk.Key{Chunk: 42, Version: 6})
	if err != nil || info.Length != 1<<20 {
		t.Fatalf("Stat = %+v, %v", info, err)
	}
	vs, err := c.List(ctx, 42)
	if err != nil || len(vs) != len(sizes) || vs[0].Version != 1 || vs[len(vs)-1].Length != 3<<20+17 {
		t.Fatalf("List = %+v, %v", vs, err)
	}
	if err := c.Delete(ctx, chunk.Key{Chunk: 42, Version: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Stat(ctx, chunk.Key{Chunk: 42, Version: 1}); !proto.IsStatus(err, proto.StatusWrongVersion) {
		t.Fatalf("Stat of deleted version = %v", err)
	}
	// The store has everything durably: reopen it in a fresh server.
	dir := s.Dir
	s.Stop()
	s2 := chunktest.Start(t, chunktest.Options{Dir: dir})
	c2, env2 := s2.Dial(t)
	if _, err := c2.ReadAt(ctx, chunk.Key{Chunk: 42, Version: 6}, 0, []rdma.SGE{env2.SGE(0, 1<<20)}); err != nil ||
		!bytes.Equal(env2.Bytes()[:1<<20], content(chunk.Key{Chunk: 42, Version: 6}, 1<<20)) {
		t.Fatalf("read after restart: %v", err)
	}
}

func TestBatch(t *testing.T) {
	s := chunktest.Start(t, chunktest.Options{})
	c, env := s.Dial(t)
	ctx := ctxT(t)
	var keys []chunk.Key
	for i := 0; i < 8; i++ {
		k := chunk.Key{Chunk: uint64(100 + i), Version: 1}
		put(t, c, env, 0, k, 5000)
		keys = append(keys, k)
	}
	keys = append(keys, chunk.Key{Chunk: 999, Version: 1})
	leases, errs, err := c.ReadLeases(ctx, keys)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 8; i++ {
		if errs[i] != nil || leases[i].Length != 5000 {
			t.Fatalf("lease %d: %+v %v", i, leases[i], errs[i])
		}
		if err := c.Read(ctx, leases[i], 0, []rdma.SGE{env.SGE(0, 5000)}); err != nil || !bytes.Equal(env.Bytes()[:5000], content(keys[i], 5000)) {
			t.Fatalf("read %d: %v", i, err)
		}
	}
	if !proto.IsStatus(errs[8], proto.StatusUnknownChunk) {
		t.Fatalf("unknown chunk in a batch: %v", errs[8])
	}
}

func TestBadInput(t *testing.T) {
	s := chunktest.Start(t, chunktest.Options{MaxLength: 1 << 20, Capacity: 3 * store.FileSize(1<<20)})
	c, env := s.Dial(t)
	other, _ := s.Dial(t)
	ctx := ctxT(t)
	committed := chunk.Key{Chunk: 1, Version: 1}
	want := put(t, c, env, 0, committed, 1<<20)

	// A staged write of another connection.
	if _, err := other.PrepareWrite(ctx, chunk.Key{Chunk: 3, Version: 1}, 10); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name string
		do   func() error
		want proto.Status
	}{
		{"unknown chunk", func() error { _, err := c.ReadLease(ctx, chunk.Key{Chunk: 2, Version: 1}); return err }, proto.StatusUnknownChunk},
		{"wrong version", func() error { _, err := c.ReadLease(ctx, chunk.Key{Chunk: 1, Version: 7}); return err }, proto.StatusWrongVersion},
		{"stat unknown", func() error { _, err := c.Stat(ctx, chunk.Key{Chunk: 2, Version: 1}); return err }, proto.StatusUnknownChunk},
		{"delete unknown", func() error { return c.Delete(ctx, chunk.Key{Chunk: 2, Version: 1}) }, proto.StatusUnknownChunk},
		{"length over the limit", func() error {
			_, err := c.Do(ctx, []proto.Request{{Op: proto.OpPrepareWrite, Chunk: 1, Version: 2, Length: 1<<20 + 1}})
			return errOf(t, c, ctx, proto.Request{Op: proto.OpPrepareWrite, Chunk: 1, Version: 2, Length: 1<<20 + 1}, err)
		}, proto.StatusTooLong},
		{"prepare existing version", func() error { _, err := c.PrepareWrite(ctx, committed, 10); return err }, proto.StatusExists},
		{"commit without prepare", func() error { return c.Commit(ctx, chunk.Key{Chunk: 1, Version: 9}, 0) }, proto.StatusNoPrepare},
		{"abort without prepare", func() error { return c.Abort(ctx, chunk.Key{Chunk: 1, Version: 9}) }, proto.StatusNoPrepare},
		{"commit of another connection's staging", func() error { return c.Commit(ctx, chunk.Key{Chunk: 3, Version: 1}, 0) }, proto.StatusNotAuthorized},
		{"prepare of a version being written", func() error { _, err := c.PrepareWrite(ctx, chunk.Key{Chunk: 3, Version: 1}, 10); return err }, proto.StatusExists},
		{"renew unknown lease", func() error { _, err := c.RenewLease(ctx, client.Lease{ID: 12345}); return err }, proto.StatusLeaseExpired},
		{"release unknown lease", func() error { return c.ReleaseLease(ctx, client.Lease{ID: 12345}) }, proto.StatusLeaseExpired},
		{"checksum mismatch", func() error {
			k := chunk.Key{Chunk: 1, Version: 2}
			fill(env.Bytes()[:4096], k)
			err := c.WriteVersion(ctx, k, []rdma.SGE{env.SGE(0, 4096)}, store.Checksum(env.Bytes()[:4096])^1)
			if err == nil {
				return nil
			}
			// The staging was freed: committing again finds nothing prepared.
			if err2 := c.Commit(ctx, k, store.Checksum(env.Bytes()[:4096])); !proto.IsStatus(err2, proto.StatusNoPrepare) {
				t.Errorf("commit after mismatch: %v", err2)
			}
			return err
		}, proto.StatusChecksumMismatch},
		{"disk full", func() error {
			var err error
			for v := uint64(10); v < 20 && err == nil; v++ {
				k := chunk.Key{Chunk: 1, Version: v}
				fill(env.Bytes()[:1<<20], k)
				err = c.WriteVersion(ctx, k, []rdma.SGE{env.SGE(0, 1<<20)}, store.Checksum(env.Bytes()[:1<<20]))
			}
			return err
		}, proto.StatusNoSpace},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.do()
			if !proto.IsStatus(err, tc.want) {
				t.Fatalf("got %v, want status %q", err, tc.want)
			}
			if !strings.Contains(err.Error(), tc.want.String()) {
				t.Fatalf("error %q does not say %q", err, tc.want)
			}
		})
	}
	// None of it damaged the committed version, and nothing is left staged
	// but the other connection's grant.
	clear(env.Bytes()[:1<<20])
	if _, err := c.ReadAt(ctx, committed, 0, []rdma.SGE{env.SGE(0, 1<<20)}); err != nil || !bytes.Equal(env.Bytes()[:1<<20], want) {
		t.Fatalf("committed version after bad input: %v", err)
	}
	if g := testutil.ToFloat64(s.Metrics().Staging); g != 1 {
		t.Fatalf("staging grants = %v, want 1", g)
	}
	if _, err := c.Do(ctx, make([]proto.Request, c.Limits().MaxBatch+1)); err == nil {
		t.Fatal("batch over the limit was sent")
	}
}

func errOf(t *testing.T, c *client.Client, ctx context.Context, req proto.Request, err error) error {
	if err != nil {
		return err
	}
	reps, err := c.Do(ctx, []proto.Request{req})
	if err != nil {
		return err
	}
	return reps[0].Status.Err(req.Op)
}

func TestAuthentication(t *testing.T) {
	var logs syncBuffer
	reg := prometheus.NewRegistry()
	s := chunktest.Start(t, chunktest.Options{Secret: []byte("right"), Registerer: reg,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	env := chunktest.NewClientEnv(t, 1<<20)
	ctx := ctxT(t)
	// Refusals are counted, each one, and logged with the peer's address at
	// a bounded rate: 20 at once, then one a second.
	const tries = 50
	for i := 0; i < tries; i++ {
		_, err := client.Dial(ctx, env.Dev, env.PD, s.Addr(), client.Options{Secret: []byte("wrong")})
		if err == nil || !strings.Contains(err.Error(), "not authorized") {
			t.Fatalf("dial with the wrong secret: %v", err)
		}
	}
	if n := testutil.ToFloat64(s.Metrics().Errors.WithLabelValues("auth")); n != tries {
		t.Fatalf("rdmafs_chunkd_errors_total{kind=auth} = %v after %d refused handshakes", n, tries)
	}
	if lines := strings.Count(logs.String(), "chunkd: connection rejected"); lines < 20 || lines >= tries {
		t.Fatalf("%d log lines for %d refused handshakes, want a burst of 20 (+1 a second)", lines, tries)
	}
	if !strings.Contains(logs.String(), "peer=127.0.0.1:") {
		t.Fatalf("refusals logged without the peer:\n%s", logs.String())
	}
	c := env.Dial(t, s.Addr(), []byte("right"))
	if _, err := c.Stat(ctx, chunk.Key{Chunk: 1, Version: 1}); !proto.IsStatus(err, proto.StatusUnknownChunk) {
		t.Fatalf("authenticated client: %v", err)
	}
	// A client that checks chunkd's answer refuses a chunkd with another secret.
	if _, err := client.Dial(ctx, env.Dev, env.PD, s.Addr(), client.Options{Secret: []byte("")}); err == nil {
		t.Fatal("dial with an empty secret succeeded")
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent writers (a logger).
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func isRevoked(err error) bool {
	var re *client.RDMAError
	return errors.As(err, &re) && re.Status == rdma.WCRemAccessErr
}

// TestLeaseExpiryRevokes: a read lease lasts its TTL from its grant or last
// renewal by the server's clock, and is revoked (its rkey dead) once the
// clock passes that; an rkey works only on its connection; a release revokes
// at once.
func TestLeaseExpiryRevokes(t *testing.T) {
	const ttl = time.Second
	clock := newFakeClock()
	s := chunktest.Start(t, chunktest.Options{Config: chunkserver.Config{LeaseTTL: ttl, Now: clock.Now, NewTicker: clock.NewTicker}})
	w, wenv := s.Dial(t)
	key := chunk.Key{Chunk: 5, Version: 1}
	put(t, w, wenv, 0, key, 64<<10)
	ctx := ctxT(t)

	c, env := s.Dial(t)
	l, err := c.ReadLease(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Read(ctx, l, 0, []rdma.SGE{env.SGE(0, 64<<10)}); err != nil {
		t.Fatalf("read under lease: %v", err)
	}
	// Renewal keeps it alive past the first expiry.
	clock.Advance(ttl / 2)
	clock.Reap()
	if l, err = c.RenewLease(ctx, l); err != nil {
		t.Fatal(err)
	}
	clock.Advance(ttl * 6 / 10) // past the first expiry, before the renewed one
	clock.Reap()
	if err := c.Read(ctx, l, 0, []rdma.SGE{env.SGE(0, 64<<10)}); err != nil {
		t.Fatalf("read under renewed lease: %v", err)
	}
	// At its very expiry (renewed at 0.5 ttl, now 1.5 ttl) it still holds;
	// a nanosecond later the reaper revokes it.
	clock.Advance(ttl * 4 / 10)
	clock.Reap()
	if err := c.Read(ctx, l, 0, []rdma.SGE{env.SGE(0, 64<<10)}); err != nil {
		t.Fatalf("read at the renewed lease's last moment: %v", err)
	}
	clock.Advance(time.Nanosecond)
	clock.Reap()
	if err := c.Read(ctx, l, 0, []rdma.SGE{env.SGE(0, 64<<10)}); !isRevoked(err) {
		t.Fatalf("read after expiry: %v, want REM_ACCESS_ERR", err)
	}
	if testutil.ToFloat64(s.Metrics().Leases) != 0 {
		t.Fatal("expired lease still counted")
	}

	// An rkey is valid only on its own connection.
	c2, env2 := s.Dial(t)
	l2, err := c2.ReadLease(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	c3, env3 := s.Dial(t)
	if err := c3.Read(ctx, l2, 0, []rdma.SGE{env3.SGE(0, 4096)}); !isRevoked(err) {
		t.Fatalf("read with another connection's rkey: %v, want REM_ACCESS_ERR", err)
	}
	// Explicit release revokes at once.
	if err := c2.ReleaseLease(ctx, l2); err != nil {
		t.Fatal(err)
	}
	if err := c2.Read(ctx, l2, 0, []rdma.SGE{env2.SGE(0, 4096)}); !isRevoked(err) {
		t.Fatalf("read after release: %v, want REM_ACCESS_ERR", err)
	}
}

// TestStagingRevoked: a staging grant's rkey dies at commit, and an unused
// grant lasts its TTL by the server's clock, then is freed and revoked.
func TestStagingRevoked(t *testing.T) {
	clock := newFakeClock()
	s := chunktest.Start(t, chunktest.Options{Config: chunkserver.Config{StagingTTL: time.Second, Now: clock.Now, NewTicker: clock.NewTicker}})
	ctx := ctxT(t)
	// After commit the staging rkey is dead: the committed bytes cannot change.
	c, env := s.Dial(t)
	key := chunk.Key{Chunk: 6, Version: 1}
	fill(env.Bytes()[:8192], key)
	st, err := c.PrepareWrite(ctx, key, 8192)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Write(ctx, st, 0, []rdma.SGE{env.SGE(0, 8192)}); err != nil {
		t.Fatal(err)
	}
	if err := c.Commit(ctx, key, store.Checksum(env.Bytes()[:8192])); err != nil {
		t.Fatal(err)
	}
	if err := c.Write(ctx, st, 0, []rdma.SGE{env.SGE(8192, 8192)}); !isRevoked(err) {
		t.Fatalf("write after commit: %v, want REM_ACCESS_ERR", err)
	}
	// An unused staging grant expires, is freed and its rkey revoked.
	c2, env2 := s.Dial(t)
	st2, err := c2.PrepareWrite(ctx, chunk.Key{Chunk: 6, Version: 2}, 8192)
	if err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Second) // the last moment of its TTL: still there
	clock.Reap()
	if err := c2.Write(ctx, st2, 0, []rdma.SGE{env2.SGE(0, 8192)}); err != nil {
		t.Fatalf("write at the staging grant's last moment: %v", err)
	}
	clock.Advance(time.Nanosecond)
	clock.Reap()
	if err := c2.Commit(ctx, chunk.Key{Chunk: 6, Version: 2}, 0); !proto.IsStatus(err, proto.StatusNoPrepare) {
		t.Fatalf("commit after staging expiry: %v", err)
	}
	if err := c2.Write(ctx, st2, 0, []rdma.SGE{env2.SGE(0, 8192)}); !isRevoked(err) {
		t.Fatalf("write after staging expiry: %v, want REM_ACCESS_ERR", err)
	}
	c3, env3 := s.Dial(t)
	if _, err := c3.ReadAt(ctx, key, 0, []rdma.SGE{env3.SGE(0, 8192)}); err != nil || !bytes.Equal(env3.Bytes()[:8192], content(key, 8192)) {
		t.Fatalf("committed version: %v", err)
	}
}

// TestClientVanishesMidWrite: a client that disconnects between its RDMA_WRITE
// and its commit leaves nothing staged and no version damaged.
func TestClientVanishesMidWrite(t *testing.T) {
	s := chunktest.Start(t, chunktest.Options{Mem: 16 << 20})
	ctx := ctxT(t)
	c, env := s.Dial(t)
	key := chunk.Key{Chunk: 7, Version: 1}
	want := put(t, c, env, 0, key, 1<<20)

	env2 := chunktest.NewClientEnv(t, 4<<20)
	c2, err := client.Dial(ctx, env2.Dev, env2.PD, s.Addr(), client.Options{Secret: s.Secret})
	if err != nil {
		t.Fatal(err)
	}
	next := chunk.Key{Chunk: 7, Version: 2}
	st, err := c2.PrepareWrite(ctx, next, 4<<20)
	if err != nil {
		t.Fatal(err)
	}
	if err := c2.Write(ctx, st, 0, []rdma.SGE{env2.SGE(0, 2<<20)}); err != nil {
		t.Fatal(err)
	}
	c2.Close()
	deadline := time.Now().Add(5 * time.Second)
	for testutil.ToFloat64(s.Metrics().Staging) != 0 || testutil.ToFloat64(s.Metrics().Connections) != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("staging not freed after the client vanished: %v grants", testutil.ToFloat64(s.Metrics().Staging))
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The version can be written again by someone else, the old one is intact.
	put(t, c, env, 0, next, 4<<20)
	clear(env.Bytes()[:1<<20])
	if _, err := c.ReadAt(ctx, key, 0, []rdma.SGE{env.SGE(0, 1<<20)}); err != nil || !bytes.Equal(env.Bytes()[:1<<20], want) {
		t.Fatalf("committed version: %v", err)
	}
}

// TestConcurrentReadersDuringCommits: readers lease the newest version they know
// while a writer commits newer ones and deletes old ones; every read returns
// exactly the leased version.
func TestConcurrentReadersDuringCommits(t *testing.T) {
	s := chunktest.Start(t, chunktest.Options{Mem: 24 << 20})
	ctx := ctxT(t)
	const size = 256 << 10
	w, wenv := s.Dial(t)
	var newest atomic.Uint64
	put(t, w, wenv, 0, chunk.Key{Chunk: 9, Version: 1}, size)
	newest.Store(1)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var reads atomic.Int64
	for r := 0; r < 4; r++ {
		c, env := s.Dial(t)
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			off := 0
			for {
				select {
				case <-stop:
					return
				default:
				}
				key := chunk.Key{Chunk: 9, Version: newest.Load()}
				l, err := c.ReadLease(ctx, key)
				if proto.IsStatus(err, proto.StatusWrongVersion) {
					continue // deleted meanwhile
				}
				if err != nil {
					t.Errorf("reader %d: lease %v: %v", r, key, err)
					return
				}
				// Read it twice, slowly, while commits and deletes go on.
				for i := 0; i < 2; i++ {
					if err := c.Read(ctx, l, 0, []rdma.SGE{env.SGE(off, size/2), env.SGE(off+size, size/2)}); err != nil {
						t.Errorf("reader %d: read %v: %v", r, key, err)
						return
					}
					got := append(append([]byte(nil), env.Bytes()[off:off+size/2]...), env.Bytes()[off+size:off+size+size/2]...)
					if store.Checksum(got) != l.CRC || !bytes.Equal(got, content(key, size)) {
						t.Errorf("reader %d: torn or mixed read of %v", r, key)
						return
					}
					reads.Add(1)
				}
				c.ReleaseLease(ctx, l)
			}
		}(r)
	}
	for v := uint64(2); v <= 40; v++ {
		put(t, w, wenv, 0, chunk.Key{Chunk: 9, Version: v}, size)
		newest.Store(v)
		if v > 2 {
			if err := w.Delete(ctx, chunk.Key{Chunk: 9, Version: v - 2}); err != nil {
				t.Fatal(err)
			}
		}
	}
	close(stop)
	wg.Wait()
	if reads.Load() == 0 {
		t.Fatal("no reads happened")
	}
	t.Logf("%d verified reads during 39 commits", reads.Load())
}

// TestEvictionSparesLeased: with memory for a few versions only, reading many
// evicts the unleased ones but never a leased one.
func TestEvictionSparesLeased(t *testing.T) {
	s := chunktest.Start(t, chunktest.Options{Mem: 8 << 20})
	ctx := ctxT(t)
	c, env := s.Dial(t)
	const size = 1 << 20
	putVersions(t, c, env, 11, 12, size)
	held, err := c.ReadLease(ctx, chunk.Key{Chunk: 11, Version: 1})
	if err != nil {
		t.Fatal(err)
	}
	for round := 0; round < 2; round++ {
		for v := uint64(2); v <= 12; v++ {
			k := chunk.Key{Chunk: 11, Version: v}
			l, err := c.ReadLease(ctx, k)
			if err != nil {
				t.Fatalf("lease %v: %v", k, err)
			}
			if err := c.Read(ctx, l, 0, []rdma.SGE{env.SGE(0, size)}); err != nil || !bytes.Equal(env.Bytes()[:size], content(k, size)) {
				t.Fatalf("read %v: %v", k, err)
			}
			if err := c.ReleaseLease(ctx, l); err != nil {
				t.Fatal(err)
			}
		}
	}
	if testutil.ToFloat64(s.Metrics().Evictions) == 0 {
		t.Fatal("no evictions with 12 MiB of versions in 8 MiB")
	}
	if err := c.Read(ctx, held, 0, []rdma.SGE{env.SGE(0, size)}); err != nil || !bytes.Equal(env.Bytes()[:size], content(held.Key, size)) {
		t.Fatalf("leased version after evictions: %v", err)
	}
	// With everything leased, a new lease gets "busy", not someone's memory.
	var leases []client.Lease
	var busy error
	for v := uint64(2); v <= 12 && busy == nil; v++ {
		l, err := c.ReadLease(ctx, chunk.Key{Chunk: 11, Version: v})
		if err != nil {
			busy = err
			break
		}
		leases = append(leases, l)
	}
	if !proto.IsStatus(busy, proto.StatusBusy) {
		t.Fatalf("leasing more than memory: %v, want busy", busy)
	}
	for _, l := range append(leases, held) {
		if err := c.Read(ctx, l, 0, []rdma.SGE{env.SGE(0, size)}); err != nil || !bytes.Equal(env.Bytes()[:size], content(l.Key, size)) {
			t.Fatalf("leased %v: %v", l.Key, err)
		}
	}
}

// TestCachedLeasesMakeRoom: a client whose cached leases fill chunkd's memory
// still reads every version: asked for one more, chunkd says busy, and the
// client releases its older cached leases and asks again.
func TestCachedLeasesMakeRoom(t *testing.T) {
	s := chunktest.Start(t, chunktest.Options{Mem: 8 << 20})
	ctx := ctxT(t)
	c, env := s.Dial(t)
	const size = 1 << 20
	putVersions(t, c, env, 13, 24, size)
	for round := 0; round < 2; round++ {
		for v := uint64(1); v <= 24; v++ {
			k := chunk.Key{Chunk: 13, Version: v}
			if _, err := c.ReadAt(ctx, k, 0, []rdma.SGE{env.SGE(0, size)}); err != nil {
				t.Fatalf("round %d: read %v with %d leases cached: %v", round, k, c.CachedLeases(), err)
			}
			if !bytes.Equal(env.Bytes()[:size], content(k, size)) {
				t.Fatalf("round %d: read %v: wrong bytes", round, k)
			}
		}
	}
	if n := c.CachedLeases(); n == 0 || n > 8 {
		t.Fatalf("%d leases cached with 8 MiB of chunkd memory", n)
	}
}

// TestFlowControl: many goroutines on one connection and many connections never
// exceed the credits; every request is answered.
func TestFlowControl(t *testing.T) {
	s := chunktest.Start(t, chunktest.Options{Config: chunkserver.Config{Credits: 4}})
	ctx := ctxT(t)
	c, env := s.Dial(t)
	if c.Limits().Credits != 4 {
		t.Fatalf("credits advertised: %d", c.Limits().Credits)
	}
	key := chunk.Key{Chunk: 12, Version: 1}
	put(t, c, env, 0, key, 4096)
	var wg sync.WaitGroup
	var failed atomic.Int64
	clients := []*client.Client{c}
	for i := 0; i < 7; i++ {
		ci, _ := s.Dial(t)
		clients = append(clients, ci)
	}
	for _, ci := range clients {
		for g := 0; g < 16; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 50; i++ {
					if _, err := ci.Stat(ctx, key); err != nil {
						failed.Add(1)
						t.Error(err)
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	if failed.Load() != 0 {
		t.Fatalf("%d requests failed", failed.Load())
	}
}

func TestMembership(t *testing.T) {
	m := &fakeMembership{garbage: []chunk.Key{{Chunk: 20, Version: 1}, {Chunk: 21, Version: 9}}}
	s := chunktest.Start(t, chunktest.Options{Config: chunkserver.Config{Membership: m, HeartbeatInterval: 10 * time.Millisecond, Zone: "z1"}})
	c, env := s.Dial(t)
	put(t, c, env, 0, chunk.Key{Chunk: 20, Version: 1}, 100)
	put(t, c, env, 0, chunk.Key{Chunk: 20, Version: 2}, 100)
	m.mu.Lock()
	m.ready = true // from now on heartbeats name the garbage
	m.mu.Unlock()
	deadline := time.Now().Add(10 * time.Second)
	for {
		m.mu.Lock()
		reported := m.reported
		m.mu.Unlock()
		if len(reported) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("deletions not reported: %v", reported)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := c.Stat(ctxT(t), chunk.Key{Chunk: 20, Version: 1}); !proto.IsStatus(err, proto.StatusWrongVersion) {
		t.Fatalf("garbage not deleted: %v", err)
	}
	if _, err := c.Stat(ctxT(t), chunk.Key{Chunk: 20, Version: 2}); err != nil {
		t.Fatal(err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.info.ID != s.ID() || m.info.Zone != "z1" || m.info.Addr != s.Addr() || m.registrations < 2 {
		t.Fatalf("registration %+v, %d registrations (want a re-registration)", m.info, m.registrations)
	}
}

// fakeMembership is a metadata service: it asks for one re-registration, then
// hands out garbage until the chunkserver reports it deleted.
type fakeMembership struct {
	mu            sync.Mutex
	info          chunkserver.Info
	registrations int
	beats         int
	ready         bool
	garbage       []chunk.Key
	reported      []chunk.Key
}

func (m *fakeMembership) Register(ctx context.Context, info chunkserver.Info) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.info = info
	m.registrations++
	return nil
}

func (m *fakeMembership) Inventory(context.Context, string, time.Time, []chunk.Key, bool) error {
	return nil
}

func (m *fakeMembership) Heartbeat(ctx context.Context, st chunkserver.Stats) (chunkserver.HeartbeatReply, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.beats++
	if m.beats == 2 {
		return chunkserver.HeartbeatReply{}, fmt.Errorf("meta forgot us: %w", chunkserver.ErrNotRegistered)
	}
	m.reported = append(m.reported, st.Deleted...)
	if !m.ready || len(m.reported) > 0 {
		return chunkserver.HeartbeatReply{}, nil
	}
	return chunkserver.HeartbeatReply{Garbage: m.garbage}, nil
}

// TestReadPathAllocations: a read through a cached lease is a pure one-sided
// operation and allocates (almost) nothing.
func TestReadPathAllocations(t *testing.T) {
	s := chunktest.Start(t, chunktest.Options{})
	c, env := s.Dial(t)
	key := chunk.Key{Chunk: 30, Version: 1}
	put(t, c, env, 0, key, 64<<10)
	ctx := context.Background()
	sgl := []rdma.SGE{env.SGE(0, 64<<10)}
	if _, err := c.ReadAt(ctx, key, 0, sgl); err != nil {
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(200, func() {
		if _, err := c.ReadAt(ctx, key, 0, sgl); err != nil {
			t.Fatal(err)
		}
	})
	t.Logf("%.1f allocations per cached read", allocs)
	if allocs > 2 {
		t.Fatalf("%.1f allocations per cached read", allocs)
	}
}

// TestPoolRedials: the pool hands out one connection per address and replaces it
// after it failed (here: an access to a revoked lease kills the queue pair);
// a chunkserver that refuses a dial is suspect.
func TestPoolRedials(t *testing.T) {
	s := chunktest.Start(t, chunktest.Options{})
	env := chunktest.NewClientEnv(t, 1<<20)
	pool := client.NewPool(env.Dev, env.PD, client.Options{Secret: s.Secret}, nil, nil)
	defer pool.Close()
	ctx := ctxT(t)
	c1, _, err := pool.Get(ctx, "", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	key := chunk.Key{Chunk: 50, Version: 1}
	put(t, c1, env, 0, key, 4096)
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if c, _, err := pool.Get(ctx, "", s.Addr()); err != nil || c != c1 {
				t.Errorf("Get = %p, %v; want the live connection %p", c, err, c1)
			}
		}()
	}
	wg.Wait()
	l, err := c1.ReadLease(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	c1.ReleaseLease(ctx, l)
	if err := c1.Read(ctx, l, 0, []rdma.SGE{env.SGE(0, 4096)}); !isRevoked(err) {
		t.Fatalf("read of a released lease: %v", err)
	}
	<-c1.Done()
	c2, _, err := pool.Get(ctx, "", s.Addr())
	if err != nil || c2 == c1 {
		t.Fatalf("after failure: %p, %v", c2, err)
	}
	if _, err := c2.ReadAt(ctx, key, 0, []rdma.SGE{env.SGE(0, 4096)}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := pool.Get(ctx, "cs-gone", "127.0.0.1:1"); err == nil {
		t.Fatal("dial of a closed port succeeded")
	}
	// The refused chunkserver is suspect: the next Get fails at once, and
	// new shards avoid it.
	if _, _, err := pool.Get(ctx, "cs-gone", "127.0.0.1:1"); !errors.Is(err, client.ErrSuspect) {
		t.Fatalf("Get of a suspect chunkserver: %v, want ErrSuspect", err)
	}
	if got := pool.Avoid(); len(got) != 1 || got[0] != "cs-gone" {
		t.Fatalf("Avoid() = %v, want [cs-gone]", got)
	}
}

// TestLeaseCacheBounded: a client reading many versions keeps a bounded number
// of leases cached and releases the rest, so chunkd's pins stay bounded too.
func TestLeaseCacheBounded(t *testing.T) {
	s := chunktest.Start(t, chunktest.Options{})
	env := chunktest.NewClientEnv(t, 1<<20)
	c, err := client.Dial(ctxT(t), env.Dev, env.PD, s.Addr(), client.Options{Secret: s.Secret, MaxCachedLeases: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := ctxT(t)
	for v := uint64(1); v <= 20; v++ {
		k := chunk.Key{Chunk: 60, Version: v}
		put(t, c, env, 0, k, 4096)
		if _, err := c.ReadAt(ctx, k, 0, []rdma.SGE{env.SGE(4096, 4096)}); err != nil {
			t.Fatal(err)
		}
	}
	if n := c.CachedLeases(); n != 4 {
		t.Fatalf("%d leases cached, want 4", n)
	}
	deadline := time.Now().Add(5 * time.Second)
	for testutil.ToFloat64(s.Metrics().Leases) != 4 {
		if time.Now().After(deadline) {
			t.Fatalf("chunkd holds %v leases, want 4", testutil.ToFloat64(s.Metrics().Leases))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestCloseDuringReplies closes clients while replies are arriving: the
// transport's reader completes a receive and reposts it on the client's
// behalf, and Close, which waits for that reader, must not hold what the
// repost needs (it did, and a run of the suite hung for 26 minutes).
func TestCloseDuringReplies(t *testing.T) {
	s := chunktest.Start(t, chunktest.Options{})
	env := chunktest.NewClientEnv(t, 1<<20)
	for i := range 200 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		c, err := client.Dial(ctx, env.Dev, env.PD, s.Addr(), client.Options{Secret: s.Secret})
		if err != nil {
			cancel()
			t.Fatalf("dial %d: %v", i, err)
		}
		var callers sync.WaitGroup
		for range 4 {
			callers.Add(1)
			go func() {
				defer callers.Done()
				for {
					if _, err := c.Stat(ctx, chunk.Key{Chunk: 7, Version: 1}); errors.Is(err, client.ErrClosed) || ctx.Err() != nil {
						return
					}
				}
			}()
		}
		time.Sleep(time.Duration(i%5) * 100 * time.Microsecond)
		closed := make(chan struct{})
		go func() { c.Close(); close(closed) }()
		select {
		case <-closed:
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: Close still waiting after 10 s", i)
		}
		callers.Wait()
		cancel()
	}
}
