package chunkserver_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/chunkserver"
	"github.com/rdmafs/rdmafs/chunkserver/chunk"
	"github.com/rdmafs/rdmafs/chunkserver/chunktest"
)

// TestScrubPasses: with a scrub interval from the metadata service, chunkd
// reads every stored version back, pass after pass, and reports through
// its heartbeats the bytes verified and, once, a version whose bytes were
// flipped on disk — which it also reports corrupt to the repair planner —
// and sends the list of what it stores after each pass.
func TestScrubPasses(t *testing.T) {
	const unit = 64 << 10
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	m := newSpaceMembership()
	m.scrub = 200 * time.Millisecond
	s := chunktest.Start(t, chunktest.Options{Dir: dir, MaxLength: unit,
		Config: chunkserver.Config{Membership: m, HeartbeatInterval: 20 * time.Millisecond}})
	env := chunktest.NewClientEnv(t, 2*unit)
	c := env.Dial(t, s.Addr(), s.Secret)
	m.waitInfo(t, ctx)
	putVersions(t, c, env, 7, 8, unit)
	bad := chunk.Key{Chunk: 7, Version: 5}
	chunktest.FlipData(t, chunktest.SlotFile(dir, bad), false)

	st := m.waitStats(t, ctx, "a scrub pass that found the damaged version", func(st chunkserver.Stats) bool {
		return st.Scrub.ErrorsTotal == 1 && !st.Scrub.LastPassDone.IsZero() && st.Scrub.BytesTotal >= 2*8*unit
	})
	if st.Scrub.PassTotal != 8*unit {
		t.Fatalf("a pass covers %d bytes, want %d", st.Scrub.PassTotal, 8*unit)
	}
	// Found once: later passes do not count it again.
	m.waitStats(t, ctx, "two more passes", func(st2 chunkserver.Stats) bool {
		if st2.Scrub.ErrorsTotal != 1 {
			t.Fatalf("the damaged version counted %d times", st2.Scrub.ErrorsTotal)
		}
		return st2.Scrub.BytesTotal >= st.Scrub.BytesTotal+2*8*unit
	})
	if _, err := s.Store.ReadInto(bad, make([]byte, unit)); err == nil {
		t.Fatal("the flipped version reads back without an error")
	}
	// After each pass the list of stored versions goes to the metadata
	// service.
	m.mu.Lock()
	listed, done := len(m.inventory), m.inventoryDone
	m.mu.Unlock()
	if listed != 8 || !done {
		t.Fatalf("inventory of %d versions (complete %v), want the 8 stored", listed, done)
	}
}

// TestVerifyCopies: with replication, the copies that differ from a strict
// majority are bad; without a majority nothing is named.
func TestVerifyCopies(t *testing.T) {
	a, b := []byte("aaaa"), []byte("abab")
	for _, tc := range []struct {
		shards [][]byte
		bad    []int
		fails  bool
	}{
		{shards: [][]byte{a, a, a}},
		{shards: [][]byte{a, b, a}, bad: []int{1}},
		{shards: [][]byte{b, a, a}, bad: []int{0}},
		{shards: [][]byte{a, b}, fails: true},
		{shards: [][]byte{a, b, []byte("cccc")}, fails: true},
		{shards: [][]byte{a, a, b, b}, fails: true},
	} {
		bad, err := chunkserver.VerifyCopies(tc.shards)
		if (err != nil) != tc.fails || !slices.Equal(bad, tc.bad) {
			t.Errorf("%q: bad %v, err %v; want %v, failure %v", tc.shards, bad, err, tc.bad, tc.fails)
		}
	}
}

// TestScrubResumes: a regular pass a restart interrupted goes on where its
// saved position says, with its start time, not from the beginning.
func TestScrubResumes(t *testing.T) {
	const unit = 64 << 10
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	m := newSpaceMembership()
	s := chunktest.Start(t, chunktest.Options{Dir: dir, MaxLength: unit, Config: chunkserver.Config{}})
	env := chunktest.NewClientEnv(t, 2*unit)
	c := env.Dial(t, s.Addr(), s.Secret)
	putVersions(t, c, env, 7, 8, unit)
	c.Close()
	s.Stop()
	started := time.Now().Add(-time.Minute).Truncate(time.Millisecond)
	if err := os.WriteFile(filepath.Join(dir, "scrub-position"), fmt.Appendf(nil, "%d 7 4\n", started.UnixNano()), 0o600); err != nil {
		t.Fatal(err)
	}
	m.scrub = time.Hour // the rest of the pass is paced over the hour: only the resumed part shows
	chunktest.Start(t, chunktest.Options{Dir: dir, MaxLength: unit,
		Config: chunkserver.Config{Membership: m, HeartbeatInterval: 20 * time.Millisecond}})
	st := m.waitStats(t, ctx, "a pass resumed after version 4", func(st chunkserver.Stats) bool {
		return st.Scrub.PassStarted.Equal(started)
	})
	if st.Scrub.PassBytes < 4*unit || st.Scrub.PassTotal != 8*unit {
		t.Fatalf("resumed pass at %d of %d bytes, want at least %d of %d", st.Scrub.PassBytes, st.Scrub.PassTotal, 4*unit, 8*unit)
	}
}
