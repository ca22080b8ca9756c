package bolt

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

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
