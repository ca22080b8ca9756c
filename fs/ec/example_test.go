package ec_test

import (
	"fmt"

	"github.com/rdmafs/rdmafs/fs/ec"
)

// A file I/O engine maps a read to per-shard extents, and rebuilds a stripe
// when a chunkserver is down.
func Example() {
	l := ec.Layout{K: 4, M: 2, Unit: 4096}
	if err := l.Validate(); err != nil {
		panic(err)
	}
	// Which shards does reading 6000 bytes at offset 15000 touch?
	exts, _ := l.Extents(nil, 15000, 6000)
	for _, e := range exts {
		fmt.Println(e)
	}

	// The last stripe of a 5000-byte file: data shard 0 full, shard 1 has 904
	// bytes, shards 2 and 3 are beyond the end and not stored.
	c, _ := ec.NewCodec(l)
	n := int64(5000)
	data := make([]byte, n)
	for i := range data {
		data[i] = byte(i)
	}
	L := l.ShardLen(n)
	shards := [][]byte{data[:4096], data[4096:], nil, nil, make([]byte, L), make([]byte, L)}
	if err := c.Encode(shards); err != nil {
		panic(err)
	}

	// Lose data shards 0 and 1; rebuild them into buffers of the engine's.
	degraded := [][]byte{make([]byte, 0, L), make([]byte, 0, L), nil, nil, shards[4], shards[5]}
	if err := c.ReconstructData(degraded, n); err != nil {
		panic(err)
	}
	fmt.Println(len(degraded[0]), len(degraded[1]), degraded[1][0] == data[4096])
	// Output:
	// {stripe 0 shard 3 [2712,+1384) buf 0}
	// {stripe 1 shard 0 [0,+4096) buf 1384}
	// {stripe 1 shard 1 [0,+520) buf 5480}
	// 4096 904 true
}
