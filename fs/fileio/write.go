package fileio

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/rdmafs/rdmafs/chunkserver/chunk"
	chunkclient "github.com/rdmafs/rdmafs/chunkserver/client"
	"github.com/rdmafs/rdmafs/chunkserver/proto"
	"github.com/rdmafs/rdmafs/chunkserver/store"
	"github.com/rdmafs/rdmafs/internal/stripe"
	"github.com/rdmafs/rdmafs/meta/metaerr"
	"github.com/rdmafs/rdmafs/meta/metapb"
	"github.com/rdmafs/rdmafs/rdma"
)

// Writes under failure. A stripe's shards are written to the chunkservers
// of its grant in parallel. A shard whose write fails (refused, reset,
// silent past the stall timeout, no space) moves to a replacement
// chunkserver that meta chooses (ReplaceShards) and is written there. When
// no replacement exists the stripe commits with the shards that are
// durable, provided there are at least the layout's min-write-shards of
// them: meta records the others as missing and repair rebuilds them. Below
// that minimum the write waits for chunkservers to come back, at most
// Config.WriteTimeout, and then fails with EIO — or at once with ENOSPC when
// it is space that is missing. The committed version changes only by the
// commit's compare-and-set, so readers see the old stripe or the new one.

// writeFailed is a write that failed for good (below min-write-shards past
// the write timeout, or no space): its data is dropped and the error
// reported, as a local file system reports a failed write-back.
type writeFailed struct {
	err     error
	removed bool // meta has no such file (Removed)
}

func (w *writeFailed) Error() string { return w.err.Error() }
func (w *writeFailed) Unwrap() error { return w.err }

// failWrite makes err a write that failed for good, as the application
// sees it: ENOSPC when space was missing, EDQUOT past a quota, else EIO.
func failWrite(err error) error {
	if isWriteFailed(err) {
		return err
	}
	if errors.Is(err, syscall.ENOSPC) || metaerr.Errno(err) == syscall.ENOSPC {
		return &writeFailed{err: fmt.Errorf("%w (%v)", syscall.ENOSPC, err)}
	}
	if errors.Is(err, syscall.EDQUOT) || metaerr.Errno(err) == syscall.EDQUOT {
		return &writeFailed{err: fmt.Errorf("%w (%v)", syscall.EDQUOT, err)}
	}
	if e := metaerr.Errno(err); e == syscall.ENOENT || e == syscall.ESTALE {
		return &writeFailed{err: fmt.Errorf("%w (%v)", syscall.EIO, err), removed: true}
	}
	return &writeFailed{err: fmt.Errorf("%w (%v)", syscall.EIO, err)}
}

// Removed reports whether the write failed because meta no longer has the
// file: it was removed meanwhile, and nothing it held is lost.
func (w *writeFailed) Removed() bool { return w.removed }

// isRemoved reports whether err is a write that failed because meta no
// longer has the file (writeFailed.Removed).
func isRemoved(err error) bool {
	var w *writeFailed
	return errors.As(err, &w) && w.removed
}

// isWriteFailed reports whether err is a write that failed for good.
func isWriteFailed(err error) bool {
	var w *writeFailed
	return errors.As(err, &w)
}

