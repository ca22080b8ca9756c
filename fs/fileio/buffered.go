package fileio

// Write buffering: writes go into dirty stripes, which take buffer memory
// (or slabs, for sparse writes) and are filled from the committed data when
// a flush needs them whole.

import (
	"context"
	"fmt"

	"github.com/rdmafs/rdmafs/internal/stripe"
)

// Write implements fs.Data. A stripe whose bytes have all been written starts
// flushing at once in the background while the writer goes on (write-behind).
func (e *Engine) Write(ctx context.Context, ino uint64, p []byte, off int64) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	f := e.file(ino)
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := e.fetch(ctx, f, 0, 0); err != nil {
		return 0, err
	}
	ss := f.lay.StripeSize()
	end := off + int64(len(p))
	for s := uint64(off / ss); int64(s)*ss < end; s++ {
		lo, hi := max(off, int64(s)*ss), min(end, int64(s+1)*ss)
		so, sh := lo-int64(s)*ss, hi-int64(s)*ss
		d, err := e.dirtyStripe(ctx, f, s, so, sh)
		if err != nil {
			return int(max(lo-off, 0)), err
		}
		if d.buf == nil {
			grew := e.addSparse(d, so, p[lo-off:hi-off])
			e.addBuf(f, grew)
			f.sparse += grew
			e.sparseTotal.Add(int64(grew))
		} else {
			d.zeroTo(so)
			copy(d.buf.b[so:], p[lo-off:hi-off])
			d.clean = max(d.clean, sh)
		}
		d.length = max(d.length, sh)
		d.addExtent(so, sh)
		// A sparse stripe becomes whole once its writes fill half of it,
		// or once a small file written in order outgrows the inline size.
		// A random writer's stripes stay in slabs (4 KiB per 4 KiB write,
		// where a whole stripe takes (K+M) units) and gather more writes
		// before memory forces a flush (docs/performance.md).
		if d.buf == nil && (int64(d.sparseBytes()) >= ss/2 || (d.covers(sh) && !inlineSized(f.lay, s, sh))) {
			if buf := e.pool.tryGet(bufSize(f.lay)); buf != nil {
				e.materialize(f, d, buf)
			}
		}
		if d.covers(ss) {
			e.startFlush(f, []uint64{s})
		}
	}
	f.size = max(f.size, end)
	// Whole-stripe buffers are bounded by the file's dirty limit; a random
	// writer's sparse writes (heap memory, not buffer memory) by half of
	// the engine's memory, for all files together and for one: the more
	// writes a stripe gathers, the fewer times it is rewritten.
	for f.bufBytes-f.sparse > e.cfg.FileDirtyLimit || f.sparse > e.cfg.MemBytes/2 || e.sparseTotal.Load() > int64(e.cfg.MemBytes)/2 {
		// A flush that failed for good is reported here too (and again
		// by the next Flush): a writer ahead of a failing cluster must
		// not wait for one flush after another.
		if isWriteFailed(f.err) {
			return len(p), f.err
		}
		// Wait for the flushes in progress before flushing stripes still
		// being written: a stripe flushed half written is written again
		// (and its first half read back) once the writer fills it. A
		// sequential writer ahead of the disk rewrote one stripe in ten so.
		if len(f.flushing) == 0 {
			if len(f.dirty) > 0 {
				e.startFlush(f, keys(f.dirty))
			}
			if len(f.flushing) == 0 && f.err == nil && len(f.dirty) > 0 {
				// Sparse stripes that found no buffer memory: wait for some.
				if err := e.waitForMemory(ctx, f); err != nil {
					return len(p), err
				}
				continue
			}
			if len(f.flushing) == 0 {
				break // nothing could start: f.err says why, the next Flush reports it
			}
		}
		if err := f.wait(ctx); err != nil {
			return len(p), err // the data stays dirty; an interrupted writer need not wait
		}
	}
	return len(p), nil
}

