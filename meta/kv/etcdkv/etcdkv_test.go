package etcdkv_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/rdmafs/rdmafs/meta/auth"
	"github.com/rdmafs/rdmafs/meta/kv"
	"github.com/rdmafs/rdmafs/meta/kv/etcdkv"
	"github.com/rdmafs/rdmafs/meta/kv/etcdkv/etcdtest"
	"github.com/rdmafs/rdmafs/meta/kv/kvtest"
)

func open(t *testing.T, srv *etcdtest.Server, prefix string, batch bool) *etcdkv.Store {
	t.Helper()
	s, err := etcdkv.Open(context.Background(), etcdkv.Options{Endpoints: []string{srv.Endpoint()}, Prefix: prefix, Batch: batch, PageSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestConformance(t *testing.T) {
	srv := etcdtest.StartT(t)
	var n atomic.Int64
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprintf("batch=%v", batch), func(t *testing.T) {
			kvtest.Run(t, func(t *testing.T) kv.Store {
				return open(t, srv, fmt.Sprintf("conf%d", n.Add(1)), batch)
			})
		})
	}
}

// TestConflicts checks that a transaction whose reads another writer
// changed between its snapshot and its commit is refused: a changed key, a
// deleted key seen by a scan, and a key inserted into a scanned range.
func TestConflicts(t *testing.T) {
	srv := etcdtest.StartT(t)
	ctx := context.Background()
	tests := []struct {
		name  string
		read  func(tx kv.Txn) error
		other func(tx kv.Txn) error
	}{
		{"changed key", func(tx kv.Txn) error { _, _, err := tx.Get([]byte("a")); return err },
			func(tx kv.Txn) error { return tx.Put([]byte("a"), []byte("2")) }},
		{"created key", func(tx kv.Txn) error { _, _, err := tx.Get([]byte("zz")); return err },
			func(tx kv.Txn) error { return tx.Put([]byte("zz"), []byte("1")) }},
		{"deleted key in scan", func(tx kv.Txn) error {
			return tx.Scan([]byte("a"), []byte("c"), 0, func(k, v []byte) error { return nil })
		}, func(tx kv.Txn) error { return tx.Delete([]byte("b")) }},
		{"phantom in scan", func(tx kv.Txn) error {
			return tx.Scan([]byte("a"), []byte("c"), 0, func(k, v []byte) error { return nil })
		}, func(tx kv.Txn) error { return tx.Put([]byte("bb"), []byte("x")) }},
		{"phantom before a limited scan's end", func(tx kv.Txn) error {
			return tx.Scan([]byte("a"), nil, 2, func(k, v []byte) error { return nil })
		}, func(tx kv.Txn) error { return tx.Put([]byte("a0"), []byte("x")) }},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s1 := open(t, srv, fmt.Sprintf("conflict%d", i), false)
			defer s1.Close()
			s2 := open(t, srv, fmt.Sprintf("conflict%d", i), false)
			defer s2.Close()
			if err := s1.Update(ctx, func(tx kv.Txn) error {
				tx.Put([]byte("a"), []byte("1"))
				return tx.Put([]byte("b"), []byte("1"))
			}); err != nil {
				t.Fatal(err)
			}
			runs := 0
			err := s1.Update(ctx, func(tx kv.Txn) error {
				runs++
				if err := tt.read(tx); err != nil {
					return err
				}
				if runs == 1 {
					if err := s2.Update(ctx, tt.other); err != nil {
						return err
					}
				}
				return tx.Put([]byte("out"), []byte(fmt.Sprint(runs)))
			})
			if err != nil {
				t.Fatal(err)
			}
			if runs != 2 {
				t.Fatalf("transaction ran %d times, want 2 (the concurrent write must force a retry)", runs)
			}
		})
	}
	t.Run("unrelated write does not conflict", func(t *testing.T) {
		s1 := open(t, srv, "noconflict", false)
		defer s1.Close()
		runs := 0
		if err := s1.Update(ctx, func(tx kv.Txn) error {
			runs++
			tx.Get([]byte("a"))
			if runs == 1 {
				s1.Update(ctx, func(tx kv.Txn) error { return tx.Put([]byte("b"), nil) })
			}
			return tx.Put([]byte("c"), nil)
		}); err != nil || runs != 1 {
			t.Fatalf("runs %d err %v", runs, err)
		}
	})
}