// Backoff between attempts while a write waits for chunkservers.
const (
	waitMin = 100 * time.Millisecond
	waitMax = 2 * time.Second
)

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// writeStripes encodes the stripes, writes their shards (with replacements
// for the ones that fail) and commits them with one compare-and-set. It runs
// without the file's lock: the buffers belong to the flush.
func (e *Engine) writeStripes(ctx context.Context, ino uint64, lay stripe.Layout, stripes []uint64, batch []*dirtyStripe, durable bool) ([]*metapb.StripeInfo, error) {
	var size int64
	var inPlace []uint64
	for i, d := range batch {
		size = max(size, int64(stripes[i])*lay.StripeSize()+d.length)
		if d.delta != nil {
			inPlace = append(inPlace, stripes[i])
		}
	}
	if err := e.encodeStripes(ctx, ino, lay, stripes, batch); err != nil {
		return nil, err
	}
	deadline := e.cfg.Now().Add(e.cfg.WriteTimeout)
	t0 := time.Now()
	g := grantsHeld(batch)
	if g != nil {
		e.stats.NextGrantsUsed.Add(int64(len(batch)))
	} else {
		var err error
		if g, err = e.grant(ctx, ino, stripes, inPlace, deadline); err != nil {
			return nil, err
		}
	}
	if len(g.Grants) != len(stripes) {
		return nil, fmt.Errorf("fileio: %d grants for %d stripes: %w", len(g.Grants), len(stripes), syscall.EIO)
	}
	if gl := g.Grants[0].GetLayout(); gl != nil && !sameCoding(gl.Stripe(), lay) && gl.Stripe().StripeSize() == lay.StripeSize() {
		// The file was given another layout of the same stripe size (a
		// relayout): the stripes are encoded again in the granted one.
		lay = gl.Stripe()
		if err := e.encodeStripes(ctx, ino, lay, stripes, batch); err != nil {
			return nil, err
		}
	}
	for i, gr := range g.Grants {
		if gr.Stripe != stripes[i] || len(gr.Shards) != lay.K+lay.M || gr.Layout == nil || !sameCoding(gr.Layout.Stripe(), lay) {
			return nil, fmt.Errorf("fileio: grant for stripe %d does not match the request: %w", gr.Stripe, syscall.EIO)
		}
	}
	t1 := time.Now()
	type result struct {
		shards  []*metapb.Shard
		missing []uint32
		err     error
	}
	results := make([]result, len(g.Grants))
	var wg sync.WaitGroup
	for i, gr := range g.Grants {
		wg.Go(func() {
			r := &results[i]
			if batch[i].delta != nil {
				r.shards, r.err = gr.Shards, e.writeDelta(ctx, lay, gr, batch[i])
				return
			}
			r.shards, r.missing, r.err = e.writeStripe(ctx, ino, lay, gr, batch[i], deadline)
		})
	}
	wg.Wait()
	// A failed delta is no failure of the write: the stripes go again,
	// whole. Other errors come first.
	var delta error
	for _, r := range results {
		var df *deltaFailed
		switch {
		case errors.As(r.err, &df):
			delta = r.err
		case r.err != nil:
			return nil, r.err
		}
	}
	if delta != nil {
		return nil, delta
	}
	t2 := time.Now()
	commits := make([]*metapb.StripeCommit, len(g.Grants))
	infos := make([]*metapb.StripeInfo, len(g.Grants))
	degraded := 0
	for i, gr := range g.Grants {
		d, r := batch[i], results[i]
		commits[i] = &metapb.StripeCommit{Stripe: gr.Stripe, Version: gr.Version, ExpectedVersion: d.base, Length: uint64(d.length), Missing: r.missing}
		infos[i] = &metapb.StripeInfo{Stripe: gr.Stripe, Version: gr.Version, Length: uint64(d.length), Layout: gr.Layout, Shards: r.shards}
		if len(r.missing) > 0 {
			degraded++
		}
	}
	r, err := e.commit(ctx, &metapb.CommitStripesRequest{Ino: ino, Stripes: commits, Size: uint64(size), Sync: durable, GrantNext: inPlace}, false)
	if err != nil {
		return nil, err
	}
	e.keepNextGrants(r, stripes, batch)
	if degraded > 0 {
		e.stats.DegradedWrites.Add(int64(degraded))
	}
	e.log.Debug("fileio: flushed", "ino", ino, "stripes", len(stripes), "degraded", degraded, "grant", t1.Sub(t0), "shards", t2.Sub(t1), "commit", time.Since(t2))
	return infos, nil
}

// encodeStripes computes the parity of the stripes of batch written whole
// (not as deltas) in layout lay, first moving a stripe whose buffer is too
// small for lay's parity to a larger one (its file changed layout since the
// buffer was taken).
func (e *Engine) encodeStripes(ctx context.Context, ino uint64, lay stripe.Layout, stripes []uint64, batch []*dirtyStripe) error {
	enc, err := e.codecs.Get(lay.K, lay.M)
	if err != nil {
		return err
	}
	unit := int(lay.Unit)
	for i, d := range batch {
		if d.delta != nil {
			continue
		}
		if len(d.buf.b) < bufSize(lay) {
			if err := e.growBuffer(ctx, ino, d, bufSize(lay)); err != nil {
				return err
			}
		}
		sl := int(lay.CodedLen(d.length))
		shards := make([][]byte, lay.K+lay.M)
		for j := range shards {
			shards[j] = d.buf.b[j*unit : j*unit+sl]
		}
		if lay.M > 0 {
			if lay.K == 1 {
				for j := 1; j < len(shards); j++ {
					copy(shards[j], shards[0])
				}
			} else if err := enc.Encode(shards); err != nil {
				return fmt.Errorf("fileio: encode stripe %d: %w", stripes[i], err)
			}
		}
	}
	return nil
}