// dirtyStripe returns the dirty buffer of stripe s, creating it — with the
// committed data read in unless [lo, hi) covers all of it — when there is none.
// It waits for a flush of s in progress. The caller holds f.mu.
func (e *Engine) dirtyStripe(ctx context.Context, f *file, s uint64, lo, hi int64) (*dirtyStripe, error) {
	for {
		for f.flushing[s] != nil {
			if err := f.wait(ctx); err != nil {
				return nil, err
			}
		}
		if d := f.dirty[s]; d != nil {
			return d, nil
		}
		if err := e.fetch(ctx, f, s, 1); err != nil {
			return nil, err
		}
		// Sparse unless the write is where a sequential writer begins a
		// stripe (its start, or the end of its committed data) or large.
		si := f.stripes[s]
		sparse := lo > 0 && hi-lo <= slabSize && (si == nil || lo != int64(si.Length))
		// So is a small file's one stripe: it is committed into metadata
		// (commitInline), and needs no registered memory.
		sparse = sparse || inlineSized(f.lay, s, hi)
		var buf *buffer
		if !sparse {
			b, err := e.getBuffer(ctx, f, bufSize(f.lay))
			if err != nil {
				return nil, err
			}
			if f.dirty[s] != nil || f.flushing[s] != nil {
				e.pool.put(b) // someone else made it while we waited for memory
				continue
			}
			buf, si = b, f.stripes[s]
		}
		if pf := f.cache[s]; pf != nil {
			e.dropLocked(pf)
		}
		d := &dirtyStripe{buf: buf, dataLen: f.lay.StripeSize()}
		if si != nil {
			d.base, d.length = si.Version, int64(si.Length)
			if lo > 0 || hi < int64(si.Length) {
				d.committed, d.fillEnd = si, int64(si.Length)
			}
		}
		f.dirty[s] = d
		if buf != nil {
			e.addBuf(f, len(buf.b))
		} else {
			e.stats.SparseStripes.Add(1)
		}
		return d, nil
	}
}

// fill reads the committed bytes of d that the writes have not covered into
// its buffer, once. The caller holds f.mu and owns d (dirty, not flushing).
func (e *Engine) fill(ctx context.Context, f *file, d *dirtyStripe) error {
	if err := e.giveBuffer(f, d); err != nil {
		return err
	}
	return e.readBase(ctx, f.ino, f.lay, d)
}

// giveBuffer gives a sparse d its whole-stripe buffer, or fails with
// errNoBuffer. The caller holds f.mu and owns d.
func (e *Engine) giveBuffer(f *file, d *dirtyStripe) error {
	if d.buf == nil {
		buf := e.pool.tryGet(bufSize(f.lay))
		if buf == nil {
			return errNoBuffer
		}
		e.materialize(f, d, buf)
	}
	return nil
}

// readBase reads the committed bytes of d (which has its buffer) that the
// writes have not covered into the buffer, once. It needs no lock: the
// caller owns d, dirty under f.mu, or flushing and marked filling (the
// flush reads them without the lock, so that the file's other writers go
// on).
func (e *Engine) readBase(ctx context.Context, ino uint64, lay stripe.Layout, d *dirtyStripe) error {
	d.zero()
	if d.committed == nil {
		return nil
	}
	read := false
	err := d.gaps(d.fillEnd, func(lo, hi int64) error {
		read = true
		return e.readCommittedTo(ctx, ino, lay, d.committed, lo, d.buf.b[lo:hi], d.buf, int(lo))
	})
	if err != nil {
		return fmt.Errorf("fileio: read stripe %d of inode %d to merge a partial write: %w", d.committed.Stripe, ino, err)
	}
	d.committed = nil
	if read {
		e.stats.MergeReads.Add(1)
	}
	return nil
}

// getBuffer takes buffer memory. When the pool is short it waits for the
// file's flushes in progress, else flushes the file's dirty stripes and waits
// for them, and only then waits for other files' flushes with f.mu released,
// so no writer ever waits for memory it holds itself.
// The caller holds f.mu.
func (e *Engine) getBuffer(ctx context.Context, f *file, n int) (*buffer, error) {
	for {
		if b := e.pool.tryGet(n); b != nil {
			return b, nil
		}
		if isWriteFailed(f.err) {
			return nil, f.err
		}
		switch {
		case len(f.flushing) > 0:
			// Flushes in progress free memory; flushing the stripes still
			// being written would have them written twice (see Write).
			if err := f.wait(ctx); err != nil {
				return nil, err
			}
		case len(f.dirty) > 0:
			e.startFlush(f, keys(f.dirty))
			if len(f.flushing) == 0 && f.err != nil {
				err := f.err
				f.err = nil
				return nil, err
			}
			if len(f.flushing) == 0 {
				// Sparse stripes that found no memory either: wait for
				// memory without the lock, as below.
				return e.getBufferUnlocked(ctx, f, n)
			}
			if err := f.wait(ctx); err != nil {
				return nil, err
			}
		default:
			return e.getBufferUnlocked(ctx, f, n)
		}
	}
}

// getBufferUnlocked waits for n bytes of buffer memory with f.mu released,
// after starting flushes of other files' whole stripes (nothing else would
// free their memory while their writers are idle) and dropping this
// engine's read-ahead. The caller holds f.mu.
func (e *Engine) getBufferUnlocked(ctx context.Context, f *file, n int) (*buffer, error) {
	for {
		if b := e.pool.tryGet(n); b != nil {
			return b, nil
		}
		if !e.evictOldest(f) {
			break
		}
	}
	e.flushOthers(f)
	f.mu.Unlock()
	b, err := e.pool.get(ctx, n)
	f.mu.Lock()
	return b, err
}
