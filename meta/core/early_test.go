package core

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/meta/keys"
	"github.com/rdmafs/rdmafs/meta/kv"
	"github.com/rdmafs/rdmafs/meta/kv/bolt"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// countingStore is a bbolt store that counts how transactions are answered.
type countingStore struct {
	*bolt.Store
	mu                     sync.Mutex
	durable, logged, syncs int
}

func (c *countingStore) Update(ctx context.Context, fn func(kv.Txn) error) error {
	c.mu.Lock()
	c.durable++
	c.mu.Unlock()
	return c.Store.Update(ctx, fn)
}

func (c *countingStore) UpdateLogged(ctx context.Context, fn func(kv.Txn) error) error {
	c.mu.Lock()
	c.logged++
	c.mu.Unlock()
	return c.Store.UpdateLogged(ctx, fn)
}

func (c *countingStore) Sync(ctx context.Context) error {
	c.mu.Lock()
	c.syncs++
	c.mu.Unlock()
	return c.Store.Sync(ctx)
}

func (c *countingStore) counts() (durable, logged, syncs int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.durable, c.logged, c.syncs
}

// newCountingService formats a bbolt store in dir (the first time) and
// starts a service on it.
func newCountingService(t *testing.T, dir string, durableReplies bool) (*Service, *countingStore) {
	t.Helper()
	b, err := bolt.Open(dir, bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	st := &countingStore{Store: b}
	if _, err := Format(context.Background(), st, testLayout, time.Unix(1700000000, 0)); err != nil && !errors.Is(err, ErrFormatted) {
		t.Fatal(err)
	}
	s, err := New(context.Background(), Config{Store: st, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), DurableReplies: durableReplies})
	if err != nil {
		t.Fatal(err)
	}
	return s, st
}

// TestEarlyReplies checks which calls are answered once logged and which
// once durable: a client's namespace operations early, write grants and
// chunkserver registration durable; Sync and the heartbeat that hands out
// chunk deletions wait for durability; with DurableReplies every operation
// waits.
func TestEarlyReplies(t *testing.T) {
	ctx := context.Background()
	s, st := newCountingService(t, t.TempDir(), false)
	defer st.Close()
	d0, l0, s0 := st.counts()
	if _, err := s.Create(ctx, &metapb.CreateRequest{Caller: root, Parent: 1, Name: "f", Mode: 0o644}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Mkdir(ctx, &metapb.MkdirRequest{Caller: root, Parent: 1, Name: "d", Mode: 0o755}); err != nil {
		t.Fatal(err)
	}
	d1, l1, _ := st.counts()
	if d1 != d0 || l1 != l0+2 {
		t.Fatalf("create and mkdir: %d durable and %d logged transactions, want 0 and 2", d1-d0, l1-l0)
	}
	for i := 1; i <= testLayout.K+testLayout.M; i++ {
		if _, err := s.Register(ctx, &metapb.RegisterRequest{Id: fmt.Sprintf("cs%d", i), Address: fmt.Sprintf("127.0.0.1:%d", i), Capacity: 1 << 30}); err != nil {
			t.Fatal(err)
		}
	}
	if d2, _, _ := st.counts(); d2 != d1+testLayout.K+testLayout.M {
		t.Fatalf("register: %d durable transactions, want one each", d2-d1)
	}
	if _, err := s.Sync(ctx, &metapb.SyncRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, _, s1 := st.counts(); s1 != s0+1 {
		t.Fatalf("Sync: %d syncs of the store, want 1", s1-s0)
	}
	if _, err := s.Heartbeat(ctx, &metapb.HeartbeatRequest{Id: "cs1"}); err != nil {
		t.Fatal(err)
	}
	if _, _, s2 := st.counts(); s2 != s0+2 {
		t.Fatalf("heartbeat: %d syncs of the store before handing out deletions, want 1", s2-s0-1)
	}
	// An fsync's commit (Sync set) waits for durability; another does not.
	inline := testLayout
	inline.Inline = 4096
	if _, err := s.SetLayout(ctx, &metapb.SetLayoutRequest{Caller: root, Ino: 1, Layout: metapb.LayoutOf(inline)}); err != nil {
		t.Fatal(err)
	}
	f, err := s.Create(ctx, &metapb.CreateRequest{Caller: root, Parent: 1, Name: "small", Mode: 0o644})
	if err != nil {
		t.Fatal(err)
	}
	for i, sync := range []bool{false, true} {
		_, _, before := st.counts()
		if _, err := s.CommitStripes(ctx, &metapb.CommitStripesRequest{Ino: f.Attr.Ino, Size: 1, Sync: sync,
			Stripes: []*metapb.StripeCommit{{Stripe: 0, ExpectedVersion: uint64(i), Length: 1, Inline: true, Data: []byte("x")}}}); err != nil {
			t.Fatal(err)
		}
		want := 0
		if sync {
			want = 1
		}
		if _, _, after := st.counts(); after-before != want {
			t.Fatalf("commit with sync %v: %d syncs of the store, want %d", sync, after-before, want)
		}
	}

	sd, std := newCountingService(t, t.TempDir(), true)
	defer std.Close()
	d0, l0, _ = std.counts()
	if _, err := sd.Create(ctx, &metapb.CreateRequest{Caller: root, Parent: 1, Name: "f", Mode: 0o644}); err != nil {
		t.Fatal(err)
	}
	if d1, l1, _ := std.counts(); d1 != d0+1 || l1 != l0 {
		t.Fatalf("create with DurableReplies: %d durable and %d logged transactions, want 1 and 0", d1-d0, l1-l0)
	}
}

// TestInodeGapAfterUncleanStop starts a service again on its store without
// Close (a crash): new inode numbers continue past a gap, so that a create
// answered early and lost cannot have its number reused. After Close they
// continue without one.
func TestInodeGapAfterUncleanStop(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	create := func(s *Service, name string) uint64 {
		r, err := s.Create(ctx, &metapb.CreateRequest{Caller: root, Parent: 1, Name: name, Mode: 0o644})
		if err != nil {
			t.Fatal(err)
		}
		return r.Attr.Ino
	}
	s, st := newCountingService(t, dir, false)
	first := create(s, "a")
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	st.Close()
	s, st = newCountingService(t, dir, false)
	if got := create(s, "b"); got != first+1 {
		t.Fatalf("after a clean stop: inode %d, want %d", got, first+1)
	}
	st.Close() // no Service.Close: as after kill -9
	s, st = newCountingService(t, dir, false)
	defer st.Close()
	if got := create(s, "c"); got < first+1+inoGapAtStart {
		t.Fatalf("after an unclean stop: inode %d, want at least %d", got, first+1+inoGapAtStart)
	}
	if err := st.View(ctx, func(r kv.Reader) error {
		if _, ok, err := r.Get(keys.Counter(counterServing)); err != nil || !ok {
			t.Errorf("serving mark while serving: found %v, err %v", ok, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
