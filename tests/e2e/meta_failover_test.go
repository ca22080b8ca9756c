package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/internal/devcluster"
	"github.com/rdmafs/rdmafs/meta/kv/etcdkv/etcdtest"
)

// TestMetaFailover runs two meta servers on one real etcd, six chunkservers
// and a FUSE mount given both meta addresses. Writers create, write, fsync
// and rename files through the mount while the serving meta server is
// killed with SIGKILL; the load must finish without a single error and
// every acknowledged file must be there with its content afterwards.
func TestMetaFailover(t *testing.T) {
	etcd := etcdtest.StartT(t)
	dir, err := os.MkdirTemp("", "rdmafs-e2e-etcd-")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := devcluster.Up(ctx, devcluster.Config{Dir: dir, Bin: binDir, Mount: true, ChunkdMem: "64MiB", ClientMem: "128MiB",
		HeartbeatTimeout: 3 * time.Second, KV: etcd.URL("e2e"), Metas: 2, ElectionTTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Down(context.Background()); err != nil {
			t.Errorf("cluster down: %v", err)
		}
		if t.Failed() {
			for _, name := range []string{"mount.log", "meta0.log", "meta1.log", "chunk0.log"} {
				b, _ := os.ReadFile(filepath.Join(dir, name))
				t.Logf("%s:\n%s", name, tail(b))
			}
		}
		os.RemoveAll(dir)
	})
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
		ops      atomic.Int64
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
				ops.Add(1)
			}
		}(w)
	}
	time.Sleep(2 * time.Second)
	before := ops.Load()
	if err := c.KillMeta(0); err != nil {
		t.Fatal(err)
	}
	t.Logf("killed meta 0 (SIGKILL) after %d files", before)
	time.Sleep(8 * time.Second)
	stop.Store(true)
	wg.Wait()
	if firstErr != nil {
		t.Fatalf("an error reached the application across the meta failover: %v", firstErr)
	}
	after := ops.Load()
	t.Logf("%d files written and acknowledged, %d of them after the kill", after, after-before)
	if after <= before {
		t.Fatal("no file was written after the meta server died")
	}
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
