package ec

import "fmt"

// WritePlan is what writing part of a file range into one stripe involves: a
// new version of the stripe whose parity is computed from all of its data, so
// the old bytes the write does not replace must be read first unless the write
// covers all of the stripe's data.
type WritePlan struct {
	Stripe   int64 // stripe index
	WriteOff int64 // where the write's bytes go, relative to the stripe's start
	WriteLen int64 // how many of the write's bytes land in this stripe
	BufOff   int64 // offset of those bytes in the caller's write buffer
	OldLen   int64 // bytes of file data the stripe held before (0: a new stripe)
	NewLen   int64 // bytes it holds after: max(OldLen, WriteOff+WriteLen)
	ShardLen int   // shard length L of the new version: ShardLen(NewLen)
	// Reads are the old bytes to read before encoding, in file order; their
	// BufOff is relative to the stripe's start, i.e. where they go in a buffer
	// laid out like the stripe's data. Bytes between OldLen and WriteOff (a
	// hole) are zeros and are never read. Empty for a write that replaces all
	// of the stripe's old data.
	Reads []Extent
	// Rewrite has bit i set for every data shard whose new version differs from
	// the old one: touched by the write, or grown with zeros because the stripe
	// grew (its DataShardLen changed). Untouched shards keep their bytes. Every
	// parity shard is rewritten.
	Rewrite uint64
}

// NeedsRead reports whether the write must read old data first
// (read-modify-write).
func (p *WritePlan) NeedsRead() bool { return len(p.Reads) > 0 }

// Rewrites reports whether data shard i gets a new version.
func (p *WritePlan) Rewrites(i int) bool { return i >= 0 && i < 64 && p.Rewrite&(1<<uint(i)) != 0 }

// PlanWrite plans the part of a write of the file range [off, off+n) that falls
// into stripe s, which held oldLen bytes of file data before the write (see
// [Layout.StripeDataLen] of the old file size; 0 for a stripe beyond the end).
// The read extents are appended to reads (pass a slice with capacity to avoid
// allocating; a stripe needs at most K+1) and returned in the plan. It fails if
// the range misses the stripe, n is 0, or the arguments are out of bounds.
func (l Layout) PlanWrite(reads []Extent, s int64, oldLen, off, n int64) (WritePlan, error) {
	if err := l.Validate(); err != nil {
		return WritePlan{}, err
	}
	if err := checkRange(off, n); err != nil {
		return WritePlan{}, fmt.Errorf("ec: plan write: %w", err)
	}
	ss := l.StripeSize()
	if s < 0 || s > MaxFileSize/ss || oldLen < 0 || oldLen > ss {
		return WritePlan{}, fmt.Errorf("ec: plan write: stripe %d holding %d bytes: %w (stripe size %d)", s, oldLen, ErrRange, ss)
	}
	start := s * ss
	ws, we := max(off, start)-start, min(off+n, start+ss)-start // stripe-relative write range
	if n == 0 || ws >= we {
		return WritePlan{}, fmt.Errorf("ec: plan write: range [%d, +%d) does not touch stripe %d (%v): %w", off, n, s, l, ErrRange)
	}
	p := WritePlan{
		Stripe:   s,
		WriteOff: ws,
		WriteLen: we - ws,
		BufOff:   start + ws - off,
		OldLen:   oldLen,
		NewLen:   max(oldLen, we),
	}
	p.ShardLen = l.ShardLen(p.NewLen)
	// Old bytes outside the write: [0, min(ws, oldLen)) and [we, oldLen).
	reads = l.appendStripeExtents(reads, s, 0, min(ws, oldLen))
	reads = l.appendStripeExtents(reads, s, we, oldLen)
	p.Reads = reads
	for i := range l.K {
		lo, hi := int64(i)*l.Unit, int64(i+1)*l.Unit
		touched := ws < hi && we > lo
		if touched || l.DataShardLen(oldLen, i) != l.DataShardLen(p.NewLen, i) {
			p.Rewrite |= 1 << uint(i)
		}
	}
	return p, nil
}

// appendStripeExtents appends the extents of the stripe-relative range
// [from, to) of stripe s, with BufOff relative to the stripe's start.
func (l Layout) appendStripeExtents(dst []Extent, s, from, to int64) []Extent {
	for from < to {
		i := from / l.Unit
		so := from - i*l.Unit
		n := min(l.Unit-so, to-from)
		dst = append(dst, Extent{Stripe: s, Shard: int(i), ShardOff: so, Len: n, BufOff: from})
		from += n
	}
	return dst
}
