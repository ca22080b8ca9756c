package metapb

import (
	"encoding/hex"
	"math"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/rdmafs/rdmafs/internal/stripe"
)

func TestLayoutConversion(t *testing.T) {
	for _, l := range []stripe.Layout{
		{},
		{K: 4, M: 2, Unit: 1 << 20, Inline: stripe.DefaultInline},
		{K: 1, M: 2, Unit: 4096, MinWrite: 3},
		{K: 64, M: 64, Unit: 1 << 30, MinWrite: 128, Inline: stripe.MaxInline},
	} {
		p := LayoutOf(l)
		if p.K != uint32(l.K) || p.M != uint32(l.M) || p.Unit != uint64(l.Unit) ||
			p.MinWriteShards != uint32(l.MinWrite) || p.InlineMax != uint64(l.Inline) {
			t.Errorf("LayoutOf(%v) = %v", l, p)
		}
		if got := p.Stripe(); got != l {
			t.Errorf("LayoutOf(%v).Stripe() = %v", l, got)
		}
	}
	if got := (*Layout)(nil).Stripe(); got != (stripe.Layout{}) {
		t.Errorf("nil.Stripe() = %v, want the zero layout", got)
	}
	huge := (&Layout{K: 4, M: 2, Unit: math.MaxUint64, InlineMax: 1 << 63}).Stripe()
	if huge.Unit != math.MaxInt64 || huge.Inline != math.MaxInt64 || huge.Validate() == nil {
		t.Errorf("out-of-range wire layout became %+v (valid: %v)", huge, huge.Validate() == nil)
	}
}

// TestLayoutEncoding pins the stored bytes of a layout: format's cluster
// record and directories' layouts keep them.
func TestLayoutEncoding(t *testing.T) {
	for l, want := range map[stripe.Layout]string{
		{K: 4, M: 2, Unit: 1 << 20, Inline: stripe.DefaultInline}: "080410021880804028808004",
		{K: 1, M: 2, Unit: 4096, MinWrite: 3}:                     "080110021880202003",
	} {
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(LayoutOf(l))
		if err != nil {
			t.Fatal(err)
		}
		if got := hex.EncodeToString(b); got != want {
			t.Errorf("%v encodes as %s, want %s", l, got, want)
		}
	}
}
