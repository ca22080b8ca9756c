package ec

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"
)

// FuzzCodec encodes random data in a random layout and stripe length, loses up
// to M random shards, rebuilds them and checks they equal the originals.
func FuzzCodec(f *testing.F) {
	f.Add(uint8(3), uint8(2), uint8(0), uint32(16384), uint64(0b11), uint64(1), false)
	f.Add(uint8(0), uint8(2), uint8(1), uint32(100), uint64(0b110), uint64(2), true)
	f.Add(uint8(7), uint8(3), uint8(0), uint32(4097), uint64(0b10000001001), uint64(3), false)
	f.Add(uint8(5), uint8(0), uint8(1), uint32(12345), uint64(0), uint64(4), true)
	f.Add(uint8(9), uint8(4), uint8(0), uint32(1), uint64(0b1111), uint64(5), false)
	f.Fuzz(func(t *testing.T, k, m, unitPages uint8, nSel uint32, lostSel, seed uint64, dataOnly bool) {
		l := Layout{K: 1 + int(k%10), M: int(m % 5), Unit: 4096 * (1 + int64(unitPages%2))}
		n := 1 + int64(nSel)%l.StripeSize()
		c, err := NewCodec(l)
		if err != nil {
			t.Fatal(err)
		}
		s := newStripe(t, l, n, seed)
		if err := c.Encode(s.shards); err != nil {
			t.Fatalf("%v n=%d: Encode: %v", l, n, err)
		}
		if ok, err := c.Verify(s.shards); !ok || err != nil {
			t.Fatalf("%v n=%d: Verify after Encode = %v, %v", l, n, ok, err)
		}
		// choose up to M distinct shards to lose
		r := rand.New(rand.NewPCG(lostSel, seed))
		lost := uint64(0)
		for range int(lostSel % uint64(l.M+1)) {
			lost |= 1 << r.IntN(l.Shards())
		}
		L := l.ShardLen(n)
		got := make([][]byte, l.Shards())
		for i := range got {
			if lost&(1<<i) != 0 {
				got[i] = bytes.Repeat([]byte{0x5A}, L)[:0]
			} else {
				got[i] = s.shards[i]
			}
		}
		if dataOnly {
			err = c.ReconstructData(got, n)
		} else {
			err = c.Reconstruct(got, n)
		}
		if err != nil {
			t.Fatalf("%v n=%d lost=%b: %v", l, n, lost, err)
		}
		for i := range got {
			if i >= l.K && dataOnly && lost&(1<<i) != 0 {
				continue
			}
			if i < l.K && l.DataShardLen(n, i) == 0 {
				continue
			}
			if !bytes.Equal(got[i], s.shards[i]) {
				t.Fatalf("%v n=%d lost=%b dataOnly=%v: shard %d differs", l, n, lost, dataOnly, i)
			}
		}
		if !dataOnly {
			if ok, err := c.Verify(got); !ok || err != nil {
				t.Fatalf("%v n=%d lost=%b: Verify after Reconstruct = %v, %v", l, n, lost, ok, err)
			}
		}
		// One more loss than M always fails, and says so.
		if l.M+1 <= l.Shards() {
			for i := range got {
				got[i] = s.shards[i]
			}
			dropped := 0
			for i := 0; i < l.K && dropped <= l.M; i++ { // data shards with data first
				if l.DataShardLen(n, i) > 0 {
					got[i] = make([]byte, 0, L)
					dropped++
				}
			}
			for i := l.K; i < l.Shards() && dropped <= l.M; i++ {
				got[i] = make([]byte, 0, L)
				dropped++
			}
			err := c.ReconstructData(got, n)
			avail := l.Shards() - dropped
			if avail < l.K && !errors.Is(err, ErrTooFewShards) {
				t.Fatalf("%v n=%d: %d available: err = %v, want ErrTooFewShards", l, n, avail, err)
			}
		}
	})
}

