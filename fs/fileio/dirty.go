package fileio

// A dirty stripe: the buffered writes of one stripe, whole in a buffer or
// sparse in slabs, with the extents written and what is still to be filled.

import (
	"cmp"
	"errors"
	"slices"

	"github.com/rdmafs/rdmafs/meta/metapb"
)

// dirtyStripe is a stripe being rewritten: data shards then parity in one
// registered buffer, built on base (the committed version, 0 for none).
//
// A stripe whose first write is small and not where a sequential writer
// would begin is sparse instead: buf is nil and the writes are kept as they
// came, in slabs, so that a random writer gathers many writes in many
// stripes within the memory of a few whole stripes. So is the one stripe of
// a file within its layout's inline size: it is committed into metadata
// from its slabs (inlineData) and never needs registered memory. A sparse
// stripe gets its buffer (materialize) when its writes add up to a quarter
// of the stripe, when a file written in order outgrows the inline size, or
// when it is flushed to chunkservers; reads overlay its writes on the
// committed data.
type dirtyStripe struct {
	buf     *buffer
	sparse  []sparseWrite // while buf is nil: the writes, oldest first
	slabs   []*slab       // hold the sparse writes' bytes
	slabOff int           // bytes used of the last slab
	base    uint64
	length  int64      // bytes of file data in the stripe
	extents [][2]int64 // ranges written, sorted and merged, for reapplying after a conflict
	// base is read in lazily: committed holds the committed stripe whose bytes
	// [0, fillEnd) not covered by extents are still to be read into buf (nil
	// when there is nothing to read). A stripe that the writer ends up covering
	// whole, as a sequential overwrite does, is never read.
	committed *metapb.StripeInfo
	fillEnd   int64
	// delta is set while the stripe flushes as a parity delta (its buffer,
	// if any, is then not filled); noDelta once a delta of it failed.
	delta   *deltaPlan
	noDelta bool
	// filling is set (under f.mu) while the stripe flushes and its flush
	// still reads the committed bytes around the writes into buf.
	filling bool
	// The data area, buf.b[:dataLen], is zeroed lazily: [0, clean) holds
	// written, filled or zeroed bytes and the rest whatever the buffer held
	// before. A writer that covers the stripe in order, as sequential writes
	// do, never has it cleared; anything else that reads or fills the buffer
	// calls zero first.
	clean, dataLen int64
}

// slabSize is the size of the pieces of memory that hold sparse writes; a
// write larger than a slab makes its stripe whole at once.
const slabSize = 64 << 10

type slab [slabSize]byte

// sparseWrite is a write kept in a sparse stripe: b at offset off.
type sparseWrite struct {
	off int64
	b   []byte
}

// sparseBytes returns the slab memory d holds.
func (d *dirtyStripe) sparseBytes() int { return len(d.slabs) * slabSize }

// addSparse keeps p, written at offset so, in d's slabs and returns how many
// bytes of slab memory d took for it.
func (e *Engine) addSparse(d *dirtyStripe, so int64, p []byte) int {
	grew := 0
	for len(p) > 0 {
		if len(d.slabs) == 0 || d.slabOff == slabSize {
			sl, _ := e.slabs.Get().(*slab)
			if sl == nil {
				sl = new(slab)
			}
			d.slabs, d.slabOff = append(d.slabs, sl), 0
			grew += slabSize
		}
		n := copy(d.slabs[len(d.slabs)-1][d.slabOff:], p)
		d.sparse = append(d.sparse, sparseWrite{so, d.slabs[len(d.slabs)-1][d.slabOff : d.slabOff+n]})
		d.slabOff += n
		so += int64(n)
		p = p[n:]
	}
	return grew
}

// copyWrites returns copies of d's sparse writes clipped to [so, so+n),
// oldest first.
func (d *dirtyStripe) copyWrites(so, n int64) []sparseWrite {
	var out []sparseWrite
	for _, w := range d.sparse {
		lo, hi := max(so, w.off), min(so+n, w.off+int64(len(w.b)))
		if lo < hi {
			out = append(out, sparseWrite{lo, slices.Clone(w.b[lo-w.off : hi-w.off])})
		}
	}
	return out
}

