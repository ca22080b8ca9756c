package fileio

// Reads: from dirty stripes, the readahead cache and the committed shards,
// and degraded reads that decode a stripe from the shards that answer.

import (
	"context"
	"fmt"
	"syscall"

	"github.com/rdmafs/rdmafs/chunkserver/chunk"
	"github.com/rdmafs/rdmafs/internal/stripe"
	"github.com/rdmafs/rdmafs/meta/metapb"
	"github.com/rdmafs/rdmafs/rdma"
)

// Read implements fs.Data. The file's lock is held only to look up what to
// read: the RDMA reads run without it, so the kernel's parallel readahead
// requests proceed in parallel.
func (e *Engine) Read(ctx context.Context, ino uint64, p []byte, off int64) (int, error) {
	n, _, _, err := e.read(ctx, ino, p, off, false)
	return n, err
}

// ReadInPlace reads like Read, except that when the whole range lies in one
// stripe already read ahead it returns those bytes where they are, in the
// engine's registered memory, instead of copying them into p: a sequential
// reader's data then crosses memory once less. Such bytes stay valid until
// release.Release is called, which must be called exactly once; release is nil
// when the bytes are p[:n]. A short count means end of file.
func (e *Engine) ReadInPlace(ctx context.Context, ino uint64, p []byte, off int64) ([]byte, interface{ Release() }, error) {
	n, view, pf, err := e.read(ctx, ino, p, off, true)
	switch {
	case err != nil:
		return nil, nil, err
	case pf != nil:
		return view, pf, nil
	default:
		return p[:n], nil, nil
	}
}

