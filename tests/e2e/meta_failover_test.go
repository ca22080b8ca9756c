package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/internal/devcluster"
	"github.com/rdmafs/rdmafs/internal/devcluster/clustertest"
	"github.com/rdmafs/rdmafs/meta/core"
	"github.com/rdmafs/rdmafs/meta/kv/etcdkv/etcdtest"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// TestMetaFailover runs two meta servers on one real etcd, six chunkservers
// and a FUSE mount given both meta addresses. Writers create, write, fsync
// and rename files through the mount while the serving meta server is
// killed with SIGKILL; the load must finish without a single error and
// every acknowledged file must be there with its content afterwards.
func TestMetaFailover(t *testing.T) {
	needRoot(t)
	etcd := etcdtest.StartT(t)
	c := clustertest.Start(t, devcluster.Config{Bin: binDir, Mount: true, ChunkdMem: "64MiB", ClientMem: "128MiB",
		HeartbeatTimeout: 3 * time.Second, KV: etcd.URL("e2e"), Metas: 2, ElectionTTL: 2 * time.Second},
		clustertest.Options{Timeout: 2 * time.Minute})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	leader := c.Leader(ctx)
	if leader != 0 {
		t.Fatalf("meta 0 should serve, leader is %d", leader)
	}

	content := func(w, i int) []byte {
		return bytes.Repeat([]byte(fmt.Sprintf("worker %d file %d\n", w, i)), 2000+((w*31+i*17)%4000))
	}
	const workers = 4
	var (
		stop     atomic.Bool
		wg       sync.WaitGroup
		mu       sync.Mutex
		acked    = map[string][]byte{}
		firstErr error
		ops      = newProgress()
	)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			wdir := filepath.Join(c.MountPoint, fmt.Sprintf("w%d", w))
			fail := func(err error) {
				mu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
				ops.fail()
			}
			if err := os.Mkdir(wdir, 0o755); err != nil {
				fail(err)
				return
			}
			for i := 0; !stop.Load(); i++ {
				name := filepath.Join(wdir, fmt.Sprintf("f%04d", i))
				data := content(w, i)
				f, err := os.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
				if err != nil {
					fail(fmt.Errorf("create %s: %w", name, err))
					return
				}
				if _, err := f.Write(data); err != nil {
					fail(fmt.Errorf("write %s: %w", name, err))
					return
				}
				if err := f.Sync(); err != nil {
					fail(fmt.Errorf("fsync %s: %w", name, err))
					return
				}
				if err := f.Close(); err != nil {
					fail(fmt.Errorf("close %s: %w", name, err))
					return
				}
				final := name
				if i%3 == 0 {
					final = name + ".renamed"
					if err := os.Rename(name, final); err != nil {
						fail(fmt.Errorf("rename %s: %w", name, err))
						return
					}
				}
				mu.Lock()
				acked[final] = data
				mu.Unlock()
				ops.step()
			}
		}(w)
	}
	killMetaUnderLoad(t, c, ops, 8*workers, "files", func() error {
		stop.Store(true)
		wg.Wait()
		return firstErr
	})
	if l := c.Leader(ctx); l != 1 {
		t.Fatalf("leader after the kill is %d, want 1", l)
	}
	// Nothing acknowledged is lost: names and contents, read back through
	// the mount (the file attributes and stripes come from the new leader).
	for name, want := range acked {
		got, err := os.ReadFile(name)
		if err != nil {
			t.Fatalf("acknowledged file lost: %v", err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%s: %d bytes differ from the %d acknowledged", name, len(got), len(want))
		}
	}
	for w := 0; w < workers; w++ {
		ents, err := os.ReadDir(filepath.Join(c.MountPoint, fmt.Sprintf("w%d", w)))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			if _, ok := acked[filepath.Join(c.MountPoint, fmt.Sprintf("w%d", w), e.Name())]; !ok {
				// The file a writer was creating when it stopped is not
				// acknowledged; anything else is unexpected.
				t.Logf("unacknowledged entry %s (a write in flight at the stop)", e.Name())
			}
		}
	}
}

