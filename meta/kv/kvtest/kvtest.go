// Package kvtest is the conformance suite every kv.Store backend passes.
package kvtest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/rdmafs/rdmafs/meta/kv"
)

// Factory opens a fresh, empty store for one test; the suite closes it.
type Factory func(t *testing.T) kv.Store

// Run runs the conformance suite against stores made by newStore.
func Run(t *testing.T, newStore Factory) {
	t.Run("GetPutDelete", func(t *testing.T) { testGetPutDelete(t, newStore(t)) })
	t.Run("Scan", func(t *testing.T) { testScan(t, newStore(t)) })
	t.Run("FailedTxnLeavesNoTrace", func(t *testing.T) { testAbort(t, newStore(t)) })
	t.Run("PanickingTxnFailsAlone", func(t *testing.T) { testPanic(t, newStore(t)) })
	t.Run("ReadYourWrites", func(t *testing.T) { testReadYourWrites(t, newStore(t)) })
	t.Run("ConcurrentIncrements", func(t *testing.T) { testConcurrent(t, newStore(t)) })
}

func put(t *testing.T, s kv.Store, kvs ...string) {
	t.Helper()
	err := s.Update(context.Background(), func(tx kv.Txn) error {
		for i := 0; i+1 < len(kvs); i += 2 {
			if err := tx.Put([]byte(kvs[i]), []byte(kvs[i+1])); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("put: %v", err)
	}
}

func get(t *testing.T, s kv.Store, k string) (string, bool) {
	t.Helper()
	var v []byte
	var ok bool
	if err := s.View(context.Background(), func(r kv.Reader) (err error) {
		v, ok, err = r.Get([]byte(k))
		return err
	}); err != nil {
		t.Fatalf("get: %v", err)
	}
	return string(v), ok
}

func testGetPutDelete(t *testing.T, s kv.Store) {
	defer s.Close()
	if _, ok := get(t, s, "a"); ok {
		t.Fatal("empty store has a")
	}
	put(t, s, "a", "1", "b", "")
	if v, ok := get(t, s, "a"); !ok || v != "1" {
		t.Fatalf("a = %q %v", v, ok)
	}
	if v, ok := get(t, s, "b"); !ok || v != "" {
		t.Fatalf("empty value: %q %v", v, ok)
	}
	if err := s.Update(context.Background(), func(tx kv.Txn) error { return tx.Delete([]byte("a")) }); err != nil {
		t.Fatal(err)
	}
	if _, ok := get(t, s, "a"); ok {
		t.Fatal("a survived delete")
	}
}

func scan(t *testing.T, r kv.Reader, start, end string, limit int) []string {
	t.Helper()
	var endB []byte
	if end != "" {
		endB = []byte(end)
	}
	var out []string
	if err := r.Scan([]byte(start), endB, limit, func(k, v []byte) error {
		out = append(out, string(k)+"="+string(v))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

func testScan(t *testing.T, s kv.Store) {
	defer s.Close()
	put(t, s, "a1", "x", "a2", "y", "a3", "z", "b1", "w")
	tests := []struct {
		start, end string
		limit      int
		want       string
	}{
		{"a", "b", 0, "[a1=x a2=y a3=z]"},
		{"a2", "", 0, "[a2=y a3=z b1=w]"},
		{"a", "b", 2, "[a1=x a2=y]"},
		{"c", "", 0, "[]"},
	}
	for _, tt := range tests {
		var got []string
		s.View(context.Background(), func(r kv.Reader) error { got = scan(t, r, tt.start, tt.end, tt.limit); return nil })
		if fmt.Sprint(got) != tt.want {
			t.Errorf("scan(%q,%q,%d) = %v, want %s", tt.start, tt.end, tt.limit, got, tt.want)
		}
	}
	n := 0
	s.View(context.Background(), func(r kv.Reader) error {
		return r.Scan([]byte("a"), nil, 0, func(k, v []byte) error { n++; return kv.ErrStop })
	})
	if n != 1 {
		t.Fatalf("ErrStop did not stop the scan: %d calls", n)
	}
	if got := kv.PrefixEnd([]byte("a\xff")); string(got) != "b" {
		t.Fatalf("PrefixEnd = %q", got)
	}
}

func testAbort(t *testing.T, s kv.Store) {
	defer s.Close()
	put(t, s, "k", "old")
	boom := errors.New("boom")
	err := s.Update(context.Background(), func(tx kv.Txn) error {
		tx.Put([]byte("k"), []byte("new"))
		tx.Put([]byte("other"), []byte("v"))
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Update returned %v, want boom", err)
	}
	if v, _ := get(t, s, "k"); v != "old" {
		t.Fatalf("failed transaction wrote k=%q", v)
	}
	if _, ok := get(t, s, "other"); ok {
		t.Fatal("failed transaction wrote other")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Update(ctx, func(tx kv.Txn) error { return tx.Put([]byte("c"), nil) }); !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled Update returned %v", err)
	}
}

// testPanic checks kv.CallSafely's contract from the outside: a transaction
// function that panics makes its Update return an error, writes nothing,
// and leaves the store serving, also transactions run alongside it.
func testPanic(t *testing.T, s kv.Store) {
	defer s.Close()
	put(t, s, "k", "old")
	err := s.Update(context.Background(), func(tx kv.Txn) error {
		tx.Put([]byte("k"), []byte("new"))
		panic("boom")
	})
	if err == nil || !strings.Contains(err.Error(), "transaction panicked: boom") {
		t.Fatalf("Update of a panicking transaction returned %v", err)
	}
	if v, _ := get(t, s, "k"); v != "old" {
		t.Fatalf("panicking transaction wrote k=%q", v)
	}
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Go(func() {
			errs[i] = s.Update(context.Background(), func(tx kv.Txn) error {
				if i%2 == 1 {
					panic(fmt.Sprintf("boom %d", i))
				}
				return tx.Put([]byte(fmt.Sprintf("c%d", i)), []byte("v"))
			})
		})
	}
	wg.Wait()
	for i, err := range errs {
		if (err != nil) != (i%2 == 1) {
			t.Errorf("concurrent transaction %d (panics: %v): %v", i, i%2 == 1, err)
		}
		if _, ok := get(t, s, fmt.Sprintf("c%d", i)); ok != (i%2 == 0) {
			t.Errorf("concurrent transaction %d (panics: %v): its key exists: %v", i, i%2 == 1, ok)
		}
	}
}

func testReadYourWrites(t *testing.T, s kv.Store) {
	defer s.Close()
	put(t, s, "a", "1", "c", "3", "e", "5")
	err := s.Update(context.Background(), func(tx kv.Txn) error {
		tx.Put([]byte("b"), []byte("2"))
		tx.Delete([]byte("c"))
		tx.Put([]byte("e"), []byte("55"))
		if v, ok, _ := tx.Get([]byte("b")); !ok || string(v) != "2" {
			return fmt.Errorf("own put invisible: %q", v)
		}
		if _, ok, _ := tx.Get([]byte("c")); ok {
			return errors.New("own delete invisible")
		}
		if got := fmt.Sprint(scan(t, tx, "", "", 0)); got != "[a=1 b=2 e=55]" {
			return fmt.Errorf("merged scan = %s", got)
		}
		if got := fmt.Sprint(scan(t, tx, "b", "", 1)); got != "[b=2]" {
			return fmt.Errorf("merged scan with limit = %s", got)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func testConcurrent(t *testing.T, s kv.Store) {
	defer s.Close()
	const workers, each = 16, 50
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				err := s.Update(context.Background(), func(tx kv.Txn) error {
					v, _, err := tx.Get([]byte("n"))
					if err != nil {
						return err
					}
					n := 0
					if len(v) > 0 {
						fmt.Sscan(string(v), &n)
					}
					return tx.Put([]byte("n"), []byte(fmt.Sprint(n+1)))
				})
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if v, _ := get(t, s, "n"); v != fmt.Sprint(workers*each) {
		t.Fatalf("lost updates: n = %s, want %d", v, workers*each)
	}
}