// TestFence checks that commits stop once the fence key is gone.
func TestFence(t *testing.T) {
	srv := etcdtest.StartT(t)
	ctx := context.Background()
	s := open(t, srv, "fence", false)
	defer s.Close()
	put, err := s.Client().Put(ctx, "fence/leader/x", "me")
	if err != nil {
		t.Fatal(err)
	}
	s.SetFence("fence/leader/x", put.Header.Revision)
	if err := s.Update(ctx, func(tx kv.Txn) error { return tx.Put([]byte("k"), []byte("1")) }); err != nil {
		t.Fatalf("fenced commit while holding the fence: %v", err)
	}
	if _, err := s.Client().Delete(ctx, "fence/leader/x"); err != nil {
		t.Fatal(err)
	}
	err = s.Update(ctx, func(tx kv.Txn) error { return tx.Put([]byte("k"), []byte("2")) })
	if !errors.Is(err, etcdkv.ErrFenced) {
		t.Fatalf("commit after losing the fence: %v, want ErrFenced", err)
	}
	r, err := s.Client().Get(ctx, etcdkv.DataPrefix("fence")+"k")
	if err != nil || len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "1" {
		t.Fatalf("fenced write landed: %v %v", r, err)
	}
}

func TestParseURL(t *testing.T) {
	tests := []struct {
		in      string
		want    etcdkv.Config
		wantErr bool
	}{
		{"etcd://127.0.0.1:2379", etcdkv.Config{Endpoints: []string{"127.0.0.1:2379"}, Prefix: "rdmafs"}, false},
		{"etcd://a:1,b:2/fs1", etcdkv.Config{Endpoints: []string{"a:1", "b:2"}, Prefix: "fs1"}, false},
		{"etcd://a:1/x/y/", etcdkv.Config{Endpoints: []string{"a:1"}, Prefix: "x/y"}, false},
		{"http://a:1", etcdkv.Config{}, true},
		{"etcd://", etcdkv.Config{}, true},
		{"etcd://hostonly/p", etcdkv.Config{}, true},
		{"etcd://a:1/with space", etcdkv.Config{}, true},
		{"etcd://a:1/fs?cacert=/c/ca.pem", etcdkv.Config{Endpoints: []string{"a:1"}, Prefix: "fs",
			TLS: auth.TLSFiles{CA: "/c/ca.pem"}}, false},
		{"etcd://a:1,b:2/fs?cacert=/c/ca.pem&cert=/c/cl.pem&key=/c/cl-key.pem", etcdkv.Config{Endpoints: []string{"a:1", "b:2"},
			Prefix: "fs", TLS: auth.TLSFiles{CA: "/c/ca.pem", Cert: "/c/cl.pem", Key: "/c/cl-key.pem"}}, false},
		{"etcd://a:1/fs?cert=/c/cl.pem&key=/c/k.pem", etcdkv.Config{}, true}, // no CA to verify etcd with
		{"etcd://a:1/fs?cacert=/a&cacert=/b", etcdkv.Config{}, true},
		{"etcd://a:1/fs?ca=/c/ca.pem", etcdkv.Config{}, true},
		{"etcd://a:1/fs?cacert=%zz", etcdkv.Config{}, true},
	}
	for _, tt := range tests {
		got, err := etcdkv.ParseURL(tt.in)
		if (err != nil) != tt.wantErr {
			t.Errorf("ParseURL(%q) error %v, wantErr %v", tt.in, err, tt.wantErr)
			continue
		}
		if !tt.wantErr && !reflect.DeepEqual(got, tt.want) {
			t.Errorf("ParseURL(%q) = %+v, want %+v", tt.in, got, tt.want)
		}
	}
}

// TestCacheStaysSafe checks that a caching store whose cache went stale
// (another writer changed a key behind its back) does not commit on top of
// the stale value: the compare fails, the cache is dropped and the
// transaction runs again on the real value.
func TestCacheStaysSafe(t *testing.T) {
	srv := etcdtest.StartT(t)
	ctx := context.Background()
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprintf("batch=%v", batch), func(t *testing.T) {
			prefix := fmt.Sprintf("cache%v", batch)
			s, err := etcdkv.Open(ctx, etcdkv.Options{Endpoints: []string{srv.Endpoint()}, Prefix: prefix, Batch: batch, CacheEntries: 100})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			other := open(t, srv, prefix, false)
			defer other.Close()
			incr := func(st kv.Store) {
				t.Helper()
				if err := st.Update(ctx, func(tx kv.Txn) error {
					v, _, err := tx.Get([]byte("n"))
					if err != nil {
						return err
					}
					return tx.Put([]byte("n"), append(v, 'x'))
				}); err != nil {
					t.Fatal(err)
				}
			}
			incr(s)     // cached: "x"
			incr(other) // behind the cache: "xx"
			incr(s)     // must read "xx" after a conflict: "xxx"
			var v []byte
			if err := other.View(ctx, func(r kv.Reader) error { v, _, err = r.Get([]byte("n")); return err }); err != nil {
				t.Fatal(err)
			}
			if string(v) != "xxx" {
				t.Fatalf("n = %q after three increments, want xxx (a stale cached value was committed)", v)
			}
		})
	}
}

