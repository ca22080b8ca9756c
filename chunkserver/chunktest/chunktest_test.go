package chunktest_test

import (
	"context"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/chunkserver/chunk"
	"github.com/rdmafs/rdmafs/chunkserver/chunktest"
	"github.com/rdmafs/rdmafs/chunkserver/store"
	"github.com/rdmafs/rdmafs/rdma"
)

func TestStartN(t *testing.T) {
	servers := chunktest.StartN(t, 3, chunktest.Options{Mem: 16 << 20})
	env := chunktest.NewClientEnv(t, 1<<20)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ids := map[string]bool{}
	for i, s := range servers {
		ids[s.ID()] = true
		c := env.Dial(t, s.Addr(), s.Secret)
		key := chunk.Key{Chunk: uint64(i), Version: 1}
		b := env.Bytes()[:4096]
		b[0] = byte(i)
		if err := c.WriteVersion(ctx, key, []rdma.SGE{env.SGE(0, 4096)}, store.Checksum(b)); err != nil {
			t.Fatal(err)
		}
	}
	if len(ids) != 3 {
		t.Fatalf("ids not distinct: %v", ids)
	}
	servers[1].Stop()
	if _, err := env.Dial(t, servers[2].Addr(), servers[2].Secret).Stat(ctx, chunk.Key{Chunk: 2, Version: 1}); err != nil {
		t.Fatal(err)
	}
}
