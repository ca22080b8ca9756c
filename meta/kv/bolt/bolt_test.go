package bolt

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/rdmafs/rdmafs/meta/kv"
	"github.com/rdmafs/rdmafs/meta/kv/kvtest"
)

func TestConformance(t *testing.T) {
	kvtest.Run(t, func(t *testing.T) kv.Store {
		s, err := Open(t.TempDir(), Options{})
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

func TestReopenKeepsData(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Update(context.Background(), func(tx kv.Txn) error { return tx.Put([]byte("k"), []byte("v")) }); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Update(context.Background(), func(tx kv.Txn) error { return nil }); err != kv.ErrClosed {
		t.Fatalf("Update after Close: %v", err)
	}
	s, err = Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var v []byte
	s.View(context.Background(), func(r kv.Reader) (err error) { v, _, err = r.Get([]byte("k")); return err })
	if string(v) != "v" {
		t.Fatalf("after reopen k = %q", v)
	}
}

// TestGroupCommit checks that concurrent transactions share commits (and so
// fsyncs) while each keeps its own outcome.
func TestGroupCommit(t *testing.T) {
	var mu sync.Mutex
	commits, txns := 0, 0
	s, err := Open(t.TempDir(), Options{OnCommit: func(n int, d time.Duration) {
		mu.Lock()
		commits++
		txns += n
		mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const workers, each = 16, 30
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < each; i++ {
				fail := i%5 == 0
				err := s.Update(context.Background(), func(tx kv.Txn) error {
					tx.Put([]byte(fmt.Sprintf("w%02d-%03d", w, i)), []byte("v"))
					if fail {
						return errBoom
					}
					return nil
				})
				if fail != (err == errBoom) {
					t.Errorf("worker %d txn %d: %v", w, i, err)
				}
			}
		}(w)
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if txns != workers*each || 4*commits > 3*txns {
		t.Fatalf("%d transactions in %d commits: no group commit", txns, commits)
	}
	n := 0
	s.View(context.Background(), func(r kv.Reader) error {
		return r.Scan([]byte("w"), nil, 0, func(k, v []byte) error { n++; return nil })
	})
	if n != workers*each*4/5 {
		t.Fatalf("%d keys stored, want %d (failed transactions must leave nothing)", n, workers*each*4/5)
	}
	t.Logf("%d transactions in %d commits", txns, commits)
}

var errBoom = errors.New("boom")

// TestPreallocation checks that the file keeps zero-filled slack beyond the
// pages in use as the database grows.
func TestPreallocation(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, Options{Slack: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	size := func() int64 {
		fi, err := os.Stat(filepath.Join(dir, FileName))
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size()
	}
	if got := size(); got < 1<<19 {
		t.Fatalf("new database file of %d bytes has no slack", got)
	}
	val := make([]byte, 4000)
	for i := 0; i < 2000; i++ {
		if err := s.Update(context.Background(), func(tx kv.Txn) error {
			return tx.Put([]byte(fmt.Sprintf("k%06d", i)), val)
		}); err != nil {
			t.Fatal(err)
		}
	}
	// The committer preallocates after answering a group; the next
	// (empty) transaction returns only after that.
	if err := s.Update(context.Background(), func(tx kv.Txn) error { return nil }); err != nil {
		t.Fatal(err)
	}
	var used int64
	s.db.View(func(tx *bbolt.Tx) error { used = tx.Size(); return nil })
	if got := size(); got-used < 1<<19 || used < 4<<20 {
		t.Fatalf("file %d bytes, %d used: slack not kept", got, used)
	}
}

// TestPipeline checks that a transaction sees the writes of the transactions
// that ran before it while their group is still being committed, and that
// it is answered only after that group is durable.
func TestPipeline(t *testing.T) {
	ctx := context.Background()
	release := make(chan struct{})
	var once sync.Once
	s, err := Open(t.TempDir(), Options{OnCommit: func(int, time.Duration) {
		// Hold the first group's answers until the second transaction ran.
		once.Do(func() { <-release })
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	first := make(chan error, 1)
	go func() { first <- s.Update(ctx, func(tx kv.Txn) error { return tx.Put([]byte("a"), []byte("1")) }) }()
	// Wait until the first group is committed (its answers held back).
	for {
		var ok bool
		s.View(ctx, func(r kv.Reader) (err error) { _, ok, err = r.Get([]byte("a")); return err })
		if ok {
			break
		}
		time.Sleep(time.Millisecond)
	}
	second := make(chan error, 1)
	var seen string
	ran := make(chan struct{})
	go func() {
		second <- s.Update(ctx, func(tx kv.Txn) error {
			v, _, err := tx.Get([]byte("a"))
			seen = string(v)
			close(ran)
			if err != nil {
				return err
			}
			return tx.Put([]byte("b"), v)
		})
	}()
	<-ran
	select {
	case err := <-second:
		t.Fatalf("second transaction answered before the first was: %v", err)
	case err := <-first:
		t.Fatalf("first transaction answered before OnCommit returned: %v", err)
	case <-time.After(20 * time.Millisecond):
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if err := <-second; err != nil {
		t.Fatal(err)
	}
	if seen != "1" {
		t.Fatalf("second transaction read a = %q, want the first's write", seen)
	}
}

// TestFailedCommit makes a group commit fail (the file may not grow): its
// transactions get the error, and a transaction that ran meanwhile on top of
// its writes runs again without them.
func TestFailedCommit(t *testing.T) {
	ctx := context.Background()
	committed, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	s, err := Open(t.TempDir(), Options{Slack: -1, maxSize: 1 << 20, OnCommit: func(int, time.Duration) {
		// Hold the first group's answers until the second transaction ran.
		once.Do(func() {
			close(committed)
			<-release
		})
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	big := make([]byte, 2<<20)
	first := make(chan error, 1)
	var firstRuns atomic.Int32
	go func() {
		first <- s.Update(ctx, func(tx kv.Txn) error {
			firstRuns.Add(1)
			return tx.Put([]byte("big"), big)
		})
	}()
	<-committed
	var seen []bool
	secondRan := make(chan struct{}, 2)
	second := make(chan error, 1)
	go func() {
		second <- s.Update(ctx, func(tx kv.Txn) error {
			_, ok, err := tx.Get([]byte("big"))
			seen = append(seen, ok)
			secondRan <- struct{}{}
			if err != nil {
				return err
			}
			if ok {
				return errBoom // as a create would fail with EEXIST
			}
			return tx.Put([]byte("small"), []byte("v"))
		})
	}()
	<-secondRan
	close(release)
	if err := <-first; err == nil || !errors.Is(err, bolterrors.ErrMaxSizeReached) {
		t.Fatalf("first transaction: %v, want the commit's error", err)
	}
	if err := <-second; err != nil {
		t.Fatalf("second transaction: %v (saw big: %v), want success after running again", err, seen)
	}
	if len(seen) != 2 || !seen[0] || seen[1] {
		t.Fatalf("second transaction saw big: %v, want [true false] (ran on the failed write, then again without it)", seen)
	}
	if firstRuns.Load() != 1 {
		t.Fatalf("first transaction ran %d times", firstRuns.Load())
	}
	s.View(ctx, func(r kv.Reader) error {
		if _, ok, _ := r.Get([]byte("big")); ok {
			t.Error("the failed write is stored")
		}
		if v, _, _ := r.Get([]byte("small")); string(v) != "v" {
			t.Errorf("small = %q", v)
		}
		return nil
	})
}

// TestTooLarge checks that keys bbolt refuses fail their transaction alone.
func TestTooLarge(t *testing.T) {
	s, err := Open(t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	err = s.Update(context.Background(), func(tx kv.Txn) error {
		return tx.Put(make([]byte, bbolt.MaxKeySize+1), []byte("v"))
	})
	if err == nil {
		t.Fatal("a key over bbolt's limit was accepted")
	}
}
