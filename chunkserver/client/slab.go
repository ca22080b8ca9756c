package client

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmafs/rdmafs/chunkserver/chunk"
	"github.com/rdmafs/rdmafs/chunkserver/proto"
	"github.com/rdmafs/rdmafs/rdma"
)

// SlabPart is the size of the parts a connection's slab is cut into: a patch
// of at most this many bytes is written through the slab, one patch per part
// at a time.
const SlabPart = 32 << 10

// slab is a connection's staging slab on chunkd (proto.OpSlab), asked for by
// the first patch that fits a part of it, and again at most once a second
// while chunkd refuses it.
type slab struct {
	mu     sync.Mutex               // held while asking for the slab
	asked  time.Time                // when it was last asked for, under mu
	free   atomic.Pointer[chan int] // the parts not in use, by index; nil: no slab yet
	addr   uint64
	rkey   uint32
	length int
}

// slabRetry is how long a connection whose slab chunkd refused (busy, or
// the request failed) stages its patches before it asks again.
const slabRetry = time.Second

// slabPart takes a free part of the slab for a patch of n bytes, asking chunkd
// for the slab first if this connection has none. ok is false when the patch
// must be staged the usual way: chunkd offers no slab or refused it lately,
// the patch is larger than a part, every part is in use, or another patch is
// asking for the slab at this moment.
func (c *Client) slabPart(ctx context.Context, n int) (part int, ok bool) {
	if c.limits.Slab < SlabPart || n > SlabPart || c.limits.MaxBatch < 2 {
		return 0, false
	}
	free := c.slab.free.Load()
	if free == nil {
		if free = c.askSlab(ctx); free == nil {
			return 0, false
		}
	}
	select {
	case part := <-*free:
		return part, true
	default:
		return 0, false
	}
}

// askSlab asks chunkd for the connection's slab unless another caller is
// asking or it was refused less than slabRetry ago, and returns its free
// parts (nil: no slab).
func (c *Client) askSlab(ctx context.Context) *chan int {
	sl := &c.slab
	if !sl.mu.TryLock() {
		return nil
	}
	defer sl.mu.Unlock()
	if free := sl.free.Load(); free != nil || time.Since(sl.asked) < slabRetry {
		return free
	}
	sl.asked = time.Now()
	rep, err := c.do1(ctx, proto.Request{Op: proto.OpSlab})
	if err != nil || int(rep.Length) < SlabPart {
		return nil
	}
	parts := int(rep.Length) / SlabPart
	sl.addr, sl.rkey, sl.length = rep.Addr, rep.RKey, int(rep.Length)
	free := make(chan int, parts)
	for i := range parts {
		free <- i
	}
	sl.free.Store(&free) // publishes addr, rkey and length with it
	return &free
}

// writePatchSlab writes the n-byte patch in sgl through part of the slab:
// RDMA_WRITE into the part, then OpPatchSlab and OpCommit (crc, as for
// WritePatch) in one message, which the connection delivers after the written
// bytes. The part is free again once chunkd answered (it copies the patch
// when it serves OpPatchSlab); after a failed exchange it is not reused, since
// chunkd may still read it.
func (c *Client) writePatchSlab(ctx context.Context, key chunk.Key, base chunk.Version, sgl []rdma.SGE, n int, crc uint32, part int) (chunk.Info, error) {
	off := part * SlabPart
	o, err := c.startOneSided(ctx, rdma.OpRDMAWrite, c.slab.addr, c.slab.rkey, c.slab.length, off, sgl)
	if err != nil {
		*c.slab.free.Load() <- part // nothing was posted
		return chunk.Info{}, fmt.Errorf("write %v: %w", key, err)
	}
	reps, err := c.Do(ctx, []proto.Request{
		{Op: proto.OpPatchSlab, Chunk: key.Chunk, Version: key.Version, Base: base, Length: uint32(n), Slab: uint32(off)},
		{Op: proto.OpCommit, Chunk: key.Chunk, Version: key.Version, CRC: crc},
	})
	werr := c.finishOneSided(ctx, o, rdma.OpRDMAWrite)
	if err != nil {
		return chunk.Info{}, fmt.Errorf("patch %v: %w", key, err)
	}
	if werr != nil {
		return chunk.Info{}, fmt.Errorf("write %v: %w", key, werr)
	}
	*c.slab.free.Load() <- part
	if err := reps[0].Status.Err(proto.OpPatchSlab); err != nil {
		return chunk.Info{}, fmt.Errorf("prepare %v: %w", key, err)
	}
	if err := reps[1].Status.Err(proto.OpCommit); err != nil {
		return chunk.Info{}, fmt.Errorf("commit %v: %w", key, err)
	}
	return chunk.Info{Key: key, Length: reps[1].Length, CRC: reps[1].CRC}, nil
}
