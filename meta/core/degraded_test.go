package core

import (
	"syscall"
	"testing"

	"github.com/rdmafs/rdmafs/meta/metapb"
)

// placed returns the server ids of shards, "" for a hole.
func placed(shards []*metapb.Shard) []string {
	out := make([]string, len(shards))
	for i, sh := range shards {
		out[i] = sh.ServerId
	}
	return out
}

func holes(shards []*metapb.Shard) int {
	n := 0
	for _, sh := range shards {
		if sh.ServerId == "" {
			n++
		}
	}
	return n
}

// TestDegradedGrants: with fewer live (or reachable) chunkservers than k+m
// but at least min-write-shards, a grant has holes; below, EHOSTDOWN.
// Excluded chunkservers get no shard.
func TestDegradedGrants(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		f := e.create(root, RootIno, "f", 0o644)
		e.chunkservers(5)
		g := e.grant(f, 0)
		if len(g.Shards) != 6 || holes(g.Shards) != 1 {
			t.Fatalf("grant on 5 chunkservers: %v, want 6 shards with one hole", placed(g.Shards))
		}
		seen := map[string]bool{}
		for _, sh := range g.Shards {
			if sh.ServerId != "" && seen[sh.ServerId] {
				t.Fatalf("server %s holds two shards: %v", sh.ServerId, placed(g.Shards))
			}
			seen[sh.ServerId] = true
		}
		_, err := e.s.GrantWrite(e.ctx, &metapb.GrantWriteRequest{Ino: f, Stripes: []uint64{0}, Exclude: []string{csID(1)}})
		wantErrno(t, err, syscall.EHOSTDOWN)
		e.chunkservers(8)
		r, err := e.s.GrantWrite(e.ctx, &metapb.GrantWriteRequest{Ino: f, Stripes: []uint64{0}, Exclude: []string{csID(0), csID(1)}})
		if err != nil {
			t.Fatal(err)
		}
		for _, sh := range r.Grants[0].Shards {
			if sh.ServerId == csID(0) || sh.ServerId == csID(1) || sh.ServerId == "" {
				t.Fatalf("grant excluding cs0 and cs1 on 8 chunkservers: %v", placed(r.Grants[0].Shards))
			}
		}
	})
}

// TestReplaceShards moves failed shards of a grant to chunkservers holding
// none of it, collects the chunks they leave, leaves a hole when no
// chunkserver is left, and commits degraded at min-write-shards.
func TestReplaceShards(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		f := e.create(root, RootIno, "f", 0o644)
		e.chunkservers(7)
		g := e.grant(f, 0)
		old := g.Shards[2]
		r, err := e.s.ReplaceShards(e.ctx, &metapb.ReplaceShardsRequest{Ino: f, Stripe: 0, Version: g.Version, Shards: []uint32{2}})
		if err != nil {
			t.Fatal(err)
		}
		moved := r.Shards[2]
		if moved.ServerId == "" || moved.ServerId == old.ServerId || moved.ChunkId == old.ChunkId || moved.Address == "" {
			t.Fatalf("shard 2 moved from %s/%d to %s/%d (%q)", old.ServerId, old.ChunkId, moved.ServerId, moved.ChunkId, moved.Address)
		}
		for i, sh := range r.Shards {
			if i != 2 && (sh.ServerId != g.Shards[i].ServerId || sh.ChunkId != g.Shards[i].ChunkId) {
				t.Fatalf("shard %d changed: %v -> %v", i, placed(g.Shards), placed(r.Shards))
			}
			if i != 2 && sh.ServerId == moved.ServerId {
				t.Fatalf("two shards on %s", sh.ServerId)
			}
		}
		if gc := e.gc(old.ServerId, nil); len(gc) != 1 || gc[0].ChunkId != old.ChunkId || gc[0].Version != g.Version {
			t.Fatalf("the chunk shard 2 left is not collected: %v", gc)
		}
		// Seven chunkservers, six shards, the one shard 2 left excluded (its
		// write failed): a second move has nowhere to go.
		r, err = e.s.ReplaceShards(e.ctx, &metapb.ReplaceShardsRequest{Ino: f, Stripe: 0, Version: g.Version, Shards: []uint32{4},
			Exclude: []string{old.ServerId}})
		if err != nil {
			t.Fatal(err)
		}
		if r.Shards[4].ServerId != "" {
			t.Fatalf("shard 4 moved to %s with every chunkserver taken or left", r.Shards[4].ServerId)
		}
		// Two missing of six is below min-write-shards 5.
		_, err = e.s.CommitStripes(e.ctx, &metapb.CommitStripesRequest{Ino: f, Size: 100,
			Stripes: []*metapb.StripeCommit{{Stripe: 0, Version: g.Version, Length: 100, Missing: []uint32{0, 4}}}})
		wantErrno(t, err, syscall.EIO)
		// One missing (the hole) commits degraded.
		_, err = e.s.CommitStripes(e.ctx, &metapb.CommitStripesRequest{Ino: f, Size: 100,
			Stripes: []*metapb.StripeCommit{{Stripe: 0, Version: g.Version, Length: 100, Missing: []uint32{4}}}})
		if err != nil {
			t.Fatal(err)
		}
		gs, err := e.s.GetStripes(e.ctx, &metapb.GetStripesRequest{Ino: f})
		if err != nil {
			t.Fatal(err)
		}
		if len(gs.Stripes) != 1 || holes(gs.Stripes[0].Shards) != 1 || gs.Stripes[0].Shards[4].ServerId != "" {
			t.Fatalf("committed stripe %v, want shard 4 missing", gs.Stripes)
		}
		st, err := e.s.Status(e.ctx, &metapb.StatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if st.DegradedStripes != 1 {
			t.Fatalf("status: %d degraded stripes, want 1", st.DegradedStripes)
		}
	})
}
