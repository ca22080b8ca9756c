package metamember

import (
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/rdmafs/rdmafs/meta/metapb"
)

// FuzzTaskFromPB feeds arbitrary RepairPoll replies (bytes from the network,
// decoded by protobuf) through the conversion into chunkd repair tasks: it
// must never panic, and every task has one source per shard.
func FuzzTaskFromPB(f *testing.F) {
	seed, _ := proto.Marshal(&metapb.RepairPollReply{Tasks: []*metapb.RepairTask{{TaskId: 1, Version: 2, NewChunkId: 3,
		Layout: &metapb.Layout{K: 4, M: 2, Unit: 1 << 20}, Shard: 5, Unavailable: []uint32{5, 99},
		Sources: []*metapb.Shard{{ChunkId: 1, Address: "127.0.0.1:1"}, {ChunkId: 2}}}}})
	f.Add(seed)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		r := &metapb.RepairPollReply{}
		if proto.Unmarshal(b, r) != nil {
			return
		}
		for _, pt := range r.Tasks {
			task := TaskFromPB(pt)
			if len(task.Sources) != len(pt.Sources) {
				t.Fatalf("%d sources from %d shards", len(task.Sources), len(pt.Sources))
			}
			for _, s := range task.Sources {
				if s.Available && s.Addr == "" {
					t.Fatal("a source without an address is marked available")
				}
			}
		}
	})
}