// read is Read and, with inPlace, ReadInPlace: when the range is one piece of
// a stripe read ahead, it returns that stripe's bytes (view) and the reference
// that keeps them (pf) instead of copying.
func (e *Engine) read(ctx context.Context, ino uint64, p []byte, off int64, inPlace bool) (n int, view []byte, pf *prefetch, err error) {
	if len(p) == 0 {
		return 0, nil, nil, nil
	}
	f := e.file(ino)
	f.mu.Lock()
	if err := e.fetch(ctx, f, 0, 0); err != nil {
		f.mu.Unlock()
		return 0, nil, nil, err
	}
	if err := e.waitFilled(ctx, f, off, off+int64(len(p))); err != nil {
		f.mu.Unlock()
		return 0, nil, nil, err
	}
	lay := f.lay
	ss := lay.StripeSize()
	end := min(off+int64(len(p)), f.size)
	if off >= end {
		f.mu.Unlock()
		return 0, nil, nil, nil
	}
	first, last := uint64(off/ss), uint64((end-1)/ss)
	if err := e.fetch(ctx, f, first, last-first+1); err != nil {
		f.mu.Unlock()
		return 0, nil, nil, err
	}
	end = min(end, f.size)
	type piece struct {
		si  *metapb.StripeInfo
		pf  *prefetch // the stripe fetched ahead, or nil
		so  int64
		dst []byte
		// A sparse dirty stripe: a copy of its writes over the range
		// full, applied after the read of si into dst.
		full   []byte
		writes []sparseWrite
	}
	var room [4]piece // a read spans few stripes: no allocation per read
	pieces := room[:0]
	for s := first; s <= last && int64(s)*ss < end; s++ {
		lo, hi := max(off, int64(s)*ss), min(end, int64(s+1)*ss)
		dst := p[lo-off : hi-off]
		so := lo - int64(s)*ss
		d := f.dirty[s]
		if fl := f.flushing[s]; d == nil && fl != nil && fl.buf == nil && fl.delta == nil {
			// A small file's stripe being committed into metadata from
			// its slabs (commitInline) has no buffer either: it reads
			// as the sparse stripe it is.
			d = fl
		}
		if d != nil && d.buf == nil {
			// Sparse: the committed bytes the writes are to be merged with
			// (read after the lock is let go), with a copy of the writes
			// over them.
			pc := piece{si: d.committed, so: so, dst: dst, full: dst, writes: d.copyWrites(so, int64(len(dst)))}
			if d.committed != nil {
				pc.dst = dst[:max(0, min(int64(len(dst)), d.fillEnd-so))]
			}
			clear(dst)
			pieces = append(pieces, pc)
			continue
		}
		if d != nil {
			if err := e.fill(ctx, f, d); err != nil {
				for _, pc := range pieces {
					if pc.pf != nil {
						e.unref(pc.pf)
					}
				}
				f.mu.Unlock()
				return 0, nil, nil, err
			}
		} else if d = f.flushing[s]; d != nil && d.delta != nil {
			// Flushing as a delta: its writes over the committed stripe
			// it builds on.
			pc := piece{si: d.delta.si, so: so, dst: dst, full: dst, writes: d.writtenIn(so, int64(len(dst)))}
			pieces = append(pieces, pc)
			continue
		}
		if d != nil {
			copy(dst, d.buf.b[so:so+int64(len(dst))])
			continue
		}
		si := f.stripes[s]
		pieces = append(pieces, piece{si: si, pf: e.cachedLocked(f, s, si), so: so, dst: dst})
	}
	e.readaheadLocked(ctx, f, off, end)
	f.mu.Unlock()
	if inPlace && len(pieces) == 1 && pieces[0].pf != nil && len(pieces[0].dst) == int(end-off) {
		pc := pieces[0]
		view, err := e.prefetchedView(ctx, pc.pf, pc.so, len(pc.dst))
		if err != nil {
			e.unref(pc.pf)
			return 0, nil, nil, err
		}
		if view != nil {
			return len(view), view, pc.pf, nil
		}
	}
	for _, pc := range pieces {
		if err != nil {
			if pc.pf != nil {
				e.unref(pc.pf)
			}
			continue
		}
		done := false
		if pc.pf != nil {
			done, err = e.copyPrefetched(ctx, pc.pf, pc.so, pc.dst)
			e.unref(pc.pf)
		}
		if !done && err == nil {
			err = e.readCommitted(ctx, ino, lay, pc.si, pc.so, pc.dst)
		}
		for _, w := range pc.writes {
			copy(pc.full[w.off-pc.so:], w.b)
		}
	}
	if err != nil {
		return 0, nil, nil, err
	}
	return int(end - off), nil, nil, nil
}

// readCommitted reads [so, so+len(dst)) of a committed stripe into dst; bytes
// past its length, and stripes never written, read as zeros.
func (e *Engine) readCommitted(ctx context.Context, ino uint64, lay stripe.Layout, si *metapb.StripeInfo, so int64, dst []byte) error {
	return e.readCommittedTo(ctx, ino, lay, si, so, dst, nil, 0)
}

