package ec

import "fmt"

// Extent is the part of a byte range that lies in one data shard of one stripe.
type Extent struct {
	Stripe   int64 // stripe index
	Shard    int   // data shard index, 0 <= Shard < K
	ShardOff int64 // offset within the shard (the chunk), 0 <= ShardOff < Unit
	Len      int64 // bytes, > 0
	BufOff   int64 // offset within the caller's buffer, which starts at the range's start
}

// FileOff returns the file offset of the extent's first byte in layout l.
func (e Extent) FileOff(l Layout) int64 {
	return l.StripeStart(e.Stripe) + int64(e.Shard)*l.Unit + e.ShardOff
}

// String formats e for logs and test failures.
func (e Extent) String() string {
	return fmt.Sprintf("{stripe %d shard %d [%d,+%d) buf %d}", e.Stripe, e.Shard, e.ShardOff, e.Len, e.BufOff)
}

// ExtentIter walks the extents of a byte range in file order without allocating.
// The zero value is an exhausted iterator. Use [Layout.Iter] to make one.
type ExtentIter struct {
	unit   int64
	k      int64
	off    int64 // next file offset
	end    int64 // end of the range
	bufOff int64
}

// Iter returns an iterator over the extents of the file range [off, off+n), in
// file order. It fails if l is invalid or the range is negative or ends beyond
// [MaxFileSize]. A zero-length range has no extents.
func (l Layout) Iter(off, n int64) (ExtentIter, error) {
	if err := l.Validate(); err != nil {
		return ExtentIter{}, err
	}
	if err := checkRange(off, n); err != nil {
		return ExtentIter{}, err
	}
	return ExtentIter{unit: l.Unit, k: int64(l.K), off: off, end: off + n}, nil
}

// Next returns the next extent, or false when the range is exhausted.
func (it *ExtentIter) Next() (Extent, bool) {
	if it.off >= it.end {
		return Extent{}, false
	}
	u := it.off / it.unit // index of the unit, file-wide
	shardOff := it.off - u*it.unit
	n := min(it.unit-shardOff, it.end-it.off)
	e := Extent{
		Stripe:   u / it.k,
		Shard:    int(u % it.k),
		ShardOff: shardOff,
		Len:      n,
		BufOff:   it.bufOff,
	}
	it.off += n
	it.bufOff += n
	return e, true
}

// Remaining returns how many extents Next has still to return.
func (it *ExtentIter) Remaining() int {
	if it.off >= it.end {
		return 0
	}
	return int((it.end-1)/it.unit - it.off/it.unit + 1)
}

// Extents appends the extents of the file range [off, off+n) to dst in file
// order and returns the extended slice. It allocates only if dst lacks the
// capacity; [Layout.ExtentCount] says how much is needed.
func (l Layout) Extents(dst []Extent, off, n int64) ([]Extent, error) {
	it, err := l.Iter(off, n)
	if err != nil {
		return dst, err
	}
	for e, ok := it.Next(); ok; e, ok = it.Next() {
		dst = append(dst, e)
	}
	return dst, nil
}

// ExtentCount returns the number of extents of the file range [off, off+n), or 0
// if the layout or the range is invalid.
func (l Layout) ExtentCount(off, n int64) int {
	it, err := l.Iter(off, n)
	if err != nil {
		return 0
	}
	return it.Remaining()
}

// StripeSpan returns the stripes the file range [off, off+n) touches: first, and
// count (0 for a zero-length range).
func (l Layout) StripeSpan(off, n int64) (first, count int64, err error) {
	if err := l.Validate(); err != nil {
		return 0, 0, err
	}
	if err := checkRange(off, n); err != nil {
		return 0, 0, err
	}
	if n == 0 {
		return l.StripeOf(off), 0, nil
	}
	first = l.StripeOf(off)
	return first, l.StripeOf(off+n-1) - first + 1, nil
}