// killMetaUnderLoad is the fault of the meta failover tests. It kills meta
// 0 with SIGKILL once the load counted by ops has acknowledged warm
// operations, and waits until the load has acknowledged warm more after the
// kill: all but the one per worker that may have been in flight, and that
// meta 0 still answered, went through the new leader. Then it calls
// stopLoad, which stops the load and returns its first error. The test
// fails on that error, or if the load stalled before or after the kill;
// what names the operations in the messages.
func killMetaUnderLoad(t *testing.T, c *devcluster.Cluster, ops *progress, warm int64, what string, stopLoad func() error) {
	t.Helper()
	waited := ops.wait(warm, time.Minute)
	before := ops.load()
	if waited {
		if err := c.KillMeta(0); err != nil {
			t.Fatal(err)
		}
		t.Logf("killed meta 0 (SIGKILL) after %d %s", before, what)
		waited = ops.wait(before+warm, time.Minute)
	}
	if err := stopLoad(); err != nil {
		t.Fatalf("an error reached the application across the meta failover: %v", err)
	}
	after := ops.load()
	t.Logf("%d %s acknowledged, %d of them after the kill", after, what, after-before)
	if !waited {
		t.Fatalf("the load stalled: %d %s before the kill, %d after", before, what, after-before)
	}
}

// TestMetaFailoverClient drives 16 concurrent metadata clients (creates and
// unlinks through the meta client, no FUSE) while the serving meta process
// is killed with SIGKILL: no call may fail, and the namespace afterwards is
// exactly what the acknowledged calls made - no lost create, no double
// unlink reported as ENOENT, no retried create reported as EEXIST.
func TestMetaFailoverClient(t *testing.T) {
	needRoot(t)
	etcd := etcdtest.StartT(t)
	c := clustertest.Start(t, devcluster.Config{Bin: binDir, Chunkservers: -1, KV: etcd.URL("e2e-client"), Metas: 2, ElectionTTL: 2 * time.Second},
		clustertest.Options{Timeout: 2 * time.Minute})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	mc, err := c.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer mc.Close()
	const workers = 16
	var (
		stop    atomic.Bool
		wg      sync.WaitGroup
		mu      sync.Mutex
		want    = map[uint64]map[string]bool{}
		errs    []error
		ops     = newProgress()
		parents = make([]uint64, workers)
	)
	for w := range parents {
		d, err := mc.Mkdir(ctx, &metapb.MkdirRequest{Parent: core.RootIno, Name: fmt.Sprintf("w%d", w), Mode: 0o755})
		if err != nil {
			t.Fatal(err)
		}
		parents[w] = d.Attr.Ino
		want[d.Attr.Ino] = map[string]bool{}
	}
	// fail records a worker's failed call; the worker then stops.
	fail := func(err error) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
		ops.fail()
	}
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			p := parents[w]
			for i := 0; !stop.Load(); i++ {
				name := fmt.Sprintf("f%d", i)
				if _, err := mc.Create(ctx, &metapb.CreateRequest{Parent: p, Name: name, Mode: 0o644, Exclusive: true}); err != nil {
					fail(fmt.Errorf("create w%d/%s: %w", w, name, err))
					return
				}
				mu.Lock()
				want[p][name] = true
				mu.Unlock()
				if i%2 == 1 {
					if _, err := mc.Unlink(ctx, &metapb.UnlinkRequest{Parent: p, Name: name}); err != nil {
						fail(fmt.Errorf("unlink w%d/%s: %w", w, name, err))
						return
					}
					mu.Lock()
					delete(want[p], name)
					mu.Unlock()
				}
				ops.step()
			}
		}(w)
	}
	killMetaUnderLoad(t, c, ops, 8*workers, "create(+unlink) steps", func() error {
		stop.Store(true)
		wg.Wait()
		if len(errs) > 0 {
			return fmt.Errorf("%d calls failed, first: %w", len(errs), errs[0])
		}
		return nil
	})
	for w, p := range parents {
		got := map[string]bool{}
		cookie := uint64(0)
		for {
			r, err := mc.ReadDir(ctx, &metapb.ReadDirRequest{Ino: p, Cookie: cookie, Limit: 1000})
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range r.Entries {
				got[e.Name] = true
				cookie = e.Cookie
			}
			if r.Eof || len(r.Entries) == 0 {
				break
			}
		}
		if !reflect.DeepEqual(got, want[p]) {
			t.Fatalf("w%d: namespace after failover has %d entries, the acknowledged calls made %d", w, len(got), len(want[p]))
		}
	}
	log, _ := os.ReadFile(filepath.Join(c.Dir, "meta1.log"))
	t.Logf("new leader replayed %d stored outcomes of retried requests", bytes.Count(log, []byte("replayed the stored outcome")))
}
