package fileio

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestAddExtentMatchesModel checks addExtent against a byte map of what was
// written, over random writes of random sizes: the extents are sorted,
// disjoint, not touching, and cover exactly the bytes written.
func TestAddExtentMatchesModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 200 {
		const size = 4096
		var d dirtyStripe
		written := make([]bool, size)
		for range 1 + rng.IntN(300) {
			lo := rng.Int64N(size)
			hi := min(size, lo+1+rng.Int64N(64))
			if rng.IntN(10) == 0 {
				hi = lo // an empty write
			}
			d.addExtent(lo, hi)
			for b := lo; b < hi; b++ {
				written[b] = true
			}
		}
		var want [][2]int64
		for b := int64(0); b < size; b++ {
			if !written[b] {
				continue
			}
			if n := len(want); n > 0 && want[n-1][1] == b {
				want[n-1][1] = b + 1
			} else {
				want = append(want, [2]int64{b, b + 1})
			}
		}
		got := slices.DeleteFunc(slices.Clone(d.extents), func(e [2]int64) bool { return e[0] == e[1] })
		if !slices.Equal(got, want) {
			t.Fatalf("round %d: extents %v, want %v", round, got, want)
		}
	}
}

// BenchmarkAddExtentRandom4K is a random writer's stripe: 4 KiB writes at
// random offsets of a 4 MiB stripe, up to 1,024 extents.
func BenchmarkAddExtentRandom4K(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 4))
	var d dirtyStripe
	for i := 0; b.Loop(); i++ {
		if i%512 == 0 {
			d.extents = d.extents[:0]
		}
		lo := rng.Int64N(1024) * 4096
		d.addExtent(lo, lo+4096)
	}
}