// FuzzExtents checks the range mapper: the extents of a range cover it exactly,
// in order, without overlap, each inside one shard of one stripe.
func FuzzExtents(f *testing.F) {
	f.Add(uint8(3), uint8(0), int64(0), int64(100))
	f.Add(uint8(0), uint8(5), int64(4095), int64(8193))
	f.Add(uint8(7), uint8(255), int64(MaxFileSize-1), int64(1))
	f.Add(uint8(31), uint8(3), int64(-1), int64(10))
	f.Add(uint8(2), uint8(1), int64(1<<62-5000), int64(1<<40))
	f.Add(uint8(1), uint8(1), int64(1<<63-1), int64(1<<63-1))
	f.Fuzz(func(t *testing.T, k, unitPages uint8, off, n int64) {
		l := Layout{K: 1 + int(k%32), M: 0, Unit: 4096 * (1 + int64(unitPages))}
		if l.Validate() != nil {
			t.Skip()
		}
		// keep the number of extents small enough to walk
		if n > 64*l.Unit {
			n = n % (64 * l.Unit)
		}
		it, err := l.Iter(off, n)
		valid := off >= 0 && n >= 0 && off <= MaxFileSize && n <= MaxFileSize-off
		if valid != (err == nil) {
			t.Fatalf("Iter(%d, %d): err = %v, valid = %v", off, n, err, valid)
		}
		if err != nil {
			if !errors.Is(err, ErrRange) {
				t.Fatalf("error %v does not wrap ErrRange", err)
			}
			return
		}
		count := it.Remaining()
		var next, total int64
		var prev Extent
		i := 0
		for e, ok := it.Next(); ok; e, ok = it.Next() {
			if e.Len <= 0 || e.ShardOff < 0 || e.ShardOff+e.Len > l.Unit || e.Shard < 0 || e.Shard >= l.K || e.Stripe < 0 {
				t.Fatalf("extent %v out of bounds in %v", e, l)
			}
			if e.BufOff != next || e.FileOff(l) != off+e.BufOff {
				t.Fatalf("extent %v: not contiguous (want buf %d, file %d)", e, next, off+next)
			}
			if i > 0 && (e.Stripe < prev.Stripe || e.Stripe == prev.Stripe && e.Shard <= prev.Shard) {
				t.Fatalf("extent %v after %v: out of order", e, prev)
			}
			if i > 0 && (e.ShardOff != 0 || prev.ShardOff+prev.Len != l.Unit) {
				t.Fatalf("extent %v after %v: split inside a shard", e, prev)
			}
			next += e.Len
			total += e.Len
			prev = e
			i++
		}
		if total != n || i != count {
			t.Fatalf("extents cover %d bytes in %d extents, want %d bytes in %d", total, i, n, count)
		}
		first, stripes, err := l.StripeSpan(off, n)
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 && (first != l.StripeOf(off) || first+stripes-1 != prev.Stripe) {
			t.Fatalf("StripeSpan = %d+%d, extents end in stripe %d", first, stripes, prev.Stripe)
		}
	})
}

// FuzzPlanWrite checks the read-modify-write planner: reads and the write
// together cover the stripe's old data and the written bytes exactly once.
func FuzzPlanWrite(f *testing.F) {
	f.Add(uint8(3), uint32(5000), uint32(100), uint32(300))
	f.Add(uint8(0), uint32(0), uint32(0), uint32(1))
	f.Add(uint8(7), uint32(1<<20), uint32(7), uint32(1<<19))
	f.Fuzz(func(t *testing.T, k uint8, oldSel, wOff, wLen uint32) {
		l := Layout{K: 1 + int(k%8), M: 2, Unit: 4096}
		ss := l.StripeSize()
		const s = 2
		oldLen := int64(oldSel) % (ss + 1)
		off := l.StripeStart(s) - ss/2 + int64(wOff)%(2*ss)
		n := 1 + int64(wLen)%(2*ss)
		p, err := l.PlanWrite(nil, s, oldLen, off, n)
		start := l.StripeStart(s)
		if off+n <= start || off >= start+ss {
			if !errors.Is(err, ErrRange) {
				t.Fatalf("write [%d,+%d) misses stripe: err = %v", off, n, err)
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		covered := make([]byte, ss)
		for _, r := range p.Reads {
			if r.Stripe != s || r.Len <= 0 || r.ShardOff+r.Len > l.Unit || r.BufOff != int64(r.Shard)*l.Unit+r.ShardOff {
				t.Fatalf("bad read %v", r)
			}
			for b := r.BufOff; b < r.BufOff+r.Len; b++ {
				covered[b]++
			}
		}
		if start+p.WriteOff != off+p.BufOff {
			t.Fatalf("write part: stripe offset %d and buffer offset %d disagree", p.WriteOff, p.BufOff)
		}
		for b := p.WriteOff; b < p.WriteOff+p.WriteLen; b++ {
			covered[b]++
		}
		for b := range ss {
			in := b < oldLen || b >= p.WriteOff && b < p.WriteOff+p.WriteLen
			if (in && covered[b] != 1) || (!in && covered[b] != 0) {
				t.Fatalf("byte %d covered %d times (old %d, write [%d,+%d))", b, covered[b], oldLen, p.WriteOff, p.WriteLen)
			}
		}
		if p.NewLen != max(oldLen, p.WriteOff+p.WriteLen) {
			t.Fatalf("NewLen = %d", p.NewLen)
		}
	})
}