// dropSparse gives d's slabs back, takes them off f's accounts and
// returns the memory freed. The caller holds f.mu.
func (e *Engine) dropSparse(f *file, d *dirtyStripe) int {
	n := d.sparseBytes()
	f.sparse -= n
	e.addBuf(f, -n)
	for _, sl := range d.slabs {
		e.slabs.Put(sl)
	}
	e.sparseTotal.Add(-int64(n))
	d.slabs, d.sparse, d.slabOff = nil, nil, 0
	return n
}

// materialize gives sparse stripe d the whole-stripe buffer buf and applies
// its writes to it; the committed bytes around them are read in lazily, as
// for any partly written stripe. The caller holds f.mu.
func (e *Engine) materialize(f *file, d *dirtyStripe, buf *buffer) {
	d.buf, d.clean = buf, 0
	d.zero()
	for _, w := range d.sparse {
		copy(buf.b[w.off:], w.b)
	}
	e.dropSparse(f, d)
	e.addBuf(f, len(buf.b))
}

// inlineData returns the bytes of d, a stripe committed into metadata: its
// buffer's, or (own: a new slice) its sparse writes over the committed
// inline bytes not yet filled in, zeros elsewhere. The caller owns d.
func (d *dirtyStripe) inlineData() (data []byte, own bool) {
	if d.buf != nil {
		return d.buf.b[:d.length], false
	}
	data = make([]byte, d.length)
	if c := d.committed; c != nil {
		copy(data[:min(d.fillEnd, d.length)], c.InlineData)
	}
	for _, w := range d.sparse {
		if w.off < d.length {
			copy(data[w.off:], w.b)
		}
	}
	return data, true
}

// dropDirty gives back all the memory of dirty stripe d: its buffer, its
// slabs and its delta's. The caller holds f.mu.
func (e *Engine) dropDirty(f *file, d *dirtyStripe) {
	if d.buf != nil {
		e.addBuf(f, -len(d.buf.b))
		e.pool.put(d.buf)
		d.buf = nil
	}
	e.dropSparse(f, d)
	e.dropDelta(f, d)
}

// errNoBuffer reports that a sparse stripe could not get its buffer now.
var errNoBuffer = errors.New("fileio: no buffer memory free for a sparse stripe")

// zeroTo clears the data area from clean up to end.
func (d *dirtyStripe) zeroTo(end int64) {
	if end > d.clean {
		clear(d.buf.b[d.clean:end])
		d.clean = end
	}
}

// zero clears whatever of the data area is not yet written or cleared.
func (d *dirtyStripe) zero() { d.zeroTo(d.dataLen) }

// gaps calls fn for each range of [0, end) not covered by the extents.
func (d *dirtyStripe) gaps(end int64, fn func(lo, hi int64) error) error {
	at := int64(0)
	for _, x := range d.extents {
		if x[0] >= end {
			break
		}
		if x[0] > at {
			if err := fn(at, x[0]); err != nil {
				return err
			}
		}
		at = max(at, x[1])
	}
	if at < end {
		return fn(at, end)
	}
	return nil
}

// truncateSparse cuts the sparse writes at n.
func (d *dirtyStripe) truncateSparse(n int64) {
	out := d.sparse[:0]
	for _, w := range d.sparse {
		if w.off < n {
			w.b = w.b[:min(int64(len(w.b)), n-w.off)]
			out = append(out, w)
		}
	}
	d.sparse = out
}

// truncate cuts the extents at n.
func (d *dirtyStripe) truncate(n int64) {
	out := d.extents[:0]
	for _, x := range d.extents {
		if x[0] < n {
			out = append(out, [2]int64{x[0], min(x[1], n)})
		}
	}
	d.extents = out
	d.fillEnd = min(d.fillEnd, n)
}

// addExtent records [lo, hi) as written, keeping the list sorted and merged
// (extents that overlap or touch become one). It runs on every write: a
// binary search and one move of the extents after it, where a random
// writer's stripe holds hundreds.
func (d *dirtyStripe) addExtent(lo, hi int64) {
	x := d.extents
	i, _ := slices.BinarySearchFunc(x, lo, func(e [2]int64, lo int64) int { return cmp.Compare(e[1], lo) })
	j := i
	for j < len(x) && x[j][0] <= hi {
		lo, hi = min(lo, x[j][0]), max(hi, x[j][1])
		j++
	}
	d.extents = slices.Replace(x, i, j, [2]int64{lo, hi})
}

// covers reports whether the writes cover [0, n).
func (d *dirtyStripe) covers(n int64) bool {
	return len(d.extents) == 1 && d.extents[0][0] == 0 && d.extents[0][1] >= n
}
