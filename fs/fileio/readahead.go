package fileio

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/rdmafs/rdmafs/chunkserver/chunk"
	"github.com/rdmafs/rdmafs/internal/stripe"
	"github.com/rdmafs/rdmafs/meta/metapb"
	"github.com/rdmafs/rdmafs/rdma"
)

// Readahead: while a file is read sequentially, whole stripes ahead of the
// reader are fetched in the background — all k data shards of a stripe with
// parallel RDMA_READs — into buffers of the engine's registered pool. The window
// starts at one stripe and doubles with every sequential read up to
// Config.ReadaheadStripes (the policy is seqWindow). Random reads fetch only
// what they ask for.
//
// A prefetched stripe is tied to the committed version it was read at: a read
// uses it only while the file's stripe map names that version, so an open that
// sees a newer commit (close-to-open) or a local write never reads stale bytes.
// Readahead memory is bounded engine-wide (Config.ReadaheadBytes); when it is
// short the oldest prefetched stripes of any file are dropped, and prefetching
// never waits for memory, so it can never hold up a writer.

// prefetch is one stripe's data fetched ahead of the reader. Its buffer holds
// the stripe's data shards at their unit offsets, laid out as in the file.
type prefetch struct {
	e       *Engine
	f       *file
	stripe  uint64
	version uint64
	length  int64 // bytes of file data in the stripe
	buf     *buffer
	done    chan struct{} // closed when the fetch ended; err is set then
	err     error
	refs    atomic.Int32 // the cache's reference, the fetch's, and readers'
	dropped atomic.Bool  // no longer in f.cache (set under f.mu)
}

// readaheadState is the engine's readahead bookkeeping.
type readaheadState struct {
	limit int64        // bytes of prefetched data allowed at once
	used  atomic.Int64 // bytes held by prefetched stripes
	mu    sync.Mutex
	fifo  []*prefetch // in the order they were started, for eviction
}

// unref drops a reference to pf; the last one returns its memory.
func (e *Engine) unref(pf *prefetch) {
	if pf.refs.Add(-1) == 0 {
		e.ra.used.Add(-int64(len(pf.buf.b)))
		e.pool.put(pf.buf)
	}
}

// dropLocked removes pf from its file's cache. The caller holds pf.f.mu.
func (e *Engine) dropLocked(pf *prefetch) {
	if pf.dropped.Swap(true) {
		return
	}
	delete(pf.f.cache, pf.stripe)
	e.unref(pf)
}

// dropCacheLocked drops every prefetched stripe of f. The caller holds f.mu.
func (e *Engine) dropCacheLocked(f *file) {
	for _, pf := range f.cache {
		e.dropLocked(pf)
	}
}

// cachedLocked returns the prefetched stripe s of f if it holds the committed
// version si names, with a reference the caller must drop; a stale one is
// dropped. The caller holds f.mu.
func (e *Engine) cachedLocked(f *file, s uint64, si *metapb.StripeInfo) *prefetch {
	pf := f.cache[s]
	if pf == nil {
		return nil
	}
	if si == nil || si.Version != pf.version {
		e.dropLocked(pf)
		return nil
	}
	pf.refs.Add(1)
	return pf
}

// readaheadLocked feeds the policy with a read of [off, end) and starts fetching
// the stripes of the window it asks for that are neither cached nor dirty.
// Stripes wholly behind the read are dropped. The caller holds f.mu.
func (e *Engine) readaheadLocked(ctx context.Context, f *file, off, end int64) {
	if e.ra.limit <= 0 {
		return
	}
	ss := f.lay.StripeSize()
	if f.readahead == nil {
		max := int64(e.cfg.ReadaheadStripes) * ss
		if f.readahead = newSeqWindow(ss, max); f.readahead == nil {
			return
		}
	}
	for s, pf := range f.cache {
		if int64(s+1)*ss <= off {
			e.dropLocked(pf)
		}
	}
	ahead := f.readahead.observe(off, end-off)
	if ahead == 0 {
		return
	}
	last := min(end+ahead, f.size)
	if last <= end {
		return
	}
	first, lastStripe := uint64(end/ss), uint64((last-1)/ss)
	for s := first; s <= lastStripe; s++ {
		if _, known := f.stripes[s]; !known {
			// Learn the committed versions of the window, and some more.
			if err := e.fetch(ctx, f, s, max(lastStripe-s+1, 16)); err != nil {
				return
			}
			break
		}
	}
	for s := first; s <= lastStripe; s++ {
		if f.cache[s] != nil || f.dirty[s] != nil || f.flushing[s] != nil {
			continue
		}
		si, known := f.stripes[s]
		if !known || si == nil || isInline(si) {
			continue // not in the map fetched for this read, a hole, or in memory already
		}
		if !e.startPrefetchLocked(f, s, si) {
			return
		}
	}
}

