// Package meta_test is the end-to-end durability test of the metadata
// service: a real `rdmafs meta` process is killed with SIGKILL while clients
// change the namespace, restarted, and must show every acknowledged change.
package meta_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/meta/client"
	"github.com/rdmafs/rdmafs/meta/core"
	"github.com/rdmafs/rdmafs/meta/kv/bolt"
	"github.com/rdmafs/rdmafs/meta/metapb"
	"github.com/rdmafs/rdmafs/meta/metatest"
)

// acked is what one worker knows was acknowledged.
type acked struct {
	dir     uint64
	files   map[string]uint64 // name -> inode, created (and maybe renamed to name)
	removed map[string]bool   // acknowledged unlinks
	xattrs  map[string]string // file name -> xattr value
	stripes map[uint64]uint64 // inode -> committed version of stripe 0
	// inFlight names the file whose rename or unlink was sent but not
	// acknowledged when the server died: either outcome is correct.
	inFlight string
}

func TestKill9KeepsAcknowledgedChanges(t *testing.T) {
	bin := metatest.BuildRdmafs(t)
	p := metatest.StartProcess(t, bin, metatest.Options{SessionTTL: time.Minute})
	ctx := context.Background()
	for round := 0; round < 3; round++ {
		c, err := client.Dial(p.Addr, p.Secret)
		if err != nil {
			t.Fatal(err)
		}
		metatest.FakeChunkservers(t, c, 6, 200*time.Millisecond)
		const workers = 8
		// The workers' calls end when the server is killed: the client would
		// otherwise retry an unavailable server for minutes.
		workCtx, stopWork := context.WithCancel(ctx)
		results := make([]*acked, workers)
		var wg sync.WaitGroup
		var ops atomic.Int64
		for w := 0; w < workers; w++ {
			d, err := c.Mkdir(ctx, &metapb.MkdirRequest{Parent: core.RootIno, Name: fmt.Sprintf("r%d-w%d", round, w), Mode: 0o755})
			if err != nil {
				t.Fatal(err)
			}
			a := &acked{dir: d.Attr.Ino, files: map[string]uint64{}, removed: map[string]bool{}, xattrs: map[string]string{}, stripes: map[uint64]uint64{}}
			results[w] = a
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				work(workCtx, c, a, w, &ops)
			}(w)
		}
		// Let the workers run, then kill -9 in the middle of their traffic.
		deadline := time.Now().Add(60 * time.Second)
		for ops.Load() < 200 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(time.Duration(rand.IntN(300)) * time.Millisecond)
		pid := p.PID()
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatalf("kill -9 %d: %v", pid, err)
		}
		// Give calls in flight a moment to be answered or fail, then stop retries.
		time.Sleep(200 * time.Millisecond)
		stopWork()
		wg.Wait()
		c.Close()
		t.Logf("round %d: killed pid %d after %d acknowledged operations", round, pid, ops.Load())
		if ops.Load() < 50 {
			t.Fatalf("only %d operations acknowledged before the kill", ops.Load())
		}
		checkOffline(t, p.DataDir)
		p.Restart(t)
		c, err = client.Dial(p.Addr, p.Secret)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range results {
			verify(t, ctx, c, a)
		}
		c.Close()
	}
}

// checkOffline opens the killed server's store directly and verifies the
// namespace invariants.
func checkOffline(t *testing.T, dir string) {
	t.Helper()
	st, err := bolt.Open(dir, bolt.Options{})
	if err != nil {
		t.Fatalf("open the store after kill -9: %v", err)
	}
	defer st.Close()
	svc, err := core.New(context.Background(), core.Config{Store: st, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	r, err := svc.Check(context.Background(), &metapb.CheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	problems := r.Problems
	if len(problems) > 0 {
		t.Fatalf("store inconsistent after kill -9: %v", problems)
	}
}

// work creates, renames, unlinks, sets xattrs and commits stripes until the
// server dies, recording each acknowledged change.
func work(ctx context.Context, c *client.Client, a *acked, w int, ops *atomic.Int64) {
	for i := 0; ; i++ {
		name := fmt.Sprintf("f%d", i)
		r, err := c.Create(ctx, &metapb.CreateRequest{Parent: a.dir, Name: name, Mode: 0o644, Exclusive: true})
		if err != nil {
			return
		}
		a.files[name] = r.Attr.Ino
		ops.Add(1)
		switch i % 4 {
		case 1:
			newName := name + ".renamed"
			a.inFlight = name
			if _, err := c.Rename(ctx, &metapb.RenameRequest{Parent: a.dir, Name: name, NewParent: a.dir, NewName: newName}); err != nil {
				return
			}
			a.files[newName] = r.Attr.Ino
			delete(a.files, name)
			a.inFlight = ""
		case 2:
			if _, err := c.SetXattr(ctx, &metapb.SetXattrRequest{Ino: r.Attr.Ino, Name: "user.v", Value: []byte(name)}); err != nil {
				return
			}
			a.xattrs[name] = name
		case 3:
			g, err := c.GrantWrite(ctx, &metapb.GrantWriteRequest{Ino: r.Attr.Ino, Stripes: []uint64{0}})
			if err != nil {
				return
			}
			gr := g.Grants[0]
			if _, err := c.CommitStripes(ctx, &metapb.CommitStripesRequest{Ino: r.Attr.Ino, Size: 4096,
				Stripes: []*metapb.StripeCommit{{Stripe: 0, Version: gr.Version, ExpectedVersion: gr.CommittedVersion, Length: 4096}}}); err != nil {
				return
			}
			a.stripes[r.Attr.Ino] = gr.Version
		case 0:
			a.inFlight = ""
			if i > 0 {
				prev := fmt.Sprintf("f%d", i-4)
				a.inFlight = prev
				if _, err := c.Unlink(ctx, &metapb.UnlinkRequest{Parent: a.dir, Name: prev}); err != nil {
					return
				}
				delete(a.files, prev)
				a.removed[prev] = true
				a.inFlight = ""
			}
		}
		ops.Add(1)
	}
}

func verify(t *testing.T, ctx context.Context, c *client.Client, a *acked) {
	t.Helper()
	for name, ino := range a.files {
		if name == a.inFlight {
			continue
		}
		r, err := c.Lookup(ctx, &metapb.LookupRequest{Parent: a.dir, Name: name})
		if err != nil || r.Attr.Ino != ino {
			t.Fatalf("acknowledged file %q (inode %d) lost after kill -9: %v", name, ino, err)
		}
		if v, ok := a.xattrs[name]; ok {
			x, err := c.GetXattr(ctx, &metapb.GetXattrRequest{Ino: ino, Name: "user.v"})
			if err != nil || string(x.Value) != v {
				t.Fatalf("acknowledged xattr of %q lost: %v", name, err)
			}
		}
		if v, ok := a.stripes[ino]; ok {
			s, err := c.GetStripes(ctx, &metapb.GetStripesRequest{Ino: ino, Count: 1})
			if err != nil || len(s.Stripes) != 1 || s.Stripes[0].Version != v || s.Size != 4096 {
				t.Fatalf("acknowledged stripe commit of %q lost: %v %v", name, s, err)
			}
		}
	}
	for name := range a.removed {
		if _, err := c.Lookup(ctx, &metapb.LookupRequest{Parent: a.dir, Name: name}); client.Errno(err) != syscall.ENOENT {
			t.Fatalf("acknowledged unlink of %q undone after kill -9: %v", name, err)
		}
	}
}
