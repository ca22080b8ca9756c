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
			keys := make([]chunk.Key, 4)
			for i := range keys {
				keys[i] = chunk.Key{Chunk: uint64(i + 1), Version: 1}
				fill(env.Bytes()[:shard], keys[i])
				if err := c.WriteVersion(ctx, keys[i], []rdma.SGE{env.SGE(0, shard)}, store.Checksum(env.Bytes()[:shard])); err != nil {
					b.Fatal(err)
				}
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
				wg.Add(1)
				go func(g, n int) {
					defer wg.Done()
					sgl := []rdma.SGE{env.SGE(g*shard, shard)}
					for i := 0; i < n; i++ {
						if _, err := c.ReadAt(ctx, keys[(g+i)%benchKeys], 0, sgl); err != nil {
							b.Error(err)
							return
						}
					}
				}(g, n)
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
				var mu sync.Mutex
				var lat []time.Duration
				b.SetBytes(shard)
				b.ResetTimer()
				var wg sync.WaitGroup
				for g := 0; g < w; g++ {
					wg.Add(1)
					go func(g int) {
						defer wg.Done()
						f, err := os.OpenFile(filepath.Join(dir, fmt.Sprintf("f%d", g)), os.O_CREATE|os.O_WRONLY, 0o644)
						if err != nil {
							b.Error(err)
							return
						}
						defer f.Close()
						for i := g; i < b.N; i += w {
							start := time.Now()
							fd, off := int(f.Fd()), int64(i/w)*shard
							if mode == "newfile" {
								if fd, err = unix.Open(filepath.Join(dir, fmt.Sprintf("n%d", i)), unix.O_CREAT|unix.O_WRONLY|unix.O_EXCL, 0o644); err != nil {
									b.Error(err)
									return
								}
								off = 0
							}
							if _, err := unix.Pwrite(fd, buf, off); err != nil {
								b.Error(err)
								return
							}
							if err := unix.Fdatasync(fd); err != nil {
								b.Error(err)
								return
							}
							if mode == "newfile" {
								unix.Close(fd)
							}
							d := time.Since(start)
							mu.Lock()
							lat = append(lat, d)
							mu.Unlock()
						}
					}(g)
				}
				wg.Wait()
				b.StopTimer()
				reportLatency(b, lat)
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
			for g := range conns {
				conns[g] = env.Dial(b, s.Addr(), s.Secret)
			}
			ctx := context.Background()
			var mu sync.Mutex
			var lat []time.Duration
			b.SetBytes(shard)
			b.ResetTimer()
			var wg sync.WaitGroup
			for g := 0; g < w; g++ {
				fill(env.Bytes()[g*shard:(g+1)*shard], chunk.Key{Chunk: 1, Version: 1})
				crc := store.Checksum(env.Bytes()[g*shard : (g+1)*shard])
				wg.Add(1)
				go func(g int) {
					defer wg.Done()
					sgl := []rdma.SGE{env.SGE(g*shard, shard)}
					for i := g; i < b.N; i += w {
						key := chunk.Key{Chunk: uint64(g + 1), Version: uint64(i + 1)}
						start := time.Now()
						if err := writeTimed(ctx, conns[g], key, sgl, crc); err != nil {
							b.Error(err)
							return
						}
						d := time.Since(start)
						mu.Lock()
						lat = append(lat, d)
						mu.Unlock()
					}
				}(g)
			}
			wg.Wait()
			b.StopTimer()
			reportLatency(b, lat)
		})
	}
}

func writeTimed(ctx context.Context, c *client.Client, key chunk.Key, sgl []rdma.SGE, crc uint32) error {
	return c.WriteVersion(ctx, key, sgl, crc)
}

// benchKeys is how many resident versions the read benchmark rotates over.
const benchKeys = 4
