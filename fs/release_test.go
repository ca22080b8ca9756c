package fs_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/fs/fstest"
	"github.com/rdmafs/rdmafs/meta/metaerr"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// TestReleasesReachMeta closes many files from several threads at once
// (their releases go to meta in batches) after unlinking them while open:
// each must be deleted once its last descriptor closes, and the ones still
// open must stay readable.
func TestReleasesReachMeta(t *testing.T) {
	c := fstest.Start(t, fstest.Options{})
	mc := c.Meta.Client(t)
	const n = 60
	inos := make([]uint64, n)
	kept := make([]*os.File, 0, n/10)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			p := filepath.Join(c.Dir, fmt.Sprintf("f%d", i))
			if err := os.WriteFile(p, []byte(p), 0o644); err != nil {
				t.Error(err)
				return
			}
			a, errA := os.Open(p)
			b, errB := os.Open(p)
			if errA != nil || errB != nil {
				t.Error(errA, errB)
				return
			}
			var st syscall.Stat_t
			if err := syscall.Fstat(int(a.Fd()), &st); err != nil {
				t.Error(err)
			}
			inos[i] = st.Ino
			if err := os.Remove(p); err != nil {
				t.Error(err)
			}
			a.Close()
			if i%10 == 0 {
				mu.Lock()
				kept = append(kept, b)
				mu.Unlock()
				return
			}
			b.Close()
		})
	}
	wg.Wait()
	for _, f := range kept {
		got := make([]byte, 100)
		k, err := f.ReadAt(got, 0)
		if k == 0 || (err != nil && k == 0) {
			t.Errorf("%s, unlinked and still open, read %d bytes: %v", f.Name(), k, err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for i, ino := range inos {
		for {
			_, err := mc.GetAttr(context.Background(), &metapb.GetAttrRequest{Ino: ino})
			gone := metaerr.Errno(err) == syscall.ENOENT
			if want := i%10 != 0; gone == want {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("file %d (open %v): GetAttr %v", i, i%10 == 0, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	for _, f := range kept {
		f.Close()
	}
}
