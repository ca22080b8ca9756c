package fault

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestLeaseOfKilledMount: a mount holding a directory's lease is killed
// with -9; a new mount (another session) lists the directory soon after,
// without waiting for the dead session to expire nor for the recall to time
// out, and finds every file whose create was made durable (fsyncdir) before
// the kill.
func TestLeaseOfKilledMount(t *testing.T) {
	needRoot(t)
	const ttl = 30 * time.Second
	c := newCluster(t, opts{metaArgs: []string{"--session-ttl", ttl.String()}})
	dir := filepath.Join(c.MountPoint, "d")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	const durable, more = 100, 50
	for i := range durable + more {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%03d", i)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if i == durable-1 {
			d, err := os.Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			if err := d.Sync(); err != nil {
				t.Fatal(err)
			}
			d.Close()
		}
	}
	killed := time.Now()
	if err := c.KillMount(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := c.Remount(ctx); err != nil {
		t.Fatal(err)
	}
	listStart := time.Now()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	listed := time.Since(listStart)
	// Meta takes back the lease of a holder silent for 3 s (the kill began
	// that silence before the remount), waking every 750 ms to check; a
	// recall left unanswered would take 5 s.
	if listed >= 4500*time.Millisecond {
		t.Fatalf("the listing took %v: meta waited for the recall's timeout, not for the holder's silence", listed)
	}
	took := time.Since(killed)
	if took >= ttl {
		t.Fatalf("the directory was listed %v after the kill: it waited for the dead session to expire (%v)", took, ttl)
	}
	have := map[string]bool{}
	for _, e := range ents {
		have[e.Name()] = true
	}
	for i := range durable {
		if name := fmt.Sprintf("f%03d", i); !have[name] {
			t.Errorf("%s, created and made durable before the kill, is missing", name)
		}
	}
	t.Logf("listed %v after the kill (the listing itself %v): %d of %d files (the last %d were not made durable)",
		took.Round(100*time.Millisecond), listed.Round(10*time.Millisecond), len(ents), durable+more, more)
}
