package fileio

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"syscall"

	"github.com/rdmafs/rdmafs/chunkserver/chunk"
	chunkclient "github.com/rdmafs/rdmafs/chunkserver/client"
	"github.com/rdmafs/rdmafs/chunkserver/proto"
	"github.com/rdmafs/rdmafs/chunkserver/store"
	"github.com/rdmafs/rdmafs/internal/stripe"
	"github.com/rdmafs/rdmafs/meta/metapb"
	"github.com/rdmafs/rdmafs/rdma"
)

// Partial-stripe writes by parity delta. Reed-Solomon parity is linear: when
// a write changes a few ranges of a committed stripe, the new parity of those
// ranges is the old parity plus the code's coefficients times the change of
// the data. So a flush of such a stripe reads the old bytes of the changed
// ranges (of the data shards that changed, and of every parity shard),
// updates the parity ranges, and has each chunkserver derive its shard's new
// version from the committed one on the same chunk: a patch (the new bytes
// of the ranges) for a changed data shard and each parity shard, a clone for
// an unchanged data shard. That is 1 + m small transfers where a full rewrite
// moves k + m whole shards. The version invariant holds: each new version is
// complete and checksummed on its chunkserver before meta commits the stripe,
// and the committed version stays untouched until then.

// deltaGap joins ranges of shard offsets closer than this into one: one read
// and one patch range instead of two.
const deltaGap = 4096

// maxDeltaRanges bounds the ranges of one shard's patch.
const maxDeltaRanges = 64

// deltaShare is the largest share of a full rewrite's bytes (k + m whole
// shards) that a delta may move, its reads and patches together; a stripe
// changed more than that is rewritten whole.
const deltaShare = 4

// span is a range [lo, hi) of shard offsets.
type span struct{ lo, hi int64 }

func (s span) len() int { return int(s.hi - s.lo) }

// deltaPlan is a dirty stripe's flush planned as a parity delta.
type deltaPlan struct {
	si *metapb.StripeInfo // the committed stripe the writes apply to
	// needOld is set when the parity depends on the old bytes (k > 1 and
	// m > 0): they are read before the patches are made.
	needOld bool
	union   []span       // the ranges touched in any data shard
	shards  []deltaShard // k + m
	buf     *buffer      // the patches, one area per patched shard
	// old is the stripe's previous delta made by this mount, when it
	// wrote the committed version si: the old bytes it holds are not read.
	old *patched
	// grant is the in-place grant the commit of the stripe's previous
	// delta made for this one (nil: none usable), and next the one this
	// delta's commit makes for the following (nextgrant.go).
	grant *metapb.StripeGrant
	next  *nextGrant
}

// deltaShard is one shard's part of a delta.
type deltaShard struct {
	// ranges are the ranges of its patch, sorted and disjoint; nil for a
	// data shard the writes did not touch, which is cloned.
	ranges []span
	off, n int // its patch in buf: header, then the ranges' bytes
}

// data returns the bytes of ds's patch ranges, back to back.
func (ds *deltaShard) data(buf *buffer) []byte {
	return buf.b[ds.off+proto.PatchHeaderLen(len(ds.ranges)) : ds.off+ds.n]
}

// planDelta plans d's flush as a parity delta and takes the memory for it,
// or returns nil when d is to be rewritten whole: no committed stripe with
// all its shards to build on, a length change, a chunkserver of it this
// mount avoids, too many bytes changed, or no memory free now. The caller
// holds f.mu.
func (e *Engine) planDelta(f *file, s uint64, d *dirtyStripe) *deltaPlan {
	lay := f.lay
	si := f.stripes[s]
	if d.noDelta || d.base == 0 || si == nil || si.Version != d.base || isInline(si) || int64(si.Length) != d.length ||
		len(si.Shards) != lay.K+lay.M || len(d.extents) == 0 || !sameCoding(stripeLayout(si, lay), lay) {
		return nil
	}
	if lay.Inline > 0 && s == 0 && f.size >= 0 && f.size <= lay.Inline {
		return nil // the flush commits it inline
	}
	avoid := e.conns.Avoid()
	for _, sh := range si.Shards {
		if sh.ServerId == "" || slices.Contains(avoid, sh.ServerId) {
			return nil
		}
	}
	needOld := lay.M > 0 && lay.K > 1
	gap := int64(0)
	if needOld {
		gap = deltaGap
	}
	// The written ranges of each data shard, in shard offsets: the extents
	// are sorted and merged, so each shard's list is too.
	per := make([][]span, lay.K)
	var all []span
	for _, x := range d.extents {
		for lo := x[0]; lo < x[1]; {
			i := lo / lay.Unit
			hi := min(x[1], (i+1)*lay.Unit)
			r := span{lo - i*lay.Unit, hi - i*lay.Unit}
			per[i] = append(per[i], r)
			all = append(all, r)
			lo = hi
		}
	}
	slices.SortFunc(all, func(a, b span) int { return int(a.lo - b.lo) })
	p := &deltaPlan{si: si, needOld: needOld, union: joinSpans(all, gap), shards: make([]deltaShard, lay.K+lay.M)}
	for i, rs := range per {
		switch {
		case len(rs) == 0:
		case needOld:
			// The parity of a range is updated over the whole range, so a
			// shard changed anywhere in it takes part with all of it.
			p.shards[i].ranges = touching(p.union, rs)
		default:
			p.shards[i].ranges = joinSpans(rs, 0)
		}
	}
	for j := lay.K; j < len(p.shards); j++ {
		p.shards[j].ranges = p.union
	}
	at, moved := 0, 0
	for x := range p.shards {
		ds := &p.shards[x]
		if ds.ranges == nil {
			continue
		}
		if len(ds.ranges) > maxDeltaRanges {
			return nil
		}
		n := 0
		for _, r := range ds.ranges {
			n += r.len()
		}
		moved += n
		if needOld {
			moved += n
		}
		ds.off, ds.n = at, proto.PatchHeaderLen(len(ds.ranges))+n
		at += (ds.n + 63) &^ 63
	}
	if moved*deltaShare > (lay.K+lay.M)*int(lay.CodedLen(d.length)) {
		return nil
	}
	if p.buf = e.pool.tryGet(at); p.buf == nil {
		return nil
	}
	e.addBuf(f, len(p.buf.b))
	if needOld {
		p.old = e.patchedFor(f, s, si)
	}
	p.grant = e.takeNextGrant(f, s, d, si)
	return p
}