// growBuffer moves flushing stripe d of ino to a buffer of n bytes with its
// data. Readers of the stripe copy from its buffer under the file's lock,
// so the move is made under it.
func (e *Engine) growBuffer(ctx context.Context, ino uint64, d *dirtyStripe, n int) error {
	nb, err := e.pool.get(ctx, n)
	if err != nil {
		return err
	}
	f := e.file(ino)
	f.mu.Lock()
	old := d.buf
	copy(nb.b[:d.dataLen], old.b[:d.dataLen])
	d.buf = nb
	e.addBuf(f, len(nb.b)-len(old.b))
	f.mu.Unlock()
	e.pool.put(old)
	return nil
}

// sameCoding reports whether stripes of layouts a and b are stored alike.
func sameCoding(a, b stripe.Layout) bool { return a.K == b.K && a.M == b.M && a.Unit == b.Unit }

// commitInline commits stripe 0 of a small file with its bytes in metadata:
// one call, no grant, no shards. With base, the bytes of the inline version
// d builds on, only what changed travels (a database rewrites a few pages
// of its file per transaction), unless that is most of it.
func (e *Engine) commitInline(ctx context.Context, ino uint64, d *dirtyStripe, base []byte, durable, behind bool) ([]*metapb.StripeInfo, error) {
	data, own := d.inlineData()
	sc := &metapb.StripeCommit{Stripe: 0, ExpectedVersion: d.base, Length: uint64(d.length), Inline: true, Data: data}
	if base != nil && !e.noPatches.Load() {
		if patches, ok := inlinePatches(base, data); ok {
			sc.Data, sc.Patch, sc.Patches = nil, true, patches
		}
	}
	req := &metapb.CommitStripesRequest{Ino: ino, Size: uint64(d.length), Sync: durable, Stripes: []*metapb.StripeCommit{sc}}
	r, err := e.commit(ctx, req, behind)
	if err != nil && sc.Patch && metaerr.Errno(err) == syscall.EINVAL {
		// Perhaps a meta server that predates patches: the bytes go
		// whole, and from now on if that passes.
		sc.Data, sc.Patch, sc.Patches = data, false, nil
		refused := err
		if r, err = e.commit(ctx, req, behind); err == nil && !e.noPatches.Swap(true) {
			e.log.Info("fileio: the meta server refused a patched inline commit; inline commits send their bytes whole", "ino", ino, "err", refused)
		}
	}
	if err != nil {
		return nil, err
	}
	if sc.Patch {
		e.stats.InlinePatched.Add(1)
	}
	if len(r.Versions) != 1 || r.Versions[0] == 0 {
		return nil, fmt.Errorf("fileio: inline commit of inode %d: no version in the reply: %w", ino, syscall.EIO)
	}
	e.stats.InlineCommits.Add(1)
	if !own {
		data = slices.Clone(data)
	}
	return []*metapb.StripeInfo{{Stripe: 0, Version: r.Versions[0], Length: uint64(d.length), InlineData: data}}, nil
}

// patchBlock is the granularity at which inlinePatches compares bytes.
const patchBlock = 64

// maxInlinePatches bounds the patches of one inline commit, as meta does.
const maxInlinePatches = 1024

// inlinePatches returns the changes that turn old, cut or zero-extended to
// len(data), into data, as meta applies them (StripeCommit.patch): runs of
// differing patchBlock-byte blocks, merged across a single equal block. ok
// is false when they would carry more than half of data: it then goes whole.
func inlinePatches(old, data []byte) (patches []*metapb.InlinePatch, ok bool) {
	sent := 0
	var cur *metapb.InlinePatch
	curEnd := 0
	for off := 0; off < len(data); off += patchBlock {
		end := min(off+patchBlock, len(data))
		if sameAsOld(old, data, off, end) {
			continue
		}
		if cur != nil && off-curEnd <= patchBlock {
			sent += end - curEnd
			curEnd = end
			cur.Data = data[cur.Offset:end]
			continue
		}
		if len(patches) == maxInlinePatches {
			return nil, false
		}
		cur, curEnd = &metapb.InlinePatch{Offset: uint64(off), Data: data[off:end]}, end
		sent += end - off
		patches = append(patches, cur)
	}
	if 2*sent > len(data) {
		return nil, false
	}
	return patches, true
}

