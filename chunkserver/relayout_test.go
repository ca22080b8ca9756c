package chunkserver_test

import (
	"bytes"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/klauspost/reedsolomon"

	"github.com/rdmafs/rdmafs/chunkserver"
	"github.com/rdmafs/rdmafs/chunkserver/chunk"
	"github.com/rdmafs/rdmafs/chunkserver/chunktest"
	"github.com/rdmafs/rdmafs/chunkserver/store"
	"github.com/rdmafs/rdmafs/internal/stripe"
)

// storedShards returns the shards of a stripe holding data in layout k+m
// with unit bytes per shard, each as stored (short stripes: data shards
// with their own bytes, parity at the coded length).
func storedShards(t *testing.T, data []byte, k, m int, unit int64) [][]byte {
	t.Helper()
	length := int64(len(data))
	cl := stripe.CodedLen(length, unit)
	shards := make([][]byte, k+m)
	for i := range shards {
		shards[i] = make([]byte, cl)
		if i < k {
			lo := min(int64(i)*unit, length)
			copy(shards[i], data[lo:min(lo+cl, length)])
		}
	}
	switch {
	case m == 0:
	case k == 1:
		for i := 1; i < len(shards); i++ {
			copy(shards[i], shards[0])
		}
	default:
		enc, err := reedsolomon.New(k, m)
		if err != nil {
			t.Fatal(err)
		}
		if err := enc.Encode(shards); err != nil {
			t.Fatal(err)
		}
	}
	for i := range shards {
		shards[i] = shards[i][:stripe.ShardLen(length, unit, k, i)]
	}
	return shards
}

// TestRelayoutWorker runs real chunkservers: the sources hold a stripe in
// one layout, and a target builds each shard of the same bytes in another
// layout of the same stripe size, reading the sources (decoding when a
// source cannot be read); every shard it stores equals the one an encoder
// makes of the bytes.
func TestRelayoutWorker(t *testing.T) {
	tests := []struct {
		name         string
		fromK, fromM int
		toK, toM     int
		stripeSize   int64
		length       int64
		unavailable  []int
	}{
		{"replication to 4+2", 1, 2, 4, 2, 256 << 10, 256 << 10, nil},
		{"replication to 4+2, a short stripe, first copy down", 1, 2, 4, 2, 256 << 10, 70000, []int{0}},
		{"4+2 to replication, a data shard down", 4, 2, 1, 2, 256 << 10, 256 << 10, []int{1}},
		{"2+1 to 4+2, a short stripe, a data shard down", 2, 1, 4, 2, 256 << 10, 150000, []int{0}},
		{"an empty stripe", 4, 2, 1, 2, 256 << 10, 0, nil},
	}
	for ti, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			data := make([]byte, tt.length)
			rand.NewChaCha8([32]byte{byte(ti)}).Read(data)
			fromUnit, toUnit := tt.stripeSize/int64(tt.fromK), tt.stripeSize/int64(tt.toK)
			src := storedShards(t, data, tt.fromK, tt.fromM, fromUnit)
			want := storedShards(t, data, tt.toK, tt.toM, toUnit)
			const version = 4
			var sources []chunkserver.ShardSource
			for i, sh := range src {
				s := chunktest.Start(t, chunktest.Options{Mem: 8 << 20,
					Config: chunkserver.Config{Repair: chunkserver.RepairConfig{Planner: newFakePlanner(), PollInterval: 20 * time.Millisecond}}})
				key := chunk.Key{Chunk: uint64(100 + i), Version: version}
				if err := s.Store.Put(key, sh, store.Checksum(sh)); err != nil {
					t.Fatal(err)
				}
				avail := true
				for _, u := range tt.unavailable {
					avail = avail && u != i
				}
				sources = append(sources, chunkserver.ShardSource{Addr: s.Addr(), Key: key, Available: avail})
			}
			planner := newFakePlanner()
			target := chunktest.Start(t, chunktest.Options{Mem: 8 << 20,
				Config: chunkserver.Config{Repair: chunkserver.RepairConfig{Planner: planner, PollInterval: 20 * time.Millisecond,
					Bandwidth: 64 << 20, MemBytes: 4 << 20}}})
			for j := range tt.toK + tt.toM {
				task := chunkserver.RepairTask{ID: uint64(j + 1), Key: chunk.Key{Chunk: uint64(900 + j), Version: version + 1}, Shard: j,
					K: tt.fromK, M: tt.fromM, Length: tt.length, Unit: fromUnit, Sources: sources,
					To: &chunkserver.RelayoutTarget{K: tt.toK, M: tt.toM, Unit: toUnit}}
				planner.add(task)
				var res chunkserver.RepairResult
				select {
				case res = <-planner.results:
				case <-time.After(20 * time.Second):
					t.Fatal("no result")
				}
				if res.Err != nil || res.Bytes != len(want[j]) {
					t.Fatalf("shard %d: result %+v, want %d bytes", j, res, len(want[j]))
				}
				got := make([]byte, toUnit)
				info, err := target.Store.ReadInto(task.Key, got)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got[:info.Length], want[j]) {
					t.Fatalf("shard %d of %d+%d (%d bytes) differs from the encoder's (%d bytes)", j, tt.toK, tt.toM, info.Length, len(want[j]))
				}
			}
		})
	}
}
