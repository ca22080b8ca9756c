package bolt

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/rdmafs/rdmafs/meta/kv"
)

// TestChainSharesOneGroup checks that the transactions of a chain see each
// other's writes at once and are committed in one group when it waits.
func TestChainSharesOneGroup(t *testing.T) {
	ctx := context.Background()
	var mu sync.Mutex
	var groups []int
	// The writer waits for the chain however slow the machine is.
	s, err := Open(t.TempDir(), Options{Slack: -1, chainHold: time.Hour, OnCommit: func(n int, _ time.Duration) {
		mu.Lock()
		groups = append(groups, n)
		mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	putKV(t, s, "k0", "0")
	mu.Lock()
	groups = nil
	mu.Unlock()
	c := s.NewChain()
	for i := 1; i <= 5; i++ {
		err := c.Update(ctx, func(tx kv.Txn) error {
			prev, ok, err := tx.Get(fmt.Appendf(nil, "k%d", i-1))
			if err != nil || !ok {
				return fmt.Errorf("k%d not seen: %v", i-1, err)
			}
			return tx.Put(fmt.Appendf(nil, "k%d", i), append(prev, '+'))
		})
		if err != nil {
			t.Fatalf("update %d: %v", i, err)
		}
	}
	if err := c.Update(ctx, func(kv.Txn) error { return errBoom }); !errors.Is(err, errBoom) {
		t.Fatalf("a failing transaction of the chain returned %v, want its own error", err)
	}
	if err := c.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Sync(ctx); err != nil { // the commit is reported once durable
		t.Fatal(err)
	}
	mu.Lock()
	got := fmt.Sprint(groups)
	mu.Unlock()
	if got != "[6]" {
		t.Fatalf("group commits of the chain: %s, want one of 6 transactions", got)
	}
	if got := contents(t, s); !strings.Contains(got, "k5=0+++++") {
		t.Fatalf("after the chain: %s", got)
	}
}

// TestChainStopsAtAFailedGroup makes the group holding a chain's second
// transaction fail while its third waits in the open group: neither is
// applied, nor any the chain runs later, and Wait says so; the first stays.
func TestChainStopsAtAFailedGroup(t *testing.T) {
	ctx := context.Background()
	var armed atomic.Bool
	inCommit, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	s, err := Open(t.TempDir(), Options{Slack: -1, maxSize: 1 << 20, LogSegment: 64 << 10, OnCommit: func(int, time.Duration) {
		if armed.Load() {
			once.Do(func() {
				close(inCommit)
				<-release
			})
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c := s.NewChain()
	put := func(k string, v []byte) func(kv.Txn) error {
		return func(tx kv.Txn) error { return tx.Put([]byte(k), v) }
	}
	if err := c.Update(ctx, put("a", []byte("1"))); err != nil {
		t.Fatal(err)
	}
	if err := c.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	// The next commit is the failing group's (the writer may take it at
	// once, or when the other transaction below wakes it): it is held
	// until the chain's next transaction has run.
	armed.Store(true)
	// Too large for the log and for bbolt's maximum size: its group fails.
	if err := c.Update(ctx, put("big", make([]byte, 2<<20))); err != nil {
		t.Fatal(err)
	}
	other := make(chan error, 1)
	go func() { other <- s.UpdateLogged(ctx, put("x", []byte("1"))) }() // wakes the writer
	<-inCommit
	if err := c.Update(ctx, put("c", []byte("3"))); err != nil {
		t.Fatalf("update run while the group before it commits: %v", err)
	}
	close(release)
	// The other transaction failed with the group if it was in it, or ran
	// again after it.
	otherErr := <-other
	if otherErr != nil && !errors.Is(otherErr, bolterrors.ErrMaxSizeReached) {
		t.Fatalf("the other transaction: %v, want success or the commit's error", otherErr)
	}
	ran := false
	err = c.Update(ctx, func(tx kv.Txn) error { ran = true; return tx.Put([]byte("d"), []byte("4")) })
	if !errors.Is(err, kv.ErrNotApplied) || ran {
		t.Fatalf("update after the chain failed: %v (ran: %v), want ErrNotApplied without running", err, ran)
	}
	if err := c.Wait(ctx); !errors.Is(err, kv.ErrNotApplied) {
		t.Fatalf("Wait: %v, want ErrNotApplied", err)
	}
	if err := s.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	want := "a=1"
	if otherErr == nil {
		want = "a=1 x=1"
	}
	if got := contents(t, s); got != want {
		t.Fatalf("stored %q, want %q: the chain's first write only", got, want)
	}
}

// TestChainHoldIsBounded: a chain that runs long (a tree removal) does not
// keep its transactions, or another chain's, from being logged: the writer
// takes the group once it has waited the hold.
func TestChainHoldIsBounded(t *testing.T) {
	ctx := context.Background()
	s, err := Open(t.TempDir(), Options{Slack: -1, chainHold: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	long, short := s.NewChain(), s.NewChain()
	if err := long.Update(ctx, func(tx kv.Txn) error { return tx.Put([]byte("long"), []byte("1")) }); err != nil {
		t.Fatal(err)
	}
	if err := short.Update(ctx, func(tx kv.Txn) error { return tx.Put([]byte("short"), []byte("1")) }); err != nil {
		t.Fatal(err)
	}
	// The long chain has not waited: the short one's Wait returns all the
	// same, after the hold.
	if err := short.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if got := contents(t, s); got != "long=1 short=1" {
		t.Fatalf("after the short chain's wait: %q", got)
	}
	if err := long.Wait(ctx); err != nil {
		t.Fatal(err)
	}
}