// joinSpans merges sorted spans that overlap or lie closer than gap.
func joinSpans(in []span, gap int64) []span {
	var out []span
	for _, r := range in {
		if n := len(out); n > 0 && r.lo <= out[n-1].hi+gap {
			out[n-1].hi = max(out[n-1].hi, r.hi)
			continue
		}
		out = append(out, r)
	}
	return out
}

// touching returns the spans of union that intersect any of rs (both sorted).
func touching(union, rs []span) []span {
	var out []span
	j := 0
	for _, u := range union {
		for j < len(rs) && rs[j].hi <= u.lo {
			j++
		}
		if j < len(rs) && rs[j].lo < u.hi {
			out = append(out, u)
		}
	}
	return out
}

// dropDelta gives back the memory of d's delta. The caller holds f.mu.
func (e *Engine) dropDelta(f *file, d *dirtyStripe) {
	if d.delta == nil {
		return
	}
	e.addBuf(f, -len(d.delta.buf.b))
	e.pool.put(d.delta.buf)
	d.delta = nil
}

// overlay copies the bytes written to d within stripe offsets [lo,
// lo+len(dst)) into dst, oldest first. d is not changing (flushing).
func (d *dirtyStripe) overlay(dst []byte, lo int64) {
	hi := lo + int64(len(dst))
	if d.buf == nil {
		for _, w := range d.sparse {
			a, b := max(lo, w.off), min(hi, w.off+int64(len(w.b)))
			if a < b {
				copy(dst[a-lo:b-lo], w.b[a-w.off:b-w.off])
			}
		}
		return
	}
	for _, x := range d.extents {
		a, b := max(lo, x[0]), min(hi, x[1])
		if a < b {
			copy(dst[a-lo:b-lo], d.buf.b[a:b])
		}
	}
}

// writtenIn returns copies of the bytes written to d within [so, so+n), for
// a reader of a stripe whose delta is being flushed (its buffer, if any, is
// not filled with the committed bytes).
func (d *dirtyStripe) writtenIn(so, n int64) []sparseWrite {
	if d.buf == nil {
		return d.copyWrites(so, n)
	}
	var out []sparseWrite
	for _, x := range d.extents {
		a, b := max(so, x[0]), min(so+n, x[1])
		if a < b {
			out = append(out, sparseWrite{a, slices.Clone(d.buf.b[a:b])})
		}
	}
	return out
}

// deltaFailed is a delta flush that could not complete (its grant was not in
// place, or a chunkserver failed it): the stripes are flushed again, whole.
type deltaFailed struct{ err error }

func (d *deltaFailed) Error() string { return "fileio: partial-stripe write: " + d.err.Error() }
func (d *deltaFailed) Unwrap() error { return d.err }