// readCommittedTo is readCommitted; when into is not nil, dst is
// into.b[at:at+len(dst)] and the shards are read straight into it, taking no
// buffer memory (a dirty stripe's merge read holds its file's lock: waiting
// for memory there could wait for itself).
func (e *Engine) readCommittedTo(ctx context.Context, ino uint64, lay stripe.Layout, si *metapb.StripeInfo, so int64, dst []byte, into *buffer, at int) error {
	clear(dst)
	if si == nil || so >= int64(si.Length) {
		return nil
	}
	fileLay := lay
	lay = stripeLayout(si, lay)
	if isInline(si) {
		if so < int64(len(si.InlineData)) {
			copy(dst, si.InlineData[so:min(int64(len(si.InlineData)), int64(si.Length))])
		}
		return nil
	}
	n := min(int64(len(dst)), int64(si.Length)-so)
	if into == nil {
		tmp, err := e.pool.get(ctx, int(n))
		if err != nil {
			return err
		}
		defer e.pool.put(tmp)
		into, at = tmp, 0
	}
	// The data shards the range covers, each read with RDMA_READ.
	var failed bool
	for done := int64(0); done < n; {
		x := so + done
		shard, soff := int(x/lay.Unit), x%lay.Unit
		l := min(n-done, lay.Unit-soff)
		if shard >= len(si.Shards) {
			return fmt.Errorf("fileio: stripe %d of inode %d has %d shards: %w", si.Stripe, ino, len(si.Shards), syscall.EIO)
		}
		sh := si.Shards[shard]
		err := e.readShard(ctx, sh, chunk.Key{Chunk: sh.ChunkId, Version: si.Version}, int(soff), into.sgl(at+int(done), int(l)))
		if err != nil {
			e.log.Warn("fileio: shard read failed, reconstructing", "ino", ino, "stripe", si.Stripe, "shard", shard, "server", sh.Address, "err", err)
			failed = true
			break
		}
		done += l
	}
	if !failed {
		copy(dst, into.b[at:at+int(n)]) // a no-op when dst is into's
		return nil
	}
	// A merge read (into != nil) runs under the file lock: its degraded
	// read takes memory only if some is free now.
	wait := into == nil
	data, release, err := e.readStripeDegraded(ctx, ino, lay, si, wait)
	if err != nil {
		// Repair may have moved shards since the placement was cached:
		// look it up again and, if it changed, read from the new one.
		fresh, ferr := e.refreshStripe(ctx, ino, si)
		if ferr != nil || fresh == nil {
			return err
		}
		if data, release, err = e.readStripeDegraded(ctx, ino, stripeLayout(fresh, fileLay), fresh, wait); err != nil {
			return err
		}
	}
	defer release()
	copy(dst, data[so:so+n])
	return nil
}

// stripeLayout returns the layout stripe si is stored in: its own, which
// differs from its file's (fileLay) while the file is converted to another
// layout of the same stripe size (meta/core/relayout.go).
func stripeLayout(si *metapb.StripeInfo, fileLay stripe.Layout) stripe.Layout {
	l := si.GetLayout()
	if l == nil || l.K == 0 || l.Unit == 0 {
		return fileLay
	}
	if sl := l.Stripe(); sl.StripeSize() == fileLay.StripeSize() {
		return sl
	}
	return fileLay
}

// readShard RDMA_READs [off, ...) of shard sh's version key into sgl. It
// fails at once for a chunkserver this mount suspects; one that fails (or
// goes silent: its connection's stall timeout) becomes suspect.
func (e *Engine) readShard(ctx context.Context, sh *metapb.Shard, key chunk.Key, off int, sgl []rdma.SGE) error {
	c, p, err := e.conns.Get(ctx, sh.ServerId, sh.Address)
	if err != nil {
		return err
	}
	if _, err := c.ReadAt(ctx, key, off, sgl); err != nil {
		e.conns.Failed(ctx, p, err)
		return err
	}
	e.conns.Succeeded(p)
	return nil
}

// refreshStripe fetches the committed state of si's stripe again. It returns
// the new state, also cached, when it differs from si (repair moved shards,
// or a writer committed a new version), or nil when nothing changed.
func (e *Engine) refreshStripe(ctx context.Context, ino uint64, si *metapb.StripeInfo) (*metapb.StripeInfo, error) {
	r, err := e.cfg.Meta.GetStripes(ctx, &metapb.GetStripesRequest{Ino: ino, First: si.Stripe, Count: 1})
	if err != nil {
		return nil, err
	}
	if len(r.Stripes) != 1 || r.Stripes[0].Stripe != si.Stripe {
		return nil, nil
	}
	fresh := r.Stripes[0]
	if fresh.Version == si.Version && metapb.SameShards(fresh.Shards, si.Shards) {
		return nil, nil
	}
	// Cache it for later reads. Not here: the caller may hold the file's lock
	// (a partial overwrite merging with committed data reads under it).
	go func() {
		f := e.file(ino)
		f.mu.Lock()
		if f.stripes[si.Stripe] == si {
			f.stripes[si.Stripe] = fresh
		}
		f.mu.Unlock()
	}()
	if fresh.Version != si.Version && fresh.Length < si.Length {
		return nil, nil // rewritten shorter meanwhile: let the caller fail and retry
	}
	return fresh, nil
}