// TestTooFewTxnOps checks that an etcd started with the default
// --max-txn-ops is refused at Open with a message saying what to change.
func TestTooFewTxnOps(t *testing.T) {
	srv, err := etcdtest.Start(context.Background(), etcdtest.Options{MaxTxnOps: 128})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	_, err = etcdkv.Open(context.Background(), etcdkv.Options{Endpoints: []string{srv.Endpoint()}})
	if err == nil || !strings.Contains(err.Error(), "--max-txn-ops") {
		t.Fatalf("Open on an etcd with --max-txn-ops 128: %v", err)
	}
}

// TestBatchDependentReads runs, in batch mode, transactions whose reads
// depend on what they read (a key named by another key's value, and scans
// paged two keys at a time), so that a batch's prefetch needs several rounds,
// together with a shared counter that every transaction increments (each
// sees the writes of those before it in its batch). Every transaction checks
// what it reads against what the ones before it wrote.
func TestBatchDependentReads(t *testing.T) {
	srv := etcdtest.StartT(t)
	ctx := context.Background()
	for _, cache := range []int{0, 1000} {
		t.Run(fmt.Sprintf("cache=%d", cache), func(t *testing.T) {
			s, err := etcdkv.Open(ctx, etcdkv.Options{Endpoints: []string{srv.Endpoint()}, Prefix: fmt.Sprintf("dep%d", cache),
				Batch: true, PageSize: 2, CacheEntries: cache})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			const workers, each = 8, 25
			errs := make(chan error, workers)
			for w := range workers {
				go func() {
					for i := range each {
						err := s.Update(ctx, func(tx kv.Txn) error {
							head, _, err := tx.Get([]byte(fmt.Sprintf("head/%d", w)))
							if err != nil {
								return err
							}
							n := 0
							fmt.Sscan(string(head), &n)
							if n != i {
								return fmt.Errorf("worker %d step %d: head says %d", w, i, n)
							}
							if n > 0 {
								last := fmt.Sprintf("node/%d/%04d", w, n-1)
								v, ok, err := tx.Get([]byte(last))
								if err != nil {
									return err
								}
								if !ok || string(v) != fmt.Sprint(n-1) {
									return fmt.Errorf("worker %d step %d: %s = %q, %v", w, i, last, v, ok)
								}
							}
							count := 0
							prefix := fmt.Sprintf("node/%d/", w)
							if err := tx.Scan([]byte(prefix), kv.PrefixEnd([]byte(prefix)), 0, func(k, v []byte) error {
								count++
								return nil
							}); err != nil {
								return err
							}
							if count != n {
								return fmt.Errorf("worker %d step %d: scan found %d nodes", w, i, count)
							}
							c, _, err := tx.Get([]byte("counter"))
							if err != nil {
								return err
							}
							total := 0
							fmt.Sscan(string(c), &total)
							if err := tx.Put([]byte("counter"), []byte(fmt.Sprint(total+1))); err != nil {
								return err
							}
							if err := tx.Put([]byte(fmt.Sprintf("node/%d/%04d", w, n)), []byte(fmt.Sprint(n))); err != nil {
								return err
							}
							return tx.Put([]byte(fmt.Sprintf("head/%d", w)), []byte(fmt.Sprint(n+1)))
						})
						if err != nil {
							errs <- err
							return
						}
					}
					errs <- nil
				}()
			}
			for range workers {
				if err := <-errs; err != nil {
					t.Fatal(err)
				}
			}
			var c []byte
			if err := s.View(ctx, func(r kv.Reader) error { c, _, err = r.Get([]byte("counter")); return err }); err != nil {
				t.Fatal(err)
			}
			if string(c) != fmt.Sprint(workers*each) {
				t.Fatalf("counter = %s after %d increments", c, workers*each)
			}
		})
	}
}
