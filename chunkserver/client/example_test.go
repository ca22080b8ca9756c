package client_test

import (
	"context"
	"log"

	"github.com/rdmafs/rdmafs/chunkserver/chunk"
	"github.com/rdmafs/rdmafs/chunkserver/client"
	"github.com/rdmafs/rdmafs/chunkserver/store"
	"github.com/rdmafs/rdmafs/rdma"
	"github.com/rdmafs/rdmafs/rdma/transport"
)

// Example shows the calls the FUSE client makes: register buffers once, keep a
// pool of connections, write a shard as a new version, read it back through the
// lease cache.
func Example() {
	ctx := context.Background()
	dev, err := transport.Open("auto", nil)
	if err != nil {
		log.Fatal(err)
	}
	pd, _ := dev.AllocPD()
	mem, _ := rdma.AllocMemory("shards", 8<<20) // registered once, reused for all I/O
	mr, _ := pd.RegisterMemory(mem, rdma.AccessLocalWrite)
	sge := func(off, n int) rdma.SGE {
		return rdma.SGE{Addr: mr.Addr() + uint64(off), Length: uint32(n), LKey: mr.LKey()}
	}

	pool := client.NewPool(dev, pd, client.Options{Secret: []byte("cluster secret")}, nil, nil)
	defer pool.Close()
	c, _, err := pool.Get(ctx, "", "127.0.0.1:7400")
	if err != nil {
		log.Fatal(err)
	}

	key := chunk.Key{Chunk: 42, Version: 7}
	shard := mem.Bytes()[:1<<20]
	// ... fill shard ...
	if err := c.WriteVersion(ctx, key, []rdma.SGE{sge(0, len(shard))}, store.Checksum(shard)); err != nil {
		log.Fatal(err) // the previous version is untouched
	}
	// Read 64 KiB at offset 128 KiB into two buffers; the lease is cached, so a
	// repeated read is a single RDMA_READ.
	if _, err := c.ReadAt(ctx, key, 128<<10, []rdma.SGE{sge(2<<20, 32<<10), sge(4<<20, 32<<10)}); err != nil {
		log.Fatal(err)
	}
}