// readStripeDegraded reads every shard it can reach of a committed stripe and
// rebuilds the data from any k of them. It returns the stripe's data bytes
// (k*unit laid out shard after shard) and a function releasing the buffer.
// Without wait it fails with errNoBuffer when the buffer memory is short
// instead of waiting for some.
func (e *Engine) readStripeDegraded(ctx context.Context, ino uint64, lay stripe.Layout, si *metapb.StripeInfo, wait bool) ([]byte, func(), error) {
	n := lay.K + lay.M
	if len(si.Shards) != n {
		return nil, nil, fmt.Errorf("fileio: stripe %d has %d shards, layout %d+%d: %w", si.Stripe, len(si.Shards), lay.K, lay.M, syscall.EIO)
	}
	sl := lay.CodedLen(int64(si.Length))
	unit := int(lay.Unit)
	var buf *buffer
	var err error
	if wait {
		buf, err = e.pool.get(ctx, bufSize(lay))
	} else if buf = e.pool.tryGet(bufSize(lay)); buf == nil {
		err = errNoBuffer
	}
	if err != nil {
		return nil, nil, err
	}
	release := func() { e.pool.put(buf) }
	shards := make([][]byte, n)
	type result struct {
		i   int
		err error
	}
	results := make(chan result, n)
	for i, sh := range si.Shards {
		// A shard is read as stored and counts as zeros after that, up to
		// the coded length (stripes written before short stripes store
		// every shard at the coded length: the read is then shorter).
		n := int(lay.ShardLen(int64(si.Length), i))
		clear(buf.b[i*unit+n : i*unit+int(sl)])
		go func() {
			err := e.readShard(ctx, sh, chunk.Key{Chunk: sh.ChunkId, Version: si.Version}, 0, []rdma.SGE{buf.sge(i*unit, n)})
			results <- result{i, err}
		}()
	}
	ok := 0
	var lastErr error
	for range n {
		r := <-results
		if r.err != nil {
			lastErr = r.err
			continue
		}
		shards[r.i] = buf.b[r.i*unit : r.i*unit+int(sl)]
		ok++
	}
	if ok < lay.K {
		release()
		return nil, nil, fmt.Errorf("fileio: stripe %d of inode %d: %d of %d shards readable, %d needed (last error: %v): %w",
			si.Stripe, ino, ok, n, lay.K, lastErr, syscall.EIO)
	}
	if ok < n {
		e.stats.DegradedReads.Add(1)
		if lay.K == 1 {
			for _, s := range shards {
				if s != nil {
					copy(buf.b[:sl], s)
					break
				}
			}
		} else {
			enc, err := e.codecs.Get(lay.K, lay.M)
			if err != nil {
				release()
				return nil, nil, err
			}
			// Missing data shards are rebuilt in place: give them their slot
			// with zero length and the capacity of the shard.
			for i := 0; i < lay.K; i++ {
				if shards[i] == nil {
					shards[i] = buf.b[i*unit : i*unit : i*unit+int(sl)]
				}
			}
			if err := enc.ReconstructData(shards); err != nil {
				release()
				return nil, nil, fmt.Errorf("fileio: reconstruct stripe %d of inode %d: %w", si.Stripe, ino, err)
			}
		}
	}
	// Data shards hold sl bytes each at their unit offset; zero the rest so the
	// stripe reads as laid out in the file.
	for i := 0; i < lay.K; i++ {
		clear(buf.b[i*unit+int(sl) : (i+1)*unit])
	}
	return buf.b[:lay.K*unit], release, nil
}
