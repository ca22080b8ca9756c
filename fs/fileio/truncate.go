package fileio

// Truncation and rebasing: dirty stripes cut at a new size, and rebuilt on
// a newer committed version after a commit conflict.

import "context"

// Truncate implements fs.Data: flushes in progress finish, and dirty data past
// size is dropped.
func (e *Engine) Truncate(ctx context.Context, ino uint64, size uint64) error {
	f := e.file(ino)
	f.mu.Lock()
	defer f.mu.Unlock()
	for len(f.flushing) > 0 {
		if err := f.wait(ctx); err != nil {
			return err
		}
	}
	e.dropCacheLocked(f)
	if f.readahead != nil {
		f.readahead.reset()
	}
	f.known = false
	f.capped, f.sizeCap = true, int64(size)
	if f.lay.K == 0 {
		clear(f.stripes)
		f.size = -1
		return nil
	}
	ss := f.lay.StripeSize()
	for s, d := range f.dirty {
		start := int64(s) * ss
		switch {
		case start >= int64(size):
			e.dropDirty(f, d)
			delete(f.dirty, s)
		case start+d.length > int64(size):
			cut := int64(size) - start
			if d.buf != nil {
				clear(d.buf.b[cut:d.length])
			} else {
				d.truncateSparse(cut)
			}
			d.length = cut
			d.truncate(cut)
		}
	}
	clear(f.stripes)
	f.size = -1
	return nil
}

// Truncated implements fs.Data: meta has applied (or refused) the size a
// Truncate prepared for, so sizes read from it are current again. What reads
// fetched meanwhile may be from before the new size (a stripe's old length,
// its old bytes): it is dropped and fetched again.
func (e *Engine) Truncated(ino uint64) {
	f := e.file(ino)
	f.mu.Lock()
	f.capped = false
	e.dropCacheLocked(f)
	clear(f.stripes)
	f.known = false
	f.size = -1
	f.mu.Unlock()
}

// rebaseIfMoved rebases dirty stripe s when the committed version it was to be
// merged with has been superseded (its chunks may be gone already); it reports
// whether it did. The caller holds f.mu.
func (e *Engine) rebaseIfMoved(ctx context.Context, f *file, s uint64) bool {
	d := f.dirty[s]
	if d == nil || d.committed == nil {
		return false
	}
	delete(f.stripes, s)
	f.known = false
	if err := e.fetch(ctx, f, s, 1); err != nil {
		return false
	}
	if si := f.stripes[s]; si != nil && si.Version == d.committed.Version {
		return false
	}
	return e.rebase(ctx, f, []uint64{s}) == nil
}

// rebase rebuilds conflicting dirty stripes on their newest committed versions:
// the writer's ranges stay, in the same buffer (or slabs), and the rest is to
// be read from the new version. It takes no memory. The caller holds f.mu.
func (e *Engine) rebase(ctx context.Context, f *file, conflicts []uint64) error {
	for _, s := range conflicts {
		d := f.dirty[s]
		if d == nil {
			continue
		}
		delete(f.stripes, s)
		f.known = false
		if err := e.fetch(ctx, f, s, 1); err != nil {
			return err
		}
		if d.buf != nil {
			// What is not written holds the old version's bytes: clear it.
			d.zero()
			d.gaps(d.dataLen, func(lo, hi int64) error {
				clear(d.buf.b[lo:hi])
				return nil
			})
		}
		d.base, d.committed, d.fillEnd = 0, nil, 0
		if si := f.stripes[s]; si != nil {
			d.base, d.committed, d.fillEnd = si.Version, si, int64(si.Length)
			d.length = max(d.length, int64(si.Length))
		}
	}
	return nil
}
