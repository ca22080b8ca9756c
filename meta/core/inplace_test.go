package core

import (
	"fmt"
	"slices"
	"testing"

	"github.com/rdmafs/rdmafs/meta/metapb"
)

// TestInPlaceGrants: a stripe asked for in place gets its committed chunks
// back at a new version when every chunkserver of them can take it, and a
// fresh placement otherwise; committing it collects exactly the old version
// of each chunk.
func TestInPlaceGrants(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		f := e.create(root, RootIno, "f", 0o644)
		e.chunkservers(8)
		inPlace := func(exclude ...string) *metapb.StripeGrant {
			t.Helper()
			r, err := e.s.GrantWrite(e.ctx, &metapb.GrantWriteRequest{Ino: f, Stripes: []uint64{0}, InPlace: []uint64{0}, Exclude: exclude})
			if err != nil {
				t.Fatal(err)
			}
			return r.Grants[0]
		}
		// Nothing committed yet: a fresh placement.
		g0 := inPlace()
		if g0.InPlace {
			t.Fatalf("in-place grant of a stripe never committed: %v", g0)
		}
		if err := e.commit(f, g0, 0, 1<<18, 1<<18); err != nil {
			t.Fatal(err)
		}
		ackAll(e, e.allGC())
		g1 := inPlace()
		if !g1.InPlace || !metapb.SameShards(g1.Shards, g0.Shards) || g1.Version <= g0.Version || g1.CommittedVersion != g0.Version {
			t.Fatalf("in-place grant %v over committed %v", g1, g0)
		}
		if g1.Shards[0].Address == "" {
			t.Fatalf("in-place grant without addresses: %v", g1.Shards)
		}
		// A grant not asked in place, and one excluding a chunkserver of
		// the stripe, are placed afresh.
		if g := e.grant(f, 0); g.InPlace || metapb.SameShards(g.Shards, g0.Shards) {
			t.Fatalf("plain grant kept the chunks: %v", g)
		}
		if g := inPlace(g0.Shards[2].ServerId); g.InPlace || slices.ContainsFunc(g.Shards, func(sh *metapb.Shard) bool { return sh.ServerId == g0.Shards[2].ServerId }) {
			t.Fatalf("in-place grant excluding %s: %v", g0.Shards[2].ServerId, g)
		}
		if err := e.commit(f, g1, g0.Version, 1<<18, 1<<18); err != nil {
			t.Fatal(err)
		}
		// The other grants are still outstanding; the commit collects the
		// old version of the very same chunks, and nothing else.
		want := map[string][]string{}
		for _, sh := range g0.Shards {
			want[sh.ServerId] = append(want[sh.ServerId], fmt.Sprintf("%d@%d", sh.ChunkId, g0.Version))
		}
		if got := e.allGC(); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("collected after an in-place commit: %v, want %v", got, want)
		}
		gs, err := e.s.GetStripes(e.ctx, &metapb.GetStripesRequest{Ino: f, First: 0, Count: 1})
		if err != nil || gs.Stripes[0].Version != g1.Version || !metapb.SameShards(gs.Stripes[0].Shards, g0.Shards) {
			t.Fatalf("stripe after in-place commit: %v %v", gs, err)
		}
	})
}
