// Package placement chooses the chunkservers that hold the shards of a
// stripe: distinct servers, spread over as many zones as possible, and
// weighted by free space so that fuller servers receive fewer new chunks.
package placement

import (
	"fmt"
	"math/rand/v2"
)

// Candidate is a live chunkserver that may receive a shard.
type Candidate struct {
	ID   string
	Zone string // empty: the server is a zone of its own
	Free uint64 // free bytes
}

// ErrTooFew is wrapped by Choose when there are fewer candidates than shards.
var ErrTooFew = fmt.Errorf("placement: too few live chunkservers")

// Choose picks n distinct candidates. At each step it only considers servers
// in the zones that hold the fewest shards so far (so shards land in distinct
// zones while unused zones remain), and among those picks at random with a
// probability proportional to free space. rnd may be nil (math/rand/v2).
func Choose(cands []Candidate, n int, rnd *rand.Rand) ([]Candidate, error) {
	if n <= 0 {
		return nil, fmt.Errorf("placement: invalid shard count %d", n)
	}
	if len(cands) < n {
		return nil, fmt.Errorf("%w: need %d, have %d", ErrTooFew, n, len(cands))
	}
	zoneOf := func(c Candidate) string {
		if c.Zone == "" {
			return "\x00" + c.ID
		}
		return c.Zone
	}
	used := make([]bool, len(cands))
	perZone := map[string]int{}
	out := make([]Candidate, 0, n)
	for len(out) < n {
		minCount := -1
		for i, c := range cands {
			if used[i] {
				continue
			}
			if z := perZone[zoneOf(c)]; minCount < 0 || z < minCount {
				minCount = z
			}
		}
		var total float64
		var eligible []int
		for i, c := range cands {
			if !used[i] && perZone[zoneOf(c)] == minCount {
				eligible = append(eligible, i)
				total += weight(c)
			}
		}
		var x float64
		if rnd != nil {
			x = rnd.Float64() * total
		} else {
			x = rand.Float64() * total
		}
		pick := eligible[len(eligible)-1]
		for _, i := range eligible {
			x -= weight(cands[i])
			if x < 0 {
				pick = i
				break
			}
		}
		used[pick] = true
		perZone[zoneOf(cands[pick])]++
		out = append(out, cands[pick])
	}
	return out, nil
}

// weight is proportional to free space, with a floor so that a full server
// is still chosen when nothing else is left.
func weight(c Candidate) float64 {
	return float64(c.Free>>20) + 1
}
