package placement

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
)

func servers(zones ...string) []Candidate {
	var out []Candidate
	for i, z := range zones {
		out = append(out, Candidate{ID: fmt.Sprintf("cs%d", i), Zone: z, Free: 1 << 30})
	}
	return out
}

func TestChoose(t *testing.T) {
	tests := []struct {
		name      string
		cands     []Candidate
		n         int
		wantErr   error
		wantZones int // distinct zones expected among the picks
	}{
		{"no zones", servers("", "", "", "", "", ""), 6, nil, 6},
		{"too few", servers("", "", ""), 4, ErrTooFew, 0},
		{"one per zone", servers("a", "a", "b", "b", "c", "c"), 3, nil, 3},
		{"fewer zones than shards spreads evenly", servers("a", "a", "a", "b", "b", "b"), 4, nil, 2},
	}
	rnd := rand.New(rand.NewPCG(1, 2))
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for iter := 0; iter < 50; iter++ {
				got, err := Choose(tt.cands, tt.n, rnd)
				if tt.wantErr != nil {
					if !errors.Is(err, tt.wantErr) {
						t.Fatalf("err = %v, want %v", err, tt.wantErr)
					}
					return
				}
				if err != nil || len(got) != tt.n {
					t.Fatalf("got %v, %v", got, err)
				}
				ids := map[string]bool{}
				zones := map[string]int{}
				for _, c := range got {
					if ids[c.ID] {
						t.Fatalf("server %s chosen twice", c.ID)
					}
					ids[c.ID] = true
					z := c.Zone
					if z == "" {
						z = c.ID
					}
					zones[z]++
				}
				if len(zones) != tt.wantZones {
					t.Fatalf("zones %v, want %d distinct", zones, tt.wantZones)
				}
				for _, n := range zones {
					if n > (tt.n+tt.wantZones-1)/tt.wantZones {
						t.Fatalf("uneven zones %v", zones)
					}
				}
			}
		})
	}
}

func TestChooseBalancesFreeSpace(t *testing.T) {
	cands := []Candidate{{ID: "full", Free: 1 << 20}, {ID: "empty1", Free: 100 << 30}, {ID: "empty2", Free: 100 << 30}}
	rnd := rand.New(rand.NewPCG(3, 4))
	full := 0
	for i := 0; i < 1000; i++ {
		got, err := Choose(cands, 1, rnd)
		if err != nil {
			t.Fatal(err)
		}
		if got[0].ID == "full" {
			full++
		}
	}
	if full > 20 {
		t.Fatalf("nearly full server chosen %d/1000 times", full)
	}
}
