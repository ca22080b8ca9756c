package ec

import (
	"errors"
	"fmt"
)

// Limits of a [Layout].
const (
	// MaxShards is the largest K+M a layout may have.
	MaxShards = 32
	// UnitAlign is the granularity of Layout.Unit: the page size, so that every
	// shard boundary is page aligned in files, chunks and registered memory.
	UnitAlign = 4096
	// MaxUnit is the largest Layout.Unit (64 MiB).
	MaxUnit = 64 << 20
	// MaxFileSize is the largest file size, and the end of the largest byte range,
	// the package maps (4 EiB). It keeps every offset computation far from int64
	// overflow for any valid layout.
	MaxFileSize int64 = 1 << 62
)

// ErrInvalidLayout is wrapped by every error of [Layout.Validate].
var ErrInvalidLayout = errors.New("invalid layout")

// ErrRange is wrapped by errors about a byte range that is negative or ends beyond
// [MaxFileSize].
var ErrRange = errors.New("byte range out of bounds")

// Layout is the erasure-coding layout of a file: K data shards and M parity
// shards per stripe, each at most Unit bytes. K=1 means replication (M+1 copies).
// The geometry helpers (StripeSize, StripeOf, ShardLen, ...) assume a valid
// layout; the methods that take a byte range (Iter, Extents, StripeSpan,
// PlanWrite) validate it and the range.
type Layout struct {
	K, M int   // data and parity shards per stripe
	Unit int64 // bytes of file data per data shard; the stripe unit
}

// DefaultLayout returns the default layout of the design: 4+2 with 1 MiB units.
func DefaultLayout() Layout { return Layout{K: 4, M: 2, Unit: 1 << 20} }

// Validate reports whether l is usable, with an error wrapping
// [ErrInvalidLayout] that says what is wrong.
func (l Layout) Validate() error {
	switch {
	case l.K < 1:
		return fmt.Errorf("ec: layout %v: %w: K=%d, need at least 1 data shard", l, ErrInvalidLayout, l.K)
	case l.M < 0:
		return fmt.Errorf("ec: layout %v: %w: M=%d is negative", l, ErrInvalidLayout, l.M)
	case l.K > MaxShards || l.M > MaxShards || l.K+l.M > MaxShards:
		return fmt.Errorf("ec: layout %v: %w: K+M=%d shards, at most %d", l, ErrInvalidLayout, l.K+l.M, MaxShards)
	case l.Unit <= 0:
		return fmt.Errorf("ec: layout %v: %w: unit %d is not positive", l, ErrInvalidLayout, l.Unit)
	case l.Unit%UnitAlign != 0:
		return fmt.Errorf("ec: layout %v: %w: unit %d is not a multiple of %d", l, ErrInvalidLayout, l.Unit, UnitAlign)
	case l.Unit > MaxUnit:
		return fmt.Errorf("ec: layout %v: %w: unit %d is larger than %d (64 MiB)", l, ErrInvalidLayout, l.Unit, MaxUnit)
	}
	return nil
}

// String formats l as "K+M/unit", e.g. "4+2/1MiB".
func (l Layout) String() string {
	u := l.Unit
	switch {
	case u > 0 && u%(1<<20) == 0:
		return fmt.Sprintf("%d+%d/%dMiB", l.K, l.M, u>>20)
	case u > 0 && u%(1<<10) == 0:
		return fmt.Sprintf("%d+%d/%dKiB", l.K, l.M, u>>10)
	}
	return fmt.Sprintf("%d+%d/%dB", l.K, l.M, u)
}

// Shards returns K+M, the number of shards (chunks) of a stripe.
func (l Layout) Shards() int { return l.K + l.M }

// IsReplication reports whether l is replication (K=1): every parity shard is a
// copy of the data shard.
func (l Layout) IsReplication() bool { return l.K == 1 }

// StripeSize returns K×Unit, the bytes of file data a full stripe holds.
func (l Layout) StripeSize() int64 { return int64(l.K) * l.Unit }

// StripeOf returns the index of the stripe that holds file offset off (off >= 0).
func (l Layout) StripeOf(off int64) int64 { return off / l.StripeSize() }

// StripeStart returns the file offset of the first byte of stripe s.
func (l Layout) StripeStart(s int64) int64 { return s * l.StripeSize() }

// NumStripes returns the number of stripes of a file of the given size.
func (l Layout) NumStripes(size int64) int64 {
	if size <= 0 {
		return 0
	}
	return (size-1)/l.StripeSize() + 1
}

// StripeDataLen returns how many bytes of a file of the given size lie in stripe
// s: StripeSize for every stripe but the last, 0 for stripes beyond the end.
func (l Layout) StripeDataLen(size, s int64) int64 {
	start := l.StripeStart(s)
	if size <= start {
		return 0
	}
	return min(size-start, l.StripeSize())
}

// ShardLen returns the shard length L of a stripe holding n bytes of file data:
// min(Unit, n), the length of data shard 0 and of every parity shard (see the
// package documentation).
func (l Layout) ShardLen(n int64) int {
	return int(max(0, min(n, l.Unit)))
}

// DataShardLen returns how many bytes of file data data shard i of a stripe
// holding n bytes has: clamp(n - i×Unit, 0, Unit).
func (l Layout) DataShardLen(n int64, i int) int {
	return int(max(0, min(n-int64(i)*l.Unit, l.Unit)))
}

// checkRange validates the file byte range [off, off+n) without overflowing.
func checkRange(off, n int64) error {
	if off < 0 || n < 0 || off > MaxFileSize || n > MaxFileSize-off {
		return fmt.Errorf("ec: range [%d, +%d): %w (max file size %d)", off, n, ErrRange, MaxFileSize)
	}
	return nil
}

// StripeShards slices buf, a stripe buffer laid out as the stripe's data in file
// order (K×Unit bytes) followed by its M parity shards (Unit bytes each), into
// the K+M shard slices of a stripe holding n bytes (0 < n <= StripeSize),
// following the shard-length convention: data shard i is
// buf[i×Unit:][:DataShardLen(n, i)] (nil when that is 0) and parity shard j is
// L = ShardLen(n) bytes at K×Unit + j×Unit. Each slice's capacity ends at its
// unit, so one shard's reconstruction (shards[i][:0] marks it missing) can never
// spill into the next. The slices are appended to dst, which is returned; with
// capacity for K+M entries nothing is allocated.
func (l Layout) StripeShards(dst [][]byte, buf []byte, n int64) ([][]byte, error) {
	if err := l.Validate(); err != nil {
		return dst, err
	}
	if n <= 0 || n > l.StripeSize() {
		return dst, fmt.Errorf("ec: stripe shards %v: %d bytes of data, want 1..%d: %w", l, n, l.StripeSize(), ErrRange)
	}
	if need := int64(l.Shards()) * l.Unit; int64(len(buf)) < need {
		return dst, fmt.Errorf("ec: stripe shards %v: buffer of %d bytes, want %d: %w", l, len(buf), need, ErrRange)
	}
	u := int(l.Unit)
	for i := range l.K {
		d := l.DataShardLen(n, i)
		if d == 0 {
			dst = append(dst, nil)
			continue
		}
		dst = append(dst, buf[i*u:i*u+d:(i+1)*u])
	}
	L := l.ShardLen(n)
	for j := l.K; j < l.Shards(); j++ {
		dst = append(dst, buf[j*u:j*u+L:(j+1)*u])
	}
	return dst, nil
}
