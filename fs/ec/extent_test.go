package ec

import (
	"errors"
	"slices"
	"testing"
)

func TestExtents(t *testing.T) {
	const U = 4096
	l := Layout{K: 4, M: 2, Unit: U} // stripe = 16 KiB
	rep := Layout{K: 1, M: 2, Unit: U}
	big := Layout{K: 8, M: 3, Unit: 64 << 20}
	e := func(stripe int64, shard int, so, n, buf int64) Extent {
		return Extent{Stripe: stripe, Shard: shard, ShardOff: so, Len: n, BufOff: buf}
	}
	tests := []struct {
		name   string
		l      Layout
		off, n int64
		want   []Extent
	}{
		{"zero length", l, 100, 0, nil},
		{"zero length at 0", l, 0, 0, nil},
		{"one byte", l, 0, 1, []Extent{e(0, 0, 0, 1, 0)}},
		{"inside shard", l, 100, 200, []Extent{e(0, 0, 100, 200, 0)}},
		{"whole shard", l, U, U, []Extent{e(0, 1, 0, U, 0)}},
		{"ends at shard end", l, 10, U - 10, []Extent{e(0, 0, 10, U-10, 0)}},
		{"crosses shard", l, U - 10, 20, []Extent{e(0, 0, U-10, 10, 0), e(0, 1, 0, 10, 10)}},
		{"crosses stripe", l, 4*U - 3, 6, []Extent{e(0, 3, U-3, 3, 0), e(1, 0, 0, 3, 3)}},
		{"full stripe", l, 4 * U, 4 * U, []Extent{e(1, 0, 0, U, 0), e(1, 1, 0, U, U), e(1, 2, 0, U, 2*U), e(1, 3, 0, U, 3*U)}},
		{"stripe and a bit", l, 2*U + 1, 4 * U, []Extent{
			e(0, 2, 1, U-1, 0), e(0, 3, 0, U, U-1), e(1, 0, 0, U, 2*U-1), e(1, 1, 0, U, 3*U-1), e(1, 2, 0, 1, 4*U-1)}},
		{"replication", rep, U + 5, U, []Extent{e(1, 0, 5, U-5, 0), e(2, 0, 0, 5, U-5)}},
		{"near max file size", l, MaxFileSize - 5, 5, []Extent{e(MaxFileSize/(4*U)-1, 3, U-5, 5, 0)}},
		{"ends at max file size", big, MaxFileSize - 1, 1, []Extent{
			e((MaxFileSize-1)/(8<<26), int((MaxFileSize-1)/(64<<20)%8), (MaxFileSize-1)%(64<<20), 1, 0)}},
		{"big unit crossing", big, 64<<20 - 1, 2, []Extent{e(0, 0, 64<<20-1, 1, 0), e(0, 1, 0, 1, 1)}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.l.Extents(nil, tc.off, tc.n)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("Extents(%d, %d) =\n  %v\nwant\n  %v", tc.off, tc.n, got, tc.want)
			}
			if c := tc.l.ExtentCount(tc.off, tc.n); c != len(tc.want) {
				t.Errorf("ExtentCount = %d, want %d", c, len(tc.want))
			}
			for _, x := range got {
				if fo := x.FileOff(tc.l); fo != tc.off+x.BufOff {
					t.Errorf("%v.FileOff = %d, want %d", x, fo, tc.off+x.BufOff)
				}
			}
			first, count, err := tc.l.StripeSpan(tc.off, tc.n)
			if err != nil {
				t.Fatal(err)
			}
			if len(tc.want) > 0 && (first != tc.want[0].Stripe || first+count-1 != tc.want[len(tc.want)-1].Stripe) {
				t.Errorf("StripeSpan = %d, %d; extents span %d..%d", first, count, tc.want[0].Stripe, tc.want[len(tc.want)-1].Stripe)
			}
			if len(tc.want) == 0 && count != 0 {
				t.Errorf("StripeSpan of empty range: count %d", count)
			}
		})
	}
}

func TestExtentsErrors(t *testing.T) {
	l := Layout{K: 4, M: 2, Unit: 4096}
	const maxInt64 = 1<<63 - 1
	tests := []struct {
		name   string
		l      Layout
		off, n int64
		want   error
	}{
		{"negative offset", l, -1, 10, ErrRange},
		{"negative length", l, 0, -1, ErrRange},
		{"beyond max file size", l, MaxFileSize, 1, ErrRange},
		{"offset beyond max", l, MaxFileSize + 1, 0, ErrRange},
		{"would overflow", l, maxInt64 - 10, 100, ErrRange},
		{"huge both", l, maxInt64, maxInt64, ErrRange},
		{"length overflow", l, 1, maxInt64, ErrRange},
		{"bad layout", Layout{K: 4, M: 2, Unit: 100}, 0, 10, ErrInvalidLayout},
	}
	for _, tc := range tests {
		dst := make([]Extent, 0, 4)
		got, err := tc.l.Extents(dst, tc.off, tc.n)
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: Extents err = %v, want %v", tc.name, err, tc.want)
		}
		if len(got) != 0 {
			t.Errorf("%s: extents returned with an error", tc.name)
		}
		if _, _, err := tc.l.StripeSpan(tc.off, tc.n); !errors.Is(err, tc.want) {
			t.Errorf("%s: StripeSpan err = %v, want %v", tc.name, err, tc.want)
		}
		if tc.l.ExtentCount(tc.off, tc.n) != 0 {
			t.Errorf("%s: ExtentCount not 0", tc.name)
		}
	}
	// A range ending exactly at MaxFileSize is fine.
	if _, err := l.Extents(nil, MaxFileSize-4096, 4096); err != nil {
		t.Errorf("range ending at MaxFileSize: %v", err)
	}
}

func TestExtentsNoAllocation(t *testing.T) {
	l := DefaultLayout()
	buf := make([]Extent, 0, 64)
	if a := testing.AllocsPerRun(100, func() {
		buf, _ = l.Extents(buf[:0], 3<<20+17, 9<<20)
	}); a != 0 {
		t.Errorf("Extents into a big enough slice: %v allocations", a)
	}
	if a := testing.AllocsPerRun(100, func() {
		it, _ := l.Iter(12345, 50<<20)
		var total int64
		for x, ok := it.Next(); ok; x, ok = it.Next() {
			total += x.Len
		}
		if total != 50<<20 {
			t.Fatalf("iterated %d bytes", total)
		}
	}); a != 0 {
		t.Errorf("ExtentIter: %v allocations", a)
	}
	var zero ExtentIter
	if _, ok := zero.Next(); ok || zero.Remaining() != 0 {
		t.Error("zero ExtentIter is not exhausted")
	}
}
