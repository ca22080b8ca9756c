package fileio

// Flush scheduling: which dirty stripes go to the chunkservers when, and
// waiting for them (writeStripes, in write.go, does the writing).

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"syscall"
	"time"

	"github.com/rdmafs/rdmafs/internal/stripe"
	metaclient "github.com/rdmafs/rdmafs/meta/client"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// flushTimeout bounds one background flush: its writes and commits outlive
// the request that started them.
const flushTimeout = 2 * time.Minute

// wait waits on f.cond until a flush ends or ctx ends, and returns ctx's
// error then. The caller holds f.mu.
func (f *file) wait(ctx context.Context) error {
	if ctx.Done() == nil {
		f.cond.Wait()
		return nil
	}
	stop := context.AfterFunc(ctx, func() {
		f.mu.Lock()
		f.cond.Broadcast()
		f.mu.Unlock()
	})
	f.cond.Wait()
	stop()
	return ctx.Err()
}

func keys(m map[uint64]*dirtyStripe) []uint64 {
	ks := make([]uint64, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// flushOthers starts flushing the dirty whole stripes of files other than
// f that have no flush in progress and whose lock is free now. The caller
// holds f.mu.
func (e *Engine) flushOthers(f *file) {
	e.mu.Lock()
	others := make([]*file, 0, len(e.files))
	for _, g := range e.files {
		if g != f {
			others = append(others, g)
		}
	}
	e.mu.Unlock()
	for _, g := range others {
		if !g.mu.TryLock() {
			continue
		}
		if len(g.flushing) == 0 {
			var whole []uint64
			for s, d := range g.dirty {
				if d.buf != nil {
					whole = append(whole, s)
				}
			}
			if len(whole) > 0 {
				slices.Sort(whole)
				e.startFlush(g, whole)
			}
		}
		g.mu.Unlock()
	}
}

// startFlush moves stripes from dirty to flushing and writes and commits them
// in the background. The caller holds f.mu.
func (e *Engine) startFlush(f *file, stripes []uint64) { e.flushStripes(f, stripes, false) }

// flushStripes is startFlush, and returns how many stripes it started; with
// wait set (the caller waits for the flush: an fsync's), a commit into
// metadata runs in the caller's goroutine, f.mu released meanwhile, which
// spares an fsync two goroutine hand-offs.
func (e *Engine) flushStripes(f *file, stripes []uint64, wait bool) int {
	ready := stripes[:0:0]
	for _, s := range stripes {
		d := f.dirty[s]
		if d == nil {
			continue
		}
		if d.delta = e.planDelta(f, s, d); d.delta != nil {
			ready = append(ready, s)
			continue
		}
		if d.buf == nil && s == 0 && len(stripes) == 1 && e.commitsInline(f, d) {
			ready = append(ready, s) // committed from its slabs (inlineData)
			continue
		}
		if err := e.giveBuffer(f, d); err != nil {
			continue // errNoBuffer: stays dirty until memory frees up
		}
		// The committed bytes around the writes are read in by the flush,
		// without f.mu: the file's other writers go on meanwhile.
		d.filling = true
		ready = append(ready, s)
	}
	stripes = ready
	if len(stripes) == 0 {
		return 0
	}
	batch := make([]*dirtyStripe, 0, len(stripes))
	for _, s := range stripes {
		d := f.dirty[s]
		delete(f.dirty, s)
		f.flushing[s] = d
		batch = append(batch, d)
	}
	lay := f.lay
	// A file that stays within the layout's inline size commits its one
	// stripe into metadata.
	inline := len(stripes) == 1 && stripes[0] == 0 && e.commitsInline(f, batch[0])
	var inlineBase []byte // the bytes of the inline version the stripe builds on
	if si := f.stripes[0]; inline && si != nil && si.Version == batch[0].base && si.Version > 0 && isInline(si) {
		inlineBase = si.InlineData
	}
	durable := f.syncing > 0
	behind := f.behind > 0 && !durable
	run := func() {
		ctx, cancel := context.WithTimeout(context.Background(), flushTimeout)
		defer cancel()
		if stripes, batch = e.readBases(ctx, f, lay, stripes, batch); len(stripes) == 0 {
			return
		}
		var infos []*metapb.StripeInfo
		var err error
		if inline {
			infos, err = e.commitInline(ctx, f.ino, batch[0], inlineBase, durable, behind)
		} else {
			infos, err = e.writeStripes(ctx, f.ino, lay, stripes, batch, durable)
		}
		var df *deltaFailed
		if err != nil && metaclient.ConflictStripes(err) == nil && !errors.As(err, &df) {
			// writeStripes has waited and retried what can pass (chunkservers
			// down, replacements, meta failover): what is left is final.
			err = failWrite(err)
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		defer f.cond.Broadcast()
		defer e.dropIfForgotten(f)
		failed := isWriteFailed(err)
		for i, s := range stripes {
			delete(f.flushing, s)
			d := batch[i]
			switch {
			case err == nil:
				f.stripes[s] = infos[i]
				if d.delta != nil {
					e.keepPatched(f, s, infos[i].Version, d.delta)
					if d.delta.next != nil {
						if f.next == nil {
							f.next = map[uint64]*nextGrant{}
						}
						f.next[s] = d.delta.next
					}
				} else {
					e.dropPatched(f, s)
				}
				fallthrough
			case failed:
				// Written, or failed for good: a failed write-back's
				// data is dropped once its error is reported, as on a
				// local file system, so a failing cluster does not pin
				// the mount's memory.
				e.dropDirty(f, d)
			default:
				if df != nil && d.delta != nil {
					d.noDelta = true
				}
				e.dropDelta(f, d)
				f.dirty[s] = d // kept for the next attempt
			}
		}
		if err == nil {
			if len(infos) > 0 && !isInline(infos[0]) {
				// A relayout changed the file's layout: new stripes use it.
				f.lay = stripeLayout(infos[0], f.lay)
			}
			return
		}
		if df != nil {
			e.log.Info("fileio: partial-stripe write failed, rewriting the stripes whole", "ino", f.ino, "stripes", len(stripes), "err", err)
			e.startFlush(f, stripes)
			return
		}
		if failed {
			if isRemoved(err) {
				e.log.Info("fileio: file removed before its data was written", "ino", f.ino, "err", err)
			} else {
				e.log.Error("fileio: write failed, data not written", "ino", f.ino, "stripes", len(stripes), "err", err)
			}
			clear(f.stripes) // the size and stripes this writer assumed did not commit
			f.known = false
			f.size = -1
			f.err = err
			f.failures++
			f.lastFailure = err
			return
		}
		if conflicts := metaclient.ConflictStripes(err); len(conflicts) > 0 {
			if rerr := e.rebase(ctx, f, conflicts); rerr != nil {
				f.err = rerr
				return
			}
			e.startFlush(f, conflicts)
			return
		}
		f.err = err
	}
	started := len(stripes)
	if wait && inline {
		f.mu.Unlock()
		run() // takes f.mu to finish
		f.mu.Lock()
		return started
	}
	go run()
	return started
}

// readBases reads in the committed bytes of the stripes of batch marked
// filling (readBase), without f.mu, and returns the stripes and batch left
// to write. A stripe whose read failed goes back to the dirty stripes,
// rebased and flushed again if its committed version moved, else with the
// error in f.err for the next Flush, as when the read was made under f.mu.
func (e *Engine) readBases(ctx context.Context, f *file, lay stripe.Layout, stripes []uint64, batch []*dirtyStripe) ([]uint64, []*dirtyStripe) {
	filling := false
	var failed map[uint64]error
	for i, d := range batch {
		if !d.filling {
			continue
		}
		filling = true
		if err := e.readBase(ctx, f.ino, lay, d); err != nil {
			if failed == nil {
				failed = map[uint64]error{}
			}
			failed[stripes[i]] = err
		}
	}
	if !filling {
		return stripes, batch
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	defer f.cond.Broadcast() // readers wait for filled stripes (waitFilled)
	for _, d := range batch {
		d.filling = false
	}
	if len(failed) == 0 {
		return stripes, batch
	}
	var again []uint64
	keptS, keptB := stripes[:0:0], batch[:0:0]
	for i, s := range stripes {
		err, bad := failed[s]
		if !bad {
			keptS, keptB = append(keptS, s), append(keptB, batch[i])
			continue
		}
		delete(f.flushing, s)
		f.dirty[s] = batch[i]
		if e.rebaseIfMoved(ctx, f, s) {
			again = append(again, s) // rebase keeps d, on the newest version
		} else {
			f.err = err // the stripe stays dirty: a later flush tries again
		}
	}
	if len(again) > 0 {
		e.startFlush(f, again)
	}
	if len(keptS) == 0 {
		e.dropIfForgotten(f)
	}
	return keptS, keptB
}

// waitFilled waits, f.mu released meanwhile, until no stripe of [off, end)
// is flushing with its committed bytes still being read in (readBases): its
// buffer is not whole yet. The caller holds f.mu.
func (e *Engine) waitFilled(ctx context.Context, f *file, off, end int64) error {
	for {
		ss := f.lay.StripeSize()
		busy := false
		for s := uint64(off / ss); int64(s)*ss < end && !busy; s++ {
			d := f.flushing[s]
			busy = d != nil && d.filling
		}
		if !busy {
			return nil
		}
		if err := f.wait(ctx); err != nil {
			return err
		}
	}
}

// commitsInline reports whether d, the dirty stripe 0 of f flushed alone,
// is committed into metadata: the file stays within its layout's inline
// size. A sparse d must also be built on nothing or on an inline stripe,
// whose bytes are at hand (inlineData). The caller holds f.mu.
func (e *Engine) commitsInline(f *file, d *dirtyStripe) bool {
	if f.size < 0 || !inlineSized(f.lay, 0, f.size) || d.length > f.lay.Inline {
		return false
	}
	return d.buf != nil || d.committed == nil || isInline(d.committed)
}

// Flush implements fs.Data: it flushes every dirty stripe of ino, waits for all
// flushes in progress, and reports the first failure since the last Flush. A
// flush that lost the version compare-and-set to another writer is rebased
// and tried again; any other failure is final once writeStripes has waited
// and retried what can pass (EIO, or ENOSPC), and its data is dropped. When ctx
// ends (the caller is being killed) Flush returns its error at once and the
// flushes in progress go on.
func (e *Engine) Flush(ctx context.Context, ino uint64) error {
	f := e.file(ino)
	f.mu.Lock()
	defer f.mu.Unlock()
	return e.flushLocked(ctx, f)
}

// FlushBehind is Flush for a flush no application waits for (a file closed
// under its directory's lease): an inline commit goes behind, with the
// next batch of the mount's calls, when the metadata client can send it so
// (Config.Meta implements CommitBehind).
func (e *Engine) FlushBehind(ctx context.Context, ino uint64) error {
	f := e.file(ino)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.behind++
	defer func() { f.behind-- }()
	return e.flushLocked(ctx, f)
}

// FlushCarried commits what was written to ino without a call of its own
// if carry takes it: the file's whole content, within its layout's inline
// size, of a file this mount created with nothing committed yet, which
// carry hands to the file's create (still to be sent to meta, which then
// commits it as stripe 0's first version). It reports whether nothing of
// ino is left to flush; if not, what was written stays for Flush.
func (e *Engine) FlushCarried(ino uint64, carry func(data []byte) bool) bool {
	f := e.file(ino)
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.flushing) > 0 || f.err != nil || f.syncing > 0 {
		return false
	}
	if len(f.dirty) == 0 {
		return true
	}
	d := f.dirty[0]
	if len(f.dirty) != 1 || d == nil || !f.known || len(f.stripes) > 0 || d.base != 0 || d.committed != nil ||
		d.delta != nil || d.filling || !e.commitsInline(f, d) {
		return false
	}
	data, own := d.inlineData()
	if !own {
		data = slices.Clone(data) // the buffer goes back to the pool
	}
	if !carry(data) {
		return false
	}
	f.stripes[0] = &metapb.StripeInfo{Stripe: 0, Version: 1, Length: uint64(d.length), InlineData: data}
	delete(f.dirty, 0)
	e.dropDirty(f, d)
	e.stats.InlineCommits.Add(1)
	return true
}

// Sync implements fs.Data: Flush, with the commits it makes durable at
// meta, with everything answered before them, when they return (an
// fsync's: no Sync call needed after them).
func (e *Engine) Sync(ctx context.Context, ino uint64) error {
	f := e.file(ino)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.syncing++
	defer func() { f.syncing-- }()
	return e.flushLocked(ctx, f)
}

func (e *Engine) flushLocked(ctx context.Context, f *file) error {
	// Sparse stripes flush as buffer memory allows, some per round: a round
	// that flushed some is progress, bounded by the stripes there were.
	progress := len(f.dirty)
	for attempt := 0; ; attempt++ {
		started := 0
		if len(f.dirty) > 0 {
			started = e.flushStripes(f, keys(f.dirty), f.syncing > 0)
		}
		for len(f.flushing) > 0 {
			if err := f.wait(ctx); err != nil {
				return err
			}
		}
		err := f.err
		f.err = nil
		if err == nil && len(f.dirty) == 0 {
			return nil
		}
		if err == nil && started == 0 {
			// No stripe got buffer memory (other files hold it): wait for
			// some; that is no failed attempt.
			if err := e.waitForMemory(ctx, f); err != nil {
				return err
			}
			attempt--
			continue
		}
		if err == nil && progress > 0 {
			progress-- // some stripes flushed, the others go next round
			attempt--
			continue
		}
		if attempt == 2 || isWriteFailed(err) {
			if err == nil {
				err = fmt.Errorf("fileio: inode %d: stripes kept changing under the writer: %w", f.ino, syscall.EIO)
			}
			return err
		}
	}
}

// waitForMemory waits, with f.mu released, until a whole stripe's buffer
// is free. The caller holds f.mu.
func (e *Engine) waitForMemory(ctx context.Context, f *file) error {
	b, err := e.getBufferUnlocked(ctx, f, bufSize(f.lay))
	e.pool.put(b)
	return err
}

// FlushAll flushes every file with dirty data (before an unmount); it returns
// the first error and goes on with the other files.
func (e *Engine) FlushAll(ctx context.Context) error {
	e.mu.Lock()
	files := make([]*file, 0, len(e.files))
	for _, f := range e.files {
		files = append(files, f)
	}
	e.mu.Unlock()
	var first error
	for _, f := range files {
		f.mu.Lock()
		err := e.flushLocked(ctx, f)
		f.mu.Unlock()
		if err != nil && first == nil {
			first = fmt.Errorf("fileio: flush inode %d: %w", f.ino, err)
		}
	}
	return first
}
