package metapb

import (
	"math"

	"github.com/rdmafs/rdmafs/internal/stripe"
)

// This file is the one place where a layout crosses between its domain type,
// stripe.Layout, and its wire and stored form, Layout.

// LayoutOf returns the wire form of l, which should be valid (Validate):
// a negative field does not fit the unsigned wire fields.
func LayoutOf(l stripe.Layout) *Layout {
	return &Layout{K: uint32(l.K), M: uint32(l.M), Unit: uint64(l.Unit),
		MinWriteShards: uint32(l.MinWrite), InlineMax: uint64(l.Inline)}
}

// Stripe returns the layout l encodes; a nil l gives the zero stripe.Layout
// (no layout). Unit and InlineMax above math.MaxInt64 become math.MaxInt64,
// which Validate refuses as any out-of-range value.
func (l *Layout) Stripe() stripe.Layout {
	if l == nil {
		return stripe.Layout{}
	}
	return stripe.Layout{K: int(l.K), M: int(l.M), Unit: toInt64(l.Unit),
		MinWrite: int(l.MinWriteShards), Inline: toInt64(l.InlineMax)}
}

func toInt64(v uint64) int64 { return int64(min(v, math.MaxInt64)) }
