package ec

import (
	"errors"
	"slices"
	"testing"
)

func TestPlanWrite(t *testing.T) {
	const U = 4096
	l := Layout{K: 4, M: 2, Unit: U} // stripe = 16 KiB
	ss := l.StripeSize()
	e := func(shard int, so, n, buf int64) Extent {
		return Extent{Stripe: 1, Shard: shard, ShardOff: so, Len: n, BufOff: buf}
	}
	tests := []struct {
		name         string
		oldLen       int64
		off, n       int64 // file range; stripe 1 starts at ss
		wantReads    []Extent
		wantNewLen   int64
		wantWriteOff int64
		wantWriteLen int64
		wantBufOff   int64
		wantRewrite  uint64
	}{
		{"full stripe over full", ss, ss, ss, nil, ss, 0, ss, 0, 0b1111},
		{"full stripe into new", 0, ss, ss, nil, ss, 0, ss, 0, 0b1111},
		{"spanning write clipped", ss, ss - 10, ss + 20, nil, ss, 0, ss, 10, 0b1111},
		{"append at stripe start", 0, ss, 100, nil, 100, 0, 100, 0, 0b0001},
		{"covers all old data", 100, ss, 200, nil, 200, 0, 200, 0, 0b0001},
		{"one shard of a full stripe", ss, ss + U, U, []Extent{e(0, 0, U, 0), e(2, 0, U, 2*U), e(3, 0, U, 3*U)}, ss, U, U, 0, 0b0010},
		{"middle of a shard", ss, ss + U + 10, 20, []Extent{e(0, 0, U, 0), e(1, 0, 10, U), e(1, 30, U-30, U+30), e(2, 0, U, 2*U), e(3, 0, U, 3*U)}, ss, U + 10, 20, 0, 0b0010},
		{"crossing shards", ss, ss + U - 1, 2, []Extent{e(0, 0, U-1, 0), e(1, 1, U-1, U+1), e(2, 0, U, 2*U), e(3, 0, U, 3*U)}, ss, U - 1, 2, 0, 0b0011},
		{"append in a short stripe", 100, ss + 100, 50, []Extent{e(0, 0, 100, 0)}, 150, 100, 50, 0, 0b0001},
		{"append past a hole", 100, ss + 2*U, 10, []Extent{e(0, 0, 100, 0)}, 2*U + 10, 2 * U, 10, 0, 0b0111},
		{"overwrite head of short stripe", U + 5, ss, 10, []Extent{e(0, 10, U-10, 10), e(1, 0, 5, U)}, U + 5, 0, 10, 0, 0b0001},
		{"tail of write only", 0, ss - 5, 10, nil, 5, 0, 5, 5, 0b0001},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := l.PlanWrite(nil, 1, tc.oldLen, tc.off, tc.n)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(p.Reads, tc.wantReads) {
				t.Errorf("Reads =\n  %v\nwant\n  %v", p.Reads, tc.wantReads)
			}
			if p.NeedsRead() != (len(tc.wantReads) > 0) {
				t.Errorf("NeedsRead = %v", p.NeedsRead())
			}
			if p.NewLen != tc.wantNewLen || p.ShardLen != l.ShardLen(tc.wantNewLen) || p.OldLen != tc.oldLen || p.Stripe != 1 {
				t.Errorf("plan %+v: want NewLen %d", p, tc.wantNewLen)
			}
			if p.WriteOff != tc.wantWriteOff || p.WriteLen != tc.wantWriteLen || p.BufOff != tc.wantBufOff {
				t.Errorf("write part = off %d len %d buf %d; want %d %d %d", p.WriteOff, p.WriteLen, p.BufOff, tc.wantWriteOff, tc.wantWriteLen, tc.wantBufOff)
			}
			if p.Rewrite != tc.wantRewrite {
				t.Errorf("Rewrite = %04b, want %04b", p.Rewrite, tc.wantRewrite)
			}
			for i := range l.K {
				if p.Rewrites(i) != (tc.wantRewrite&(1<<i) != 0) {
					t.Errorf("Rewrites(%d) wrong", i)
				}
			}
			// Reads + write cover [0, min(oldLen, ...)) of old data exactly.
			covered := make([]int, ss)
			for _, r := range p.Reads {
				for b := r.BufOff; b < r.BufOff+r.Len; b++ {
					covered[b]++
				}
				if r.BufOff != int64(r.Shard)*U+r.ShardOff {
					t.Errorf("read %v: BufOff not stripe-relative", r)
				}
			}
			for b := p.WriteOff; b < p.WriteOff+p.WriteLen; b++ {
				covered[b]++
			}
			for b := range ss {
				want := 0
				if b < tc.oldLen || (b >= p.WriteOff && b < p.WriteOff+p.WriteLen) {
					want = 1
				}
				if covered[b] != want {
					t.Fatalf("byte %d covered %d times, want %d", b, covered[b], want)
				}
			}
		})
	}
}

func TestPlanWriteErrors(t *testing.T) {
	l := Layout{K: 4, M: 2, Unit: 4096}
	ss := l.StripeSize()
	tests := []struct {
		name              string
		s, oldLen, off, n int64
		want              error
	}{
		{"misses stripe before", 1, 0, 0, ss, ErrRange},
		{"misses stripe after", 1, 0, 2 * ss, 10, ErrRange},
		{"zero length", 1, 0, ss, 0, ErrRange},
		{"negative stripe", -1, 0, 0, 10, ErrRange},
		{"old length too big", 0, ss + 1, 0, 10, ErrRange},
		{"negative old length", 0, -1, 0, 10, ErrRange},
		{"huge stripe", 1 << 62, 0, 0, 10, ErrRange},
		{"range overflow", 0, 0, 1<<63 - 1, 10, ErrRange},
	}
	for _, tc := range tests {
		if _, err := l.PlanWrite(nil, tc.s, tc.oldLen, tc.off, tc.n); !errors.Is(err, tc.want) {
			t.Errorf("%s: err = %v, want %v", tc.name, err, tc.want)
		}
	}
	if _, err := (Layout{}).PlanWrite(nil, 0, 0, 0, 1); !errors.Is(err, ErrInvalidLayout) {
		t.Errorf("bad layout: err = %v", err)
	}
	reads := make([]Extent, 0, l.K+1)
	if a := testing.AllocsPerRun(50, func() {
		p, _ := l.PlanWrite(reads[:0], 3, ss, 3*ss+100, 10)
		reads = p.Reads
	}); a != 0 {
		t.Errorf("PlanWrite with capacity: %v allocations", a)
	}
	if len(reads) != l.K+1 {
		t.Errorf("a write inside one shard of a full stripe reads %d extents, want K+1", len(reads))
	}
}
