package fault

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// TestLocksOfKilledMount: a flock taken through a mount that is then killed
// -9 stays held while the mount's session lives (its keepalives stopped),
// and goes when the session expires: a process on the remounted file system
// then gets it.
func TestLocksOfKilledMount(t *testing.T) {
	needRoot(t)
	const ttl = 10 * time.Second
	c := newCluster(t, opts{metaArgs: []string{"--session-ttl", ttl.String()}})
	p := filepath.Join(c.MountPoint, "lockfile")
	if err := os.WriteFile(p, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	held := func() bool { return exec.Command("flock", "--nonblock", p, "true").Run() != nil }
	holder := exec.Command("flock", "--exclusive", p, "sleep", "600")
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		holder.Process.Kill()
		holder.Wait()
	}()
	deadline := time.Now().Add(10 * time.Second)
	for !held() {
		if time.Now().After(deadline) {
			t.Fatal("flock(1) did not take the lock in 10s")
		}
		time.Sleep(20 * time.Millisecond) // flock(1) starting: nothing to wait on
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
	if !held() && time.Since(killed) < ttl {
		t.Fatalf("the killed mount's lock was gone %v after the kill, before its session's TTL (%v)", time.Since(killed), ttl)
	}
	if out, err := exec.Command("flock", "--exclusive", "--timeout", "60", p, "true").CombinedOutput(); err != nil {
		t.Fatalf("flock after the killed mount's session expired: %v %s", err, out)
	}
	t.Logf("lock free %v after the mount was killed (session TTL %v)", time.Since(killed).Round(100*time.Millisecond), ttl)
}