// sameAsOld reports whether data[off:end] equals old's bytes there, old
// read as zeros past its end.
func sameAsOld(old, data []byte, off, end int) bool {
	n := min(max(len(old)-off, 0), end-off) // bytes of old in the block
	if n > 0 && !bytes.Equal(data[off:off+n], old[off:off+n]) {
		return false
	}
	for _, b := range data[off+n : end] {
		if b != 0 {
			return false
		}
	}
	return true
}

// grant asks meta for write grants, placing no shard on the chunkservers
// this mount suspects or found full; the stripes of inPlace are granted on
// their committed chunks where meta can. While too few chunkservers are live
// for the layout's min-write-shards it waits, until deadline.
func (e *Engine) grant(ctx context.Context, ino uint64, stripes, inPlace []uint64, deadline time.Time) (*metapb.GrantWriteReply, error) {
	wait := waitMin
	for {
		g, err := e.cfg.Meta.GrantWrite(ctx, &metapb.GrantWriteRequest{Ino: ino, Stripes: stripes, InPlace: inPlace, Exclude: e.conns.Avoid()})
		switch errno := metaerr.Errno(err); {
		case err == nil:
			return g, nil
		case errno == syscall.ENOSPC:
			return nil, &writeFailed{err: fmt.Errorf("fileio: inode %d: no chunkserver has room: %w", ino, syscall.ENOSPC)}
		case errno == syscall.EDQUOT:
			return nil, &writeFailed{err: fmt.Errorf("fileio: inode %d: %v: %w", ino, err, syscall.EDQUOT)}
		case errno != syscall.EHOSTDOWN:
			return nil, err
		case e.conns.AnyFull():
			return nil, &writeFailed{err: fmt.Errorf("fileio: inode %d: too few chunkservers with room (%v): %w", ino, err, syscall.ENOSPC)}
		case !e.cfg.Now().Before(deadline):
			return nil, &writeFailed{err: fmt.Errorf("fileio: inode %d: too few chunkservers reachable for %v (%v): %w", ino, e.cfg.WriteTimeout, err, syscall.EIO)}
		}
		e.conns.KickProbes() // the chunkservers this mount avoids may be back
		if err := sleep(ctx, wait); err != nil {
			return nil, err
		}
		wait = min(2*wait, waitMax)
	}
}

// writeStripe writes the shards of one granted stripe, moving failed ones to
// replacement chunkservers. It returns the placement to commit (shards that
// could not be written have no chunkserver) and the indexes missing.
func (e *Engine) writeStripe(ctx context.Context, ino uint64, lay stripe.Layout, gr *metapb.StripeGrant, d *dirtyStripe, deadline time.Time) ([]*metapb.Shard, []uint32, error) {
	n := len(gr.Shards)
	need := gr.Layout.Stripe().MinWriteShards()
	shards := append([]*metapb.Shard(nil), gr.Shards...)
	durable := make([]bool, n)
	var todo []int
	for i, sh := range shards {
		if sh.ServerId != "" {
			todo = append(todo, i)
		}
	}
	full := false
	wait := waitMin
	for {
		if len(todo) > 0 {
			f := e.writeShards(ctx, gr, d, lay, shards, todo, durable)
			full = full || f
		}
		var missing []uint32
		for i := range n {
			if !durable[i] {
				missing = append(missing, uint32(i))
			}
		}
		if len(missing) == 0 {
			return shards, nil, nil
		}
		if err := ctx.Err(); err != nil {
			return nil, nil, err
		}
		past := !e.cfg.Now().Before(deadline)
		if !past || n-len(missing) < need {
			// Move what is missing to other chunkservers, if any are left.
			r, err := e.cfg.Meta.ReplaceShards(ctx, &metapb.ReplaceShardsRequest{Ino: ino, Stripe: gr.Stripe, Version: gr.Version,
				Shards: missing, Exclude: e.conns.Avoid()})
			if err != nil {
				return nil, nil, fmt.Errorf("fileio: replace shards %v of stripe %d: %w", missing, gr.Stripe, err)
			}
			if len(r.Shards) != n {
				return nil, nil, fmt.Errorf("fileio: replacement placement of stripe %d has %d shards, not %d: %w", gr.Stripe, len(r.Shards), n, syscall.EIO)
			}
			todo = todo[:0]
			for _, i := range missing {
				shards[i] = r.Shards[i]
				if shards[i].ServerId != "" {
					todo = append(todo, int(i))
				}
			}
			if len(todo) > 0 {
				continue
			}
		}
		if n-len(missing) >= need {
			for _, i := range missing {
				shards[i] = &metapb.Shard{ChunkId: shards[i].ChunkId}
			}
			e.log.Warn("fileio: stripe written degraded, meta queues it for repair", "ino", ino, "stripe", gr.Stripe, "version", gr.Version,
				"durable", n-len(missing), "shards", n)
			return shards, missing, nil
		}
		switch {
		case full || e.conns.AnyFull():
			return nil, nil, &writeFailed{err: fmt.Errorf("fileio: stripe %d of inode %d: %d of %d shards written, chunkservers full: %w",
				gr.Stripe, ino, n-len(missing), n, syscall.ENOSPC)}
		case past:
			return nil, nil, &writeFailed{err: fmt.Errorf("fileio: stripe %d of inode %d: %d of %d shards written in %v, %d needed: %w",
				gr.Stripe, ino, n-len(missing), n, e.cfg.WriteTimeout, need, syscall.EIO)}
		}
		e.conns.KickProbes()
		if err := sleep(ctx, wait); err != nil {
			return nil, nil, err
		}
		wait = min(2*wait, waitMax)
	}
}

