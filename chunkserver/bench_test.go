package chunkserver_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmafs/rdmafs/chunkserver/chunk"
	"github.com/rdmafs/rdmafs/chunkserver/chunktest"
	"github.com/rdmafs/rdmafs/chunkserver/client"
	"github.com/rdmafs/rdmafs/chunkserver/proto"
	"github.com/rdmafs/rdmafs/chunkserver/store"
	"github.com/rdmafs/rdmafs/rdma"
	"github.com/rdmafs/rdmafs/rdma/rdmatest"
	"github.com/rdmafs/rdmafs/rdma/transport"
)

// The read benchmarks compare reading resident 1 MiB shards through the chunk
// protocol (cached lease + RDMA_READ) with raw RDMA_READs of the same size on the
// same transport, at the same queue depths:
//
//	go test -run '^$' -bench 'Read' -benchtime 2s ./chunkserver/
const shard = 1 << 20

var depths = []int{1, 4}

// openDev opens a device of the transport under test (CHUNKTEST_TRANSPORT,
// default tcp), the same one the protocol benchmarks use.
func openDev(t testing.TB) rdma.Device {
	d, err := transport.Open(chunktest.TransportName(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// BenchmarkRawRDMARead is the baseline: RDMA_READ of 1 MiB between two ends of
// the transport, depth reads in flight.
func BenchmarkRawRDMARead(b *testing.B) {
	for _, depth := range depths {
		b.Run(fmt.Sprintf("depth=%d", depth), func(b *testing.B) {
			a, t := rdmatest.Pair(b, openDev, rdmatest.PairConfig{MemSize: 8 * shard, Attr: rdma.QPAttr{MaxSendWR: 64}})
			ctx := context.Background()
			var wcs [16]rdma.WorkCompletion
			post := func(i int) {
				wr := rdma.SendWR{ID: uint64(i), Opcode: rdma.OpRDMARead, Flags: rdma.SendSignaled,
					SGL: []rdma.SGE{a.SGE((i%depth)*shard, shard)}, RemoteAddr: t.Addr((i % 4) * shard), RKey: t.MR.RKey()}
				if err := a.QP.PostSend([]rdma.SendWR{wr}); err != nil {
					b.Fatal(err)
				}
			}
			b.SetBytes(shard)
			b.ResetTimer()
			inflight := 0
			for i := 0; i < b.N; i++ {
				for inflight >= depth {
					n := a.SCQ.Poll(wcs[:])
					if n == 0 {
						a.SCQ.Wait(ctx)
						continue
					}
					for _, wc := range wcs[:n] {
						if wc.Status != rdma.WCSuccess {
							b.Fatal(wc.Status)
						}
					}
					inflight -= n
				}
				post(i)
				inflight++
			}
			for inflight > 0 {
				n := a.SCQ.Poll(wcs[:])
				if n == 0 {
					a.SCQ.Wait(ctx)
				}
				inflight -= n
			}
		})
	}
}

// BenchmarkProtocolReadResident reads resident 1 MiB versions through the chunk
// protocol: depth goroutines share one connection, each reading round robin over
// 4 versions with cached leases.
func BenchmarkProtocolReadResident(b *testing.B) {
	for _, depth := range depths {
		b.Run(fmt.Sprintf("depth=%d", depth), func(b *testing.B) {
			s := chunktest.Start(b, chunktest.Options{Mem: 64 << 20})
			env := chunktest.NewClientEnv(b, 8*shard)
			c := env.Dial(b, s.Addr(), s.Secret)
			ctx := context.Background()
			keys := writeResident(b, c, env)
			for i := range keys {
				if _, err := c.ReadAt(ctx, keys[i], 0, []rdma.SGE{env.SGE(0, shard)}); err != nil {
					b.Fatal(err)
				}
			}
			b.SetBytes(shard)
			b.ResetTimer()
			var wg sync.WaitGroup
			per := b.N / depth
			for g := 0; g < depth; g++ {
				n := per
				if g == 0 {
					n += b.N % depth
				}
				wg.Go(func() {
					sgl := []rdma.SGE{env.SGE(g*shard, shard)}
					for i := 0; i < n; i++ {
						if _, err := c.ReadAt(ctx, keys[(g+i)%benchKeys], 0, sgl); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
		})
	}
}

// The write benchmarks compare the chunk protocol's write path (prepare +
// RDMA_WRITE + commit, durable on a disk-backed dir) with a plain pwrite +
// fdatasync of the same size in the same directory, at the same concurrency. Each
// reports MB/s and the p50/p99 latency of one durable write (commit / fdatasync).
//
//	go test -run '^$' -bench 'Write' -benchtime 100x ./chunkserver/
//
// BENCH_DIR selects the directory (default the test's temp dir).
func benchDir(b *testing.B) string {
	if d := os.Getenv("BENCH_DIR"); d != "" {
		dir, err := os.MkdirTemp(d, "chunkbench")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { os.RemoveAll(dir) })
		return dir
	}
	return b.TempDir()
}

var writers = []int{1, 4}

func reportLatency(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
}

// BenchmarkPwriteFdatasync is the baseline: each writer appends 1 MiB to its own
// file with pwrite and fdatasyncs it (mode=append), or writes each 1 MiB into a
// new file with pwrite and fdatasyncs it (mode=newfile; what a copy-on-write
// store must do at least).
func BenchmarkPwriteFdatasync(b *testing.B) {
	for _, mode := range []string{"append", "newfile"} {
		for _, w := range writers {
			b.Run(fmt.Sprintf("mode=%s/writers=%d", mode, w), func(b *testing.B) {
				dir := benchDir(b)
				buf := make([]byte, shard)
				fill(buf, chunk.Key{Chunk: 1, Version: 1})
				files := make([]*os.File, w)
				for g := range files {
					f, err := os.OpenFile(filepath.Join(dir, fmt.Sprintf("f%d", g)), os.O_CREATE|os.O_WRONLY, 0o644)
					if err != nil {
						b.Fatal(err)
					}
					b.Cleanup(func() { f.Close() })
					files[g] = f
				}
				b.SetBytes(shard)
				timedWriters(b, w, func(g, i int) error {
					fd, off := int(files[g].Fd()), int64(i/w)*shard
					if mode == "newfile" {
						var err error
						if fd, err = unix.Open(filepath.Join(dir, fmt.Sprintf("n%d", i)), unix.O_CREAT|unix.O_WRONLY|unix.O_EXCL, 0o644); err != nil {
							return fmt.Errorf("open: %w", err)
						}
						defer unix.Close(fd)
						off = 0
					}
					if _, err := unix.Pwrite(fd, buf, off); err != nil {
						return fmt.Errorf("pwrite: %w", err)
					}
					if err := unix.Fdatasync(fd); err != nil {
						return fmt.Errorf("fdatasync: %w", err)
					}
					return nil
				})
			})
		}
	}
}

func BenchmarkProtocolWrite(b *testing.B) {
	for _, w := range writers {
		b.Run(fmt.Sprintf("writers=%d", w), func(b *testing.B) {
			s := chunktest.Start(b, chunktest.Options{Dir: benchDir(b), Mem: 64 << 20})
			// One connection per writer, as the baseline has one file per writer.
			env := chunktest.NewClientEnv(b, w*shard)
			conns := make([]*client.Client, w)
			sgls := make([][]rdma.SGE, w)
			crcs := make([]uint32, w)
			for g := range conns {
				conns[g] = env.Dial(b, s.Addr(), s.Secret)
				fill(env.Bytes()[g*shard:(g+1)*shard], chunk.Key{Chunk: 1, Version: 1})
				crcs[g] = store.Checksum(env.Bytes()[g*shard : (g+1)*shard])
				sgls[g] = []rdma.SGE{env.SGE(g*shard, shard)}
			}
			ctx := context.Background()
			b.SetBytes(shard)
			timedWriters(b, w, func(g, i int) error {
				return writeTimed(ctx, conns[g], chunk.Key{Chunk: uint64(g + 1), Version: uint64(i + 1)}, sgls[g], crcs[g])
			})
		})
	}
}

// timedWriters runs b.N operations on w writer goroutines, writer g doing
// operations g, g+w, g+2w and so on as op(g, i), with the timer reset at
// the start; it times each op, and when all are done it stops the timer and
// reports their p50 and p99 latencies. An error fails the benchmark and
// ends its writer.
func timedWriters(b *testing.B, w int, op func(g, i int) error) {
	b.Helper()
	var mu sync.Mutex
	var lat []time.Duration
	var wg sync.WaitGroup
	b.ResetTimer()
	for g := range w {
		wg.Go(func() {
			for i := g; i < b.N; i += w {
				start := time.Now()
				if err := op(g, i); err != nil {
					b.Error(err)
					return
				}
				d := time.Since(start)
				mu.Lock()
				lat = append(lat, d)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	reportLatency(b, lat)
}

func writeTimed(ctx context.Context, c *client.Client, key chunk.Key, sgl []rdma.SGE, crc uint32) error {
	return c.WriteVersion(ctx, key, sgl, crc)
}

// benchKeys is how many resident versions the read benchmarks rotate over.
const benchKeys = 4

// writeResident writes benchKeys versions of one shard (chunks 1 to
// benchKeys, version 1) through c, from the first shard of env's memory, and
// returns their keys. A fresh chunkserver with 64 MiB keeps them resident.
func writeResident(b *testing.B, c *client.Client, env *chunktest.ClientEnv) []chunk.Key {
	b.Helper()
	keys := make([]chunk.Key, benchKeys)
	for i := range keys {
		keys[i] = chunk.Key{Chunk: uint64(i + 1), Version: 1}
		fill(env.Bytes()[:shard], keys[i])
		if err := c.WriteVersion(context.Background(), keys[i], []rdma.SGE{env.SGE(0, shard)}, store.Checksum(env.Bytes()[:shard])); err != nil {
			b.Fatal(err)
		}
	}
	return keys
}

// BenchmarkReadRatio interleaves, in one loop, blocks of raw RDMA_READs and of
// chunk protocol reads (cached lease + RDMA_READ) of resident 1 MiB shards on
// the same transport at depth 1, so that both see the same machine load, and
// reports both bandwidths and protocol/raw.
func BenchmarkReadRatio(b *testing.B) {
	a, t := rdmatest.Pair(b, openDev, rdmatest.PairConfig{MemSize: 4 * shard})
	s := chunktest.Start(b, chunktest.Options{Mem: 64 << 20})
	env := chunktest.NewClientEnv(b, 2*shard)
	c := env.Dial(b, s.Addr(), s.Secret)
	ctx := context.Background()
	keys := writeResident(b, c, env)
	var wcs [4]rdma.WorkCompletion
	raw := func(i int) {
		wr := []rdma.SendWR{{ID: uint64(i), Opcode: rdma.OpRDMARead, Flags: rdma.SendSignaled,
			SGL: []rdma.SGE{a.SGE(0, shard)}, RemoteAddr: t.Addr((i % 4) * shard), RKey: t.MR.RKey()}}
		if err := a.QP.PostSend(wr); err != nil {
			b.Fatal(err)
		}
		for a.SCQ.Poll(wcs[:]) == 0 {
			a.SCQ.Wait(ctx)
		}
		if wcs[0].Status != rdma.WCSuccess {
			b.Fatal(wcs[0].Status)
		}
	}
	sgl := []rdma.SGE{env.SGE(shard, shard)}
	proto := func(i int) {
		if _, err := c.ReadAt(ctx, keys[i%benchKeys], 0, sgl); err != nil {
			b.Fatal(err)
		}
	}
	for i := 0; i < 8; i++ { // warm up: leases, mappings
		raw(i)
		proto(i)
	}
	const block = 8
	var rawT, protoT time.Duration
	var n int
	b.SetBytes(2 * shard)
	b.ResetTimer()
	for n < b.N {
		start := time.Now()
		for i := 0; i < block; i++ {
			raw(n + i)
		}
		mid := time.Now()
		for i := 0; i < block; i++ {
			proto(n + i)
		}
		rawT += mid.Sub(start)
		protoT += time.Since(mid)
		n += block
	}
	mbps := func(d time.Duration) float64 { return float64(n) * shard / d.Seconds() / 1e6 }
	b.ReportMetric(mbps(rawT), "raw-MB/s")
	b.ReportMetric(mbps(protoT), "proto-MB/s")
	b.ReportMetric(rawT.Seconds()/protoT.Seconds(), "proto/raw")
}

// BenchmarkWriteRatio interleaves durable 1 MiB writes through the chunk protocol
// (prepare + RDMA_WRITE + commit) with plain pwrite+fdatasync appends of 1 MiB in
// the same directory, one of each per iteration, and reports both bandwidths,
// their ratio and the p50/p99 latency of each.
func BenchmarkWriteRatio(b *testing.B) {
	dir := benchDir(b)
	s := chunktest.Start(b, chunktest.Options{Dir: filepath.Join(dir, "chunkd"), Mem: 64 << 20})
	env := chunktest.NewClientEnv(b, shard)
	c := env.Dial(b, s.Addr(), s.Secret)
	ctx := context.Background()
	fill(env.Bytes()[:shard], chunk.Key{Chunk: 1, Version: 1})
	crc := store.Checksum(env.Bytes()[:shard])
	f, err := os.OpenFile(filepath.Join(dir, "baseline"), os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	buf := append([]byte(nil), env.Bytes()[:shard]...)
	var protoLat, baseLat []time.Duration
	b.SetBytes(2 * shard)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		if _, err := unix.Pwrite(int(f.Fd()), buf, int64(i)*shard); err != nil {
			b.Fatal(err)
		}
		if err := unix.Fdatasync(int(f.Fd())); err != nil {
			b.Fatal(err)
		}
		mid := time.Now()
		if err := c.WriteVersion(ctx, chunk.Key{Chunk: 1, Version: uint64(i + 1)}, []rdma.SGE{env.SGE(0, shard)}, crc); err != nil {
			b.Fatal(err)
		}
		baseLat = append(baseLat, mid.Sub(start))
		protoLat = append(protoLat, time.Since(mid))
	}
	b.StopTimer()
	sum := func(l []time.Duration) (t time.Duration) {
		for _, d := range l {
			t += d
		}
		return t
	}
	pct := func(l []time.Duration, p int) float64 {
		sort.Slice(l, func(i, j int) bool { return l[i] < l[j] })
		return float64(l[len(l)*p/100].Microseconds()) / 1000
	}
	mbps := func(d time.Duration) float64 { return float64(b.N) * shard / d.Seconds() / 1e6 }
	b.ReportMetric(mbps(sum(baseLat)), "pwrite-MB/s")
	b.ReportMetric(mbps(sum(protoLat)), "proto-MB/s")
	b.ReportMetric(sum(baseLat).Seconds()/sum(protoLat).Seconds(), "proto/pwrite")
	b.ReportMetric(pct(baseLat, 50), "pwrite-p50-ms")
	b.ReportMetric(pct(baseLat, 99), "pwrite-p99-ms")
	b.ReportMetric(pct(protoLat, 50), "proto-p50-ms")
	b.ReportMetric(pct(protoLat, 99), "proto-p99-ms")
}

// BenchmarkProtocolPatch times a 4 KiB patch of a resident 256 KiB shard (a
// database page rewritten in a stripe of a 1 MiB file under EC 4+2), each
// version derived from the one before, through the connection's slab and
// through a staging granted per patch:
//
//	go test -run '^$' -bench 'Patch' -benchtime 2000x ./chunkserver/
func BenchmarkProtocolPatch(b *testing.B) {
	for _, st := range stagings {
		b.Run(st.name, func(b *testing.B) {
			s := chunktest.Start(b, chunktest.Options{Dir: benchDir(b), Mem: 64 << 20, Config: st.cfg})
			env := chunktest.NewClientEnv(b, 4<<20)
			c := env.Dial(b, s.Addr(), s.Secret)
			ctx := context.Background()
			const size = 256 << 10
			fill(env.Bytes()[:size], chunk.Key{Chunk: 1, Version: 1})
			if err := c.WriteVersion(ctx, chunk.Key{Chunk: 1, Version: 1}, []rdma.SGE{env.SGE(0, size)}, store.Checksum(env.Bytes()[:size])); err != nil {
				b.Fatal(err)
			}
			ranges := []proto.PatchRange{{Off: 8192, Len: 4096}}
			sgl, crc := stagePatch(env, 1<<20, ranges, env.Bytes()[:size])
			timedWriters(b, 1, func(_, i int) error {
				_, err := c.WritePatch(ctx, chunk.Key{Chunk: 1, Version: uint64(i + 2)}, uint64(i+1), sgl, crc)
				return err
			})
		})
	}
}