// startPrefetchLocked starts fetching stripe s at version si; it reports false
// when there is no memory for it even after evicting older prefetches. The
// caller holds f.mu.
func (e *Engine) startPrefetchLocked(f *file, s uint64, si *metapb.StripeInfo) bool {
	lay := f.lay
	n := lay.StripeSize()
	var buf *buffer
	for buf == nil {
		if e.ra.used.Load()+n <= e.ra.limit {
			buf = e.pool.tryGet(int(n))
		}
		if buf == nil && !e.evictOldest(f) {
			return false
		}
	}
	e.ra.used.Add(int64(len(buf.b)))
	pf := &prefetch{e: e, f: f, stripe: s, version: si.Version, length: int64(si.Length), buf: buf, done: make(chan struct{})}
	pf.refs.Store(2) // the cache's and the fetch's
	f.cache[s] = pf
	e.ra.mu.Lock()
	e.ra.fifo = append(e.ra.fifo, pf)
	if len(e.ra.fifo) >= 64 && len(e.ra.fifo) == cap(e.ra.fifo) {
		// Forget the entries read and dropped since, before the list grows.
		e.ra.fifo = slices.DeleteFunc(e.ra.fifo, func(p *prefetch) bool { return p.dropped.Load() })
	}
	e.ra.mu.Unlock()
	e.stats.ReadaheadStripes.Add(1)
	go e.fetchStripe(pf, lay, si)
	return true
}

// evictOldest drops the oldest prefetched stripe still cached (of f, whose lock
// the caller holds, or of a file whose lock is free); it reports false when
// there is none to drop.
func (e *Engine) evictOldest(f *file) bool {
	e.ra.mu.Lock()
	defer e.ra.mu.Unlock()
	for len(e.ra.fifo) > 0 {
		pf := e.ra.fifo[0]
		e.ra.fifo[0] = nil
		e.ra.fifo = e.ra.fifo[1:]
		if pf.dropped.Load() {
			continue
		}
		if pf.f == f {
			e.dropLocked(pf)
			return true
		}
		if !pf.f.mu.TryLock() {
			continue // busy: it is being read, so it is not the one to drop
		}
		dropped := pf.dropped.Load()
		e.dropLocked(pf)
		pf.f.mu.Unlock()
		if !dropped {
			return true
		}
	}
	return false
}

// fetchStripe reads the data shards of a committed stripe in parallel into
// pf's buffer. A failure is recorded: the reader then reads the range itself,
// degraded if need be.
func (e *Engine) fetchStripe(pf *prefetch, lay stripe.Layout, si *metapb.StripeInfo) {
	defer e.unref(pf)
	defer close(pf.done)
	ctx, cancel := context.WithTimeout(context.Background(), flushTimeout)
	defer cancel()
	lay = stripeLayout(si, lay)
	sl := int(lay.CodedLen(pf.length))
	unit := int(lay.Unit)
	errs := make(chan error, lay.K)
	for i := 0; i < lay.K; i++ {
		clear(pf.buf.b[i*unit+sl : (i+1)*unit])
		go func() {
			if i >= len(si.Shards) || int64(i)*lay.Unit >= pf.length {
				clear(pf.buf.b[i*unit : i*unit+sl])
				errs <- nil
				return
			}
			sh := si.Shards[i]
			n := int(lay.ShardLen(pf.length, i)) // zeros after the stored bytes
			clear(pf.buf.b[i*unit+n : i*unit+sl])
			errs <- e.readShard(ctx, sh, chunk.Key{Chunk: sh.ChunkId, Version: si.Version}, 0, []rdma.SGE{pf.buf.sge(i*unit, n)})
		}()
	}
	for range lay.K {
		if err := <-errs; err != nil && pf.err == nil {
			pf.err = err
		}
	}
}

// prefetchedView waits for pf and returns its bytes [so, so+n), or nil when
// they cannot be served in place (the fetch failed, or the range runs past
// the stripe's data, whose rest reads as zeros): the caller then copies or
// reads them. The caller's reference to pf stays with it either way.
func (e *Engine) prefetchedView(ctx context.Context, pf *prefetch, so int64, n int) ([]byte, error) {
	select {
	case <-pf.done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if pf.err != nil || so+int64(n) > pf.length {
		return nil, nil
	}
	e.stats.ReadaheadHits.Add(1)
	return pf.buf.b[so : so+int64(n) : so+int64(n)], nil
}

// Release drops a reader's reference to pf, taken for bytes ReadInPlace
// handed out.
func (pf *prefetch) Release() { pf.e.unref(pf) }

// copyPrefetched waits for pf and copies [so, so+len(dst)) of its stripe into
// dst; it reports false if the fetch failed (the caller reads it itself).
func (e *Engine) copyPrefetched(ctx context.Context, pf *prefetch, so int64, dst []byte) (bool, error) {
	select {
	case <-pf.done:
	case <-ctx.Done():
		return false, ctx.Err()
	}
	if pf.err != nil {
		return false, nil
	}
	n := copy(dst, pf.buf.b[so:max(so, min(so+int64(len(dst)), pf.length))])
	clear(dst[n:])
	e.stats.ReadaheadHits.Add(1)
	return true, nil
}