// writeDelta writes d's delta under grant gr: the old ranges are read, the
// parity updated, and every shard's new version derived on its chunkserver.
// It runs without the file's lock: d and its delta belong to the flush.
func (e *Engine) writeDelta(ctx context.Context, lay stripe.Layout, gr *metapb.StripeGrant, d *dirtyStripe) error {
	p := d.delta
	if !gr.InPlace || gr.CommittedVersion != d.base || !metapb.SameShards(gr.Shards, p.si.Shards) {
		return &deltaFailed{fmt.Errorf("stripe %d not granted in place over version %d", gr.Stripe, d.base)}
	}
	base := p.si.Version
	n := lay.K + lay.M
	if p.needOld {
		if err := e.parallel(n, func(x int) error {
			ds := &p.shards[x]
			sh := gr.Shards[x]
			at := ds.off + proto.PatchHeaderLen(len(ds.ranges))
			for _, r := range ds.ranges {
				if p.old != nil && p.old.old(x, r, p.buf.b[at:at+r.len()]) {
					e.stats.DeltaOldKept.Add(1)
					at += r.len()
					continue
				}
				sgl := []rdma.SGE{p.buf.sge(at, r.len())}
				if err := e.readShard(ctx, sh, chunk.Key{Chunk: sh.ChunkId, Version: base}, int(r.lo), sgl); err != nil {
					return fmt.Errorf("read shard %d: %w", x, err)
				}
				at += r.len()
			}
			return nil
		}); err != nil {
			return &deltaFailed{err}
		}
		if err := e.updateParity(lay, p, d); err != nil {
			return err
		}
	} else {
		e.copyDelta(lay, p, d)
	}
	err := e.parallel(n, func(x int) error {
		ds := &p.shards[x]
		sh := gr.Shards[x]
		key := chunk.Key{Chunk: sh.ChunkId, Version: gr.Version}
		if ds.ranges == nil {
			return e.toShard(ctx, sh, func(c *chunkclient.Client) error {
				_, err := c.Clone(ctx, key, base)
				return err
			})
		}
		pr := make([]proto.PatchRange, len(ds.ranges))
		for i, r := range ds.ranges {
			pr[i] = proto.PatchRange{Off: uint32(r.lo), Len: uint32(r.len())}
		}
		proto.EncodePatchHeader(p.buf.b[ds.off:], pr)
		crc := store.Checksum(p.buf.b[ds.off : ds.off+ds.n])
		sgl := []rdma.SGE{p.buf.sge(ds.off, ds.n)}
		return e.toShard(ctx, sh, func(c *chunkclient.Client) error {
			_, err := c.WritePatch(ctx, key, base, sgl, crc)
			return err
		})
	})
	if err != nil {
		return &deltaFailed{err}
	}
	e.stats.DeltaWrites.Add(1)
	return nil
}

// updateParity puts the new bytes of the changed data ranges in place of the
// old ones read into the patches, and updates the parity ranges by the
// change.
func (e *Engine) updateParity(lay stripe.Layout, p *deltaPlan, d *dirtyStripe) error {
	enc, err := e.codecs.Get(lay.K, lay.M)
	if err != nil {
		return err
	}
	n := lay.K + lay.M
	// pos[x] walks shard x's ranges, which are a subsequence of union.
	pos := make([]int, n)
	ri := make([]int, n)
	old := make([][]byte, n)
	newData := make([][]byte, lay.K)
	var scratch []byte
	for _, u := range p.union {
		l := u.len()
		scratch = slices.Grow(scratch[:0], lay.K*l)[:lay.K*l]
		clear(old)
		clear(newData)
		for x := range n {
			ds := &p.shards[x]
			if ri[x] >= len(ds.ranges) || ds.ranges[ri[x]] != u {
				continue
			}
			area := ds.data(p.buf)[pos[x] : pos[x]+l]
			pos[x] += l
			ri[x]++
			if x >= lay.K {
				old[x] = area // updated in place
				continue
			}
			old[x] = scratch[x*l : (x+1)*l]
			copy(old[x], area)
			d.overlay(area, int64(x)*lay.Unit+u.lo)
			newData[x] = area
		}
		if err := enc.Update(old, newData); err != nil {
			return fmt.Errorf("fileio: parity delta of stripe %d: %w: %w", p.si.Stripe, err, syscall.EIO)
		}
	}
	return nil
}

// copyDelta fills the patches when no old bytes are needed: the data
// shards' with the new bytes, and with k = 1 each copy's with the data's.
func (e *Engine) copyDelta(lay stripe.Layout, p *deltaPlan, d *dirtyStripe) {
	for i := range lay.K {
		ds := &p.shards[i]
		at := ds.data(p.buf)
		for _, r := range ds.ranges {
			d.overlay(at[:r.len()], int64(i)*lay.Unit+r.lo)
			at = at[r.len():]
		}
	}
	for j := lay.K; j < lay.K+lay.M; j++ {
		copy(p.shards[j].data(p.buf), p.shards[0].data(p.buf))
	}
}

// parallel runs fn for 0..n-1 at once and returns their errors joined.
func (e *Engine) parallel(n int, fn func(x int) error) error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for x := range n {
		wg.Go(func() { errs[x] = fn(x) })
	}
	wg.Wait()
	return errors.Join(errs...)
}
