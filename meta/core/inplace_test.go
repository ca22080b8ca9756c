package core

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

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

// TestNextGrants: a commit asked to grant a stripe's next version grants it
// in place in the same transaction, as GrantWrite with in_place would: the
// writer commits it without another grant, and one never used is collected
// when it expires, the committed version untouched. A stripe the call does
// not commit gets none.
func TestNextGrants(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		f := e.create(root, RootIno, "f", 0o644)
		e.chunkservers(8)
		g0 := e.grant(f, 0)
		commit := func(g *metapb.StripeGrant, expected uint64, next ...uint64) *metapb.CommitStripesReply {
			t.Helper()
			r, err := e.s.CommitStripes(e.ctx, &metapb.CommitStripesRequest{Ino: f, Size: 1 << 18, GrantNext: next,
				Stripes: []*metapb.StripeCommit{{Stripe: g.Stripe, Version: g.Version, ExpectedVersion: expected, Length: 1 << 18}}})
			if err != nil {
				t.Fatal(err)
			}
			return r
		}
		r := commit(g0, 0, 0, 7) // stripe 7 is not in the commit
		if len(r.NextGrants) != 1 {
			t.Fatalf("next grants %v, want one of stripe 0", r.NextGrants)
		}
		g1 := r.NextGrants[0]
		if !g1.InPlace || g1.Stripe != 0 || g1.CommittedVersion != g0.Version || g1.Version <= g0.Version ||
			!metapb.SameShards(g1.Shards, g0.Shards) || r.NextGrantsTtlMs != uint32(time.Minute.Milliseconds()) {
			t.Fatalf("next grant %v (ttl %d ms) over committed %v", g1, r.NextGrantsTtlMs, g0)
		}
		ackAll(e, e.allGC())
		// Committed with the next grant; its commit makes the one after.
		r = commit(g1, g0.Version, 0)
		if len(r.NextGrants) != 1 || r.NextGrants[0].Version <= g1.Version || r.NextGrants[0].CommittedVersion != g1.Version {
			t.Fatalf("next grant after committing one: %v", r.NextGrants)
		}
		g2 := r.NextGrants[0]
		// A GrantWrite meanwhile gets another version: no two writers
		// share one.
		if g := e.grant(f, 0); g.Version == g2.Version {
			t.Fatalf("GrantWrite gave version %d, the next grant's", g.Version)
		}
		ackAll(e, e.allGC())
		// Never used: when it expires, its version of the chunks is
		// collected, not the committed one.
		e.clock.Advance(2 * time.Minute)
		if err := e.s.expireGrants(e.ctx); err != nil {
			t.Fatal(err)
		}
		for id, refs := range e.allGC() {
			for _, ref := range refs {
				if strings.HasSuffix(ref, fmt.Sprintf("@%d", g1.Version)) {
					t.Fatalf("chunkserver %s told to delete %s, of the committed version", id, ref)
				}
			}
		}
		gs, err := e.s.GetStripes(e.ctx, &metapb.GetStripesRequest{Ino: f, First: 0, Count: 1})
		if err != nil || gs.Stripes[0].Version != g1.Version {
			t.Fatalf("stripe after the next grant expired: %v %v", gs, err)
		}
		if _, err := e.s.CommitStripes(e.ctx, &metapb.CommitStripesRequest{Ino: f, Size: 1 << 18,
			Stripes: []*metapb.StripeCommit{{Stripe: 0, Version: g2.Version, ExpectedVersion: g1.Version, Length: 1 << 18}}}); err == nil {
			t.Fatal("committed an expired next grant")
		}
		// A stripe committed on a fresh placement (not in place) gets a
		// next grant only once it is on its chunks: the grant is in place.
		g3 := e.grant(f, 0)
		r = commit(g3, g1.Version, 0)
		if len(r.NextGrants) != 1 || !metapb.SameShards(r.NextGrants[0].Shards, g3.Shards) {
			t.Fatalf("next grant after a fresh placement: %v", r.NextGrants)
		}
	})
}
