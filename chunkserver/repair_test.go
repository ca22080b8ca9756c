package chunkserver_test

import (
	"bytes"
	"context"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/klauspost/reedsolomon"

	"github.com/rdmafs/rdmafs/chunkserver"
	"github.com/rdmafs/rdmafs/chunkserver/chunk"
	"github.com/rdmafs/rdmafs/chunkserver/chunktest"
	"github.com/rdmafs/rdmafs/chunkserver/store"
	"github.com/rdmafs/rdmafs/internal/stripe"
)

// fakePlanner hands out queued tasks and records what chunkd reports.
type fakePlanner struct {
	mu      sync.Mutex
	tasks   []chunkserver.RepairTask
	results chan chunkserver.RepairResult
	corrupt map[chunk.Key]bool
}

func newFakePlanner() *fakePlanner {
	return &fakePlanner{results: make(chan chunkserver.RepairResult, 16), corrupt: map[chunk.Key]bool{}}
}

func (p *fakePlanner) RepairPoll(ctx context.Context, id string, results []chunkserver.RepairResult, corrupt []chunk.Key, want int) ([]chunkserver.RepairTask, error) {
	for _, r := range results {
		p.results <- r
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, k := range corrupt {
		p.corrupt[k] = true
	}
	n := min(want, len(p.tasks))
	out := p.tasks[:n:n]
	p.tasks = p.tasks[n:]
	return out, nil
}

func (p *fakePlanner) add(t chunkserver.RepairTask) {
	p.mu.Lock()
	p.tasks = append(p.tasks, t)
	p.mu.Unlock()
}

func (p *fakePlanner) reported(k chunk.Key) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.corrupt[k]
}

// corruptOnDisk flips a data byte of the only stored version in dir.
func corruptOnDisk(t *testing.T, dir string) {
	t.Helper()
	done := false
	filepath.WalkDir(filepath.Join(dir, "chunks"), func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || done {
			return err
		}
		if fi, err := d.Info(); err == nil && fi.Size() > store.DataOffset {
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			var b [1]byte
			f.ReadAt(b[:], store.DataOffset+100)
			b[0] ^= 0xff
			if _, err := f.WriteAt(b[:], store.DataOffset+100); err != nil {
				t.Fatal(err)
			}
			done = true
		}
		return nil
	})
	if !done {
		t.Fatal("no stored version to corrupt")
	}
}

// TestRepairWorker runs real chunkservers: six hold the shards of a 4+2
// stripe, a seventh rebuilds one with RDMA_READs of the others and stores
// it. A survivor whose copy is corrupt on disk is skipped and reported. A
// short stripe (its data shards stored with their own bytes only) is rebuilt
// from shards of different lengths into the stored length of its shard.
func TestRepairWorker(t *testing.T) {
	const k, m, length = 4, 2, 64 << 10
	const short = length + 5000 // a stripe of 1 full data shard and 5000 bytes
	tests := []struct {
		name        string
		shard       int  // the shard to build
		available   bool // its own copy is readable (a move)
		unavailable []int
		corrupt     int   // a source whose copy is damaged (-1: none)
		stripeLen   int64 // the stripe's data bytes, short stripes (0: every shard the same length)
		wantFail    bool
	}{
		{"lost parity shard", 5, false, []int{5}, -1, 0, false},
		{"lost data shard, a survivor corrupt", 0, false, []int{0}, 2, 0, false},
		{"move of a readable shard", 3, true, nil, -1, 0, false},
		{"two lost, one corrupt: too few", 0, false, []int{0, 1}, 2, 0, true},
		{"short stripe: lost short data shard", 1, false, []int{1}, -1, short, false},
		{"short stripe: lost parity and data shard 0", 4, false, []int{4, 0}, -1, short, false},
		{"short stripe: lost data shard 0", 0, false, []int{0, 5}, -1, short, false},
	}
	for ti, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rnd := rand.New(rand.NewPCG(uint64(ti), 7))
			shards := make([][]byte, k+m)
			for i := range shards {
				shards[i] = make([]byte, length)
				if i < k {
					for j := range shards[i] {
						shards[i][j] = byte(rnd.Uint32())
					}
				}
			}
			stored := func(i int) int { return length }
			if tt.stripeLen > 0 {
				stored = func(i int) int { return int(stripe.ShardLen(tt.stripeLen, length, k, i)) }
				for i := 0; i < k; i++ { // data past the stripe's end is zeros
					clear(shards[i][min(max(tt.stripeLen-int64(i)*length, 0), length):])
				}
			}
			enc, err := reedsolomon.New(k, m)
			if err != nil {
				t.Fatal(err)
			}
			if err := enc.Encode(shards); err != nil {
				t.Fatal(err)
			}
			const version = 3
			planners := make([]*fakePlanner, k+m)
			task := chunkserver.RepairTask{ID: 1, Key: chunk.Key{Chunk: 900, Version: version}, Shard: tt.shard, K: k, M: m}
			if tt.stripeLen > 0 {
				task.Length, task.Unit = tt.stripeLen, length
			}
			for i := 0; i < k+m; i++ {
				planners[i] = newFakePlanner()
				s := chunktest.Start(t, chunktest.Options{Mem: 8 << 20,
					Config: chunkserver.Config{Repair: chunkserver.RepairConfig{Planner: planners[i], PollInterval: 20 * time.Millisecond}}})
				key := chunk.Key{Chunk: uint64(100 + i), Version: version}
				if err := s.Store.Put(key, shards[i][:stored(i)], store.Checksum(shards[i][:stored(i)])); err != nil {
					t.Fatal(err)
				}
				if i == tt.corrupt {
					corruptOnDisk(t, s.Dir)
				}
				avail := true
				for _, u := range tt.unavailable {
					avail = avail && u != i
				}
				if i == tt.shard {
					avail = tt.available
				}
				task.Sources = append(task.Sources, chunkserver.ShardSource{Addr: s.Addr(), Key: key, Available: avail})
			}
			planner := newFakePlanner()
			target := chunktest.Start(t, chunktest.Options{Mem: 8 << 20,
				Config: chunkserver.Config{Repair: chunkserver.RepairConfig{Planner: planner, PollInterval: 20 * time.Millisecond,
					Bandwidth: 64 << 20, MemBytes: 4 << 20}}})
			planner.add(task)
			var res chunkserver.RepairResult
			select {
			case res = <-planner.results:
			case <-time.After(20 * time.Second):
				t.Fatal("no repair result")
			}
			if tt.wantFail {
				if res.Err == nil {
					t.Fatal("repair with too few readable shards succeeded")
				}
				if _, err := target.Store.Stat(task.Key); err == nil {
					t.Fatal("a failed repair left a version behind")
				}
				return
			}
			want := shards[tt.shard][:stored(tt.shard)]
			if res.Err != nil || res.Bytes != len(want) {
				t.Fatalf("result %+v, want %d bytes", res, len(want))
			}
			got := make([]byte, length)
			info, err := target.Store.ReadInto(task.Key, got)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got[:info.Length], want) {
				t.Fatalf("rebuilt shard (%d bytes) differs from the original (%d bytes)", info.Length, len(want))
			}
			if tt.corrupt >= 0 {
				bad := chunk.Key{Chunk: uint64(100 + tt.corrupt), Version: version}
				deadline := time.Now().Add(10 * time.Second)
				for !planners[tt.corrupt].reported(bad) {
					if time.Now().After(deadline) {
						t.Fatal("the corrupt copy was not reported")
					}
					time.Sleep(10 * time.Millisecond)
				}
			}
		})
	}
}
