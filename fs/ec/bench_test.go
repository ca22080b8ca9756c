package ec

import (
	"fmt"
	"testing"
)

// benchLayouts are the layouts the benchmarks run: the default and a wide one.
var benchLayouts = []Layout{
	{K: 4, M: 2, Unit: 1 << 20},
	{K: 8, M: 3, Unit: 1 << 20},
}

// benchStripe returns a full, encoded stripe of l in off-heap memory, with the
// pages touched so that no page fault is timed.
func benchStripe(b *testing.B, c *Codec) [][]byte {
	l := c.Layout()
	shards := mmapShards(b, l.Shards(), int(l.Unit))
	for i, s := range shards {
		for j := range s {
			s[j] = byte(i*131 + j*7 + j>>9)
		}
	}
	if err := c.Encode(shards); err != nil {
		b.Fatal(err)
	}
	return shards
}

// benchMemcpy copies a stripe's data (K units) shard by shard: the baseline a
// coding pass is compared with, measured in the same run.
func benchMemcpy(b *testing.B, l Layout) {
	src := mmapShards(b, l.K, int(l.Unit))
	dst := mmapShards(b, l.K, int(l.Unit))
	for i := range src {
		for j := range src[i] {
			src[i][j] = byte(j)
		}
		copy(dst[i], src[i])
	}
	b.SetBytes(l.StripeSize())
	b.ReportAllocs()
	for b.Loop() {
		for i := range src {
			copy(dst[i], src[i])
		}
	}
}

// BenchmarkEncode measures parity computation of one full stripe (throughput
// counts the stripe's data bytes), next to a memcpy of the same bytes.
func BenchmarkEncode(b *testing.B) {
	for _, l := range benchLayouts {
		b.Run(fmt.Sprintf("%d+%d/encode", l.K, l.M), func(b *testing.B) {
			c, err := NewCodec(l)
			if err != nil {
				b.Fatal(err)
			}
			shards := benchStripe(b, c)
			b.SetBytes(l.StripeSize())
			b.ReportAllocs()
			for b.Loop() {
				if err := c.Encode(shards); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("%d+%d/encode-short", l.K, l.M), func(b *testing.B) {
			// the last stripe of a file: half a stripe plus a bit, zero-padded
			c, _ := NewCodec(l)
			shards := benchStripe(b, c)
			h := l.K / 2
			shards[h] = shards[h][:4096]
			for i := h + 1; i < l.K; i++ {
				shards[i] = nil
			}
			b.SetBytes(int64(h)*l.Unit + 4096)
			b.ReportAllocs()
			for b.Loop() {
				if err := c.Encode(shards); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("%d+%d/memcpy", l.K, l.M), func(b *testing.B) { benchMemcpy(b, l) })
	}
}

// BenchmarkReconstructData measures a degraded read's decode: M data shards of
// a full stripe lost (the worst case), rebuilt into preallocated buffers.
func BenchmarkReconstructData(b *testing.B) {
	for _, l := range benchLayouts {
		b.Run(fmt.Sprintf("%d+%d/reconstruct-%d-lost", l.K, l.M, l.M), func(b *testing.B) {
			c, err := NewCodec(l)
			if err != nil {
				b.Fatal(err)
			}
			shards := benchStripe(b, c)
			work := make([][]byte, len(shards))
			out := mmapShards(b, l.M, int(l.Unit))
			n := l.StripeSize()
			b.SetBytes(n)
			b.ReportAllocs()
			for b.Loop() {
				copy(work, shards)
				for i := range l.M {
					work[i] = out[i][:0]
				}
				if err := c.ReconstructData(work, n); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("%d+%d/memcpy", l.K, l.M), func(b *testing.B) { benchMemcpy(b, l) })
	}
}
