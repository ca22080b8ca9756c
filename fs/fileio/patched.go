package fileio

import "github.com/rdmafs/rdmafs/meta/metapb"

// A parity delta needs the old bytes of the ranges it changes, of the data
// shards and of every parity shard. A database rewrites the same few pages
// (its header, the leaf it appends to) at every commit, so the ranges one
// delta of a stripe changes are mostly those the previous one changed. The
// mount keeps, per stripe of a file, the bytes its last delta gave those
// ranges (patched), named by the chunk versions that hold them; the next
// delta built on those very versions takes its old bytes from there instead
// of reading them from the chunkservers. Chunk versions are immutable, so the
// copy is right for as long as the stripe's committed version is the one it
// names.

// maxPatchedPerFile bounds the stripes of one file whose last delta the
// mount keeps.
const maxPatchedPerFile = 4

// maxPatchedBytes bounds the bytes of kept deltas of a whole mount: past it,
// deltas are not kept (their next delta reads the old bytes).
const maxPatchedBytes = 16 << 20

// patched is the bytes a stripe's last parity delta wrote to the ranges it
// changed, per shard, as stored in the chunk versions it committed.
type patched struct {
	version uint64   // the stripe version the delta committed
	chunks  []uint64 // the chunk of each shard
	ranges  [][]span // per shard, sorted and disjoint; nil for a shard not patched
	bytes   [][]byte // per shard, the bytes of its ranges back to back, in buf
	buf     []byte
	size    int // bytes of buf in use
}

// old copies the bytes of shard x's range r into dst and reports whether it
// could: r lies within one of the ranges kept for x.
func (pc *patched) old(x int, r span, dst []byte) bool {
	at := 0
	for _, k := range pc.ranges[x] {
		if r.lo >= k.lo && r.hi <= k.hi {
			copy(dst, pc.bytes[x][at+int(r.lo-k.lo):at+int(r.hi-k.lo)])
			return true
		}
		at += k.len()
	}
	return false
}

// matches reports whether pc holds bytes of the stripe version si: the same
// version of the same chunks.
func (pc *patched) matches(si *metapb.StripeInfo) bool {
	if pc.version != si.Version || len(pc.chunks) != len(si.Shards) {
		return false
	}
	for i, sh := range si.Shards {
		if sh.ChunkId != pc.chunks[i] {
			return false
		}
	}
	return true
}

// patchedFor returns what f keeps of the last delta of stripe s if it holds
// bytes of the committed version si the next delta builds on, and drops it
// otherwise (the stripe moved on without this mount's delta). The caller
// holds f.mu.
func (e *Engine) patchedFor(f *file, s uint64, si *metapb.StripeInfo) *patched {
	pc := f.patched[s]
	if pc == nil || pc.matches(si) {
		return pc
	}
	e.dropPatched(f, s)
	return nil
}

// keepPatched records the bytes delta p wrote, committed as version v of
// stripe s of f, for the stripe's next delta, in the memory of the copy it
// replaces when that is large enough (a stripe flushes once at a time, so
// the delta that read that copy is done). Within the bounds
// (maxPatchedPerFile, maxPatchedBytes) it makes room by dropping another
// stripe's copy of f; past them nothing is kept. The caller holds f.mu.
func (e *Engine) keepPatched(f *file, s uint64, v uint64, p *deltaPlan) {
	prev := f.patched[s]
	e.dropPatched(f, s)
	if !p.needOld {
		return // no old bytes are read for this layout
	}
	for k := range f.patched {
		if len(f.patched) < maxPatchedPerFile {
			break
		}
		e.dropPatched(f, k)
	}
	size := 0
	for x := range p.shards {
		if p.shards[x].ranges != nil {
			size += len(p.shards[x].data(p.buf))
		}
	}
	if e.patchedBytes.Add(int64(size)) > maxPatchedBytes {
		e.patchedBytes.Add(-int64(size))
		return
	}
	pc := prev
	if pc == nil || len(pc.chunks) != len(p.si.Shards) || cap(pc.buf) < size {
		pc = &patched{chunks: make([]uint64, len(p.si.Shards)), ranges: make([][]span, len(p.shards)),
			bytes: make([][]byte, len(p.shards)), buf: make([]byte, size)}
	}
	pc.version, pc.size, pc.buf = v, size, pc.buf[:size]
	for i, sh := range p.si.Shards {
		pc.chunks[i] = sh.ChunkId
	}
	at := 0
	for x := range p.shards {
		ds := &p.shards[x]
		pc.ranges[x], pc.bytes[x] = ds.ranges, nil
		if ds.ranges != nil {
			n := copy(pc.buf[at:], ds.data(p.buf))
			pc.bytes[x] = pc.buf[at : at+n]
			at += n
		}
	}
	if f.patched == nil {
		f.patched = map[uint64]*patched{}
	}
	f.patched[s] = pc
}

// dropPatched forgets the kept delta of stripe s of f. The caller holds f.mu.
func (e *Engine) dropPatched(f *file, s uint64) {
	if pc := f.patched[s]; pc != nil {
		e.patchedBytes.Add(-int64(pc.size))
		delete(f.patched, s)
	}
}

// dropAllPatched forgets every kept delta of f. The caller holds f.mu.
func (e *Engine) dropAllPatched(f *file) {
	for s := range f.patched {
		e.dropPatched(f, s)
	}
}