// writeShards writes shards idx of d to their chunkservers in parallel and
// marks the ones that became durable. It reports whether a chunkserver
// answered that it has no space.
func (e *Engine) writeShards(ctx context.Context, gr *metapb.StripeGrant, d *dirtyStripe, lay stripe.Layout, shards []*metapb.Shard, idx []int, durable []bool) (full bool) {
	unit := int(lay.Unit)
	errs := make([]error, len(idx))
	var wg sync.WaitGroup
	for x, j := range idx {
		sh := shards[j]
		n := int(lay.ShardLen(d.length, j))
		wg.Go(func() {
			b := d.buf.b[j*unit : j*unit+n]
			crc := store.Checksum(b)
			errs[x] = e.writeShard(ctx, sh, chunk.Key{Chunk: sh.ChunkId, Version: gr.Version}, []rdma.SGE{d.buf.sge(j*unit, n)}, crc)
		})
	}
	wg.Wait()
	for x, j := range idx {
		if err := errs[x]; err != nil {
			full = full || proto.IsStatus(err, proto.StatusNoSpace)
			e.stats.WriteRetries.Add(1)
			e.log.Warn("fileio: shard write failed, placing it elsewhere", "stripe", gr.Stripe, "shard", j, "server", shards[j].Address, "err", err)
			continue
		}
		durable[j] = true
	}
	return full
}

// Busy retries: a chunkserver out of staging memory or credits answers busy;
// the write waits for it a little (it frees memory as writes commit) before
// it goes elsewhere.
const (
	busyWait  = 10 * time.Millisecond
	busyTotal = 2 * time.Second
)

// writeShard writes one shard version to sh's chunkserver.
func (e *Engine) writeShard(ctx context.Context, sh *metapb.Shard, key chunk.Key, sgl []rdma.SGE, crc uint32) error {
	return e.toShard(ctx, sh, func(c *chunkclient.Client) error { return c.WriteVersion(ctx, key, sgl, crc) })
}

// toShard runs op, a write to sh's chunkserver, retrying while it answers
// busy, and records the chunkserver's health.
func (e *Engine) toShard(ctx context.Context, sh *metapb.Shard, op func(c *chunkclient.Client) error) error {
	wait, waited := busyWait, time.Duration(0)
	for {
		c, p, err := e.conns.Get(ctx, sh.ServerId, sh.Address)
		if err != nil {
			return err
		}
		err = op(c)
		if err == nil {
			e.conns.Succeeded(p)
			return nil
		}
		if !proto.IsStatus(err, proto.StatusBusy) || waited >= busyTotal {
			e.conns.Failed(ctx, p, err)
			return err
		}
		e.stats.WriteRetries.Add(1)
		if err := sleep(ctx, wait); err != nil {
			return err
		}
		waited += wait
		wait = min(2*wait, 200*time.Millisecond)
	}
}
