package core

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"log/slog"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/internal/fakeclock"
	"github.com/rdmafs/rdmafs/internal/stripe"
	"github.com/rdmafs/rdmafs/meta/kv"
	"github.com/rdmafs/rdmafs/meta/kv/bolt"
	"github.com/rdmafs/rdmafs/meta/kv/etcdkv"
	"github.com/rdmafs/rdmafs/meta/kv/etcdkv/etcdtest"
	"github.com/rdmafs/rdmafs/meta/metaerr"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// storeFactory opens a KV store in dir; reopening the same dir must find the
// same data. The suite runs against every backend listed in backends, so a
// new backend (etcd) only adds an entry.
type storeFactory func(t *testing.T, dir string) kv.Store

var backends = map[string]storeFactory{
	"bolt": func(t *testing.T, dir string) kv.Store {
		s, err := bolt.Open(dir, bolt.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return s
	},
	// etcd: one real etcd server for the package (TestMain); each test
	// directory gets its own key prefix, so reopening finds the same data.
	// The store runs with group commit, as the meta server runs it.
	"etcd": func(t *testing.T, dir string) kv.Store {
		if testEtcd == nil {
			t.Fatal("no etcd server: TestMain did not start one")
		}
		s, err := etcdkv.Open(context.Background(), etcdkv.Options{Endpoints: []string{testEtcd.Endpoint()},
			Prefix: fmt.Sprintf("core-%x", sha256.Sum256([]byte(dir))), Batch: true, PageSize: 64, CacheEntries: 1000})
		if err != nil {
			t.Fatal(err)
		}
		return s
	},
}

// testEtcd is the etcd server of this package's tests, started by TestMain.
var testEtcd *etcdtest.Server

func TestMain(m *testing.M) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	srv, err := etcdtest.Start(ctx, etcdtest.Options{})
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "meta/core tests need etcd for the etcd backend:", err)
		os.Exit(1)
	}
	testEtcd = srv
	code := m.Run()
	srv.Stop()
	os.Exit(code)
}

// env is one service on a fresh store.
type env struct {
	t     *testing.T
	ctx   context.Context
	s     *Service
	store kv.Store
	clock *fakeclock.Clock
	dir   string
	open  storeFactory
	// reserveGrace is Config.ReserveGrace (default here: none to speak of,
	// so that restarts in tests do not wait).
	reserveGrace time.Duration
}

var (
	root  = &metapb.Caller{}
	alice = &metapb.Caller{Uid: 1000, Gid: 1000}
	bob   = &metapb.Caller{Uid: 1001, Gid: 1001, Groups: []uint32{1000}}
	carol = &metapb.Caller{Uid: 1002, Gid: 1002}
)

var testLayout = stripe.Layout{K: 4, M: 2, Unit: 64 << 10}

// forEachBackend runs fn against a fresh formatted service on every backend.
func forEachBackend(t *testing.T, fn func(t *testing.T, e *env)) {
	for name, open := range backends {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			st := open(t, dir)
			if _, err := Format(context.Background(), st, testLayout, time.Unix(1700000000, 0)); err != nil {
				t.Fatal(err)
			}
			// Deletes free space at once unless a test turns the trash on.
			if err := SetTrashTime(context.Background(), st, 0); err != nil {
				t.Fatal(err)
			}
			e := &env{t: t, ctx: context.Background(), store: st, clock: fakeclock.New(time.Unix(1700000000, 0)), dir: dir, open: open, reserveGrace: time.Nanosecond}
			e.start()
			t.Cleanup(func() { e.store.Close() })
			fn(t, e)
		})
	}
}

func (e *env) start() {
	s, err := New(e.ctx, Config{Store: e.store, Now: e.clock.Now, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), HeartbeatTimeout: 5 * time.Second, SessionTTL: 10 * time.Second, GrantTTL: time.Minute,
		ReserveGrace: e.reserveGrace})
	if err != nil {
		e.t.Fatal(err)
	}
	e.s = s
}

// restart closes and reopens the store and the service.
func (e *env) restart() {
	if err := e.store.Close(); err != nil {
		e.t.Fatal(err)
	}
	e.store = e.open(e.t, e.dir)
	e.start()
}

func wantErrno(t *testing.T, err error, want syscall.Errno) {
	t.Helper()
	if got := metaerr.Errno(err); got != want {
		t.Fatalf("errno = %v (%v), want %v", got, err, want)
	}
}

func (e *env) mkdir(c *metapb.Caller, parent uint64, name string, mode uint32) uint64 {
	e.t.Helper()
	r, err := e.s.Mkdir(e.ctx, &metapb.MkdirRequest{Caller: c, Parent: parent, Name: name, Mode: mode})
	if err != nil {
		e.t.Fatalf("mkdir %q: %v", name, err)
	}
	return r.Attr.Ino
}

func (e *env) create(c *metapb.Caller, parent uint64, name string, mode uint32) uint64 {
	e.t.Helper()
	r, err := e.s.Create(e.ctx, &metapb.CreateRequest{Caller: c, Parent: parent, Name: name, Mode: mode, Exclusive: true})
	if err != nil {
		e.t.Fatalf("create %q: %v", name, err)
	}
	return r.Attr.Ino
}

func (e *env) attr(ino uint64) *metapb.Attr {
	e.t.Helper()
	r, err := e.s.GetAttr(e.ctx, &metapb.GetAttrRequest{Ino: ino})
	if err != nil {
		e.t.Fatalf("getattr %d: %v", ino, err)
	}
	return r.Attr
}

func (e *env) lookup(parent uint64, name string) (uint64, error) {
	r, err := e.s.Lookup(e.ctx, &metapb.LookupRequest{Parent: parent, Name: name})
	if err != nil {
		return 0, err
	}
	return r.Attr.Ino, nil
}

func (e *env) names(dir uint64) []string {
	e.t.Helper()
	return e.namesAs(root, dir)
}

// namesAs lists dir as caller c.
func (e *env) namesAs(c *metapb.Caller, dir uint64) []string {
	e.t.Helper()
	var out []string
	cookie := uint64(0)
	for {
		r, err := e.s.ReadDir(e.ctx, &metapb.ReadDirRequest{Caller: c, Ino: dir, Cookie: cookie, Limit: 7})
		if err != nil {
			e.t.Fatal(err)
		}
		for _, en := range r.Entries {
			out = append(out, en.Name)
			cookie = en.Cookie
		}
		if r.Eof {
			return out
		}
	}
}

// chunkservers registers n chunkservers cs0.. with the given zones.
func (e *env) chunkservers(n int, zones ...string) {
	e.t.Helper()
	for i := 0; i < n; i++ {
		z := ""
		if len(zones) > 0 {
			z = zones[i%len(zones)]
		}
		if _, err := e.s.Register(e.ctx, &metapb.RegisterRequest{Id: csID(i), Address: "10.0.0." + string(rune('a'+i)) + ":1",
			Transports: []string{"tcp"}, Zone: z, Capacity: 100 << 30, Used: 1 << 30}); err != nil {
			e.t.Fatal(err)
		}
	}
}

func csID(i int) string { return "cs" + string(rune('0'+i)) }

type kvTxn = kv.Txn

// removeEntryRaw deletes an entry without touching link counts.
func removeEntryRaw(t kv.Txn, parent uint64, name string) error {
	d, ok, err := getDentry(t, parent, name)
	if err != nil || !ok {
		return err
	}
	return removeEntry(t, parent, name, d)
}
