// Package clustertest runs devcluster clusters for the suites that test
// rdmafs as real processes (tests/e2e, tests/fault): a cluster per test in
// a directory of its own, stopped by PID when the test ends, with the
// processes' logs in the test log and kept on disk when the test failed.
package clustertest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/rdmafs/rdmafs/internal/devcluster"
)

// logTail is how much of each process log a failed test logs.
const logTail = 3000

// Options adjust Start; the zero value is fine.
type Options struct {
	// Timeout bounds bringing the cluster up (default 1 minute).
	Timeout time.Duration
	// StopGrace is the cluster's StopGrace: how long stopping a process
	// waits after SIGTERM before SIGKILL (0: devcluster's default).
	StopGrace time.Duration
	// OnFailure, when set, runs when the test failed, after the tails of
	// the process logs went to the test log and before the cluster goes
	// down (to have a process write a goroutine dump into its log, say).
	OnFailure func(*devcluster.Cluster)
	// KeepEnv names an environment variable that, when set, keeps the
	// logs of a test that passed too.
	KeepEnv string
}

// Start brings up the cluster cfg describes in a new temporary directory
// (cfg.Dir is ignored), failing the test if it does not come up within
// o.Timeout. When the test ends the cluster goes down (an error fails the
// test). When the test failed, the tail of every process log goes to the
// test log, and the directory is kept with its logs (the data removed);
// otherwise, unless o.KeepEnv is set, it is removed.
func Start(t testing.TB, cfg devcluster.Config, o Options) *devcluster.Cluster {
	t.Helper()
	if o.Timeout == 0 {
		o.Timeout = time.Minute
	}
	dir, err := os.MkdirTemp("", "rdmafs-"+dirName(t.Name())+"-")
	if err != nil {
		t.Fatalf("clustertest: %v", err)
	}
	cfg.Dir = dir
	ctx, cancel := context.WithTimeout(context.Background(), o.Timeout)
	defer cancel()
	c, err := devcluster.Up(ctx, cfg)
	if err != nil {
		// Up stopped what it started; only the logs are left.
		t.Logf("process logs:\n%s", logTails(dir))
		keepLogs(t, dir)
		t.Fatalf("clustertest: cluster up: %v", err)
	}
	if o.StopGrace != 0 {
		c.StopGrace = o.StopGrace
	}
	t.Cleanup(func() {
		failed := t.Failed()
		if failed {
			t.Logf("process logs:\n%s", c.LogTails(logTail))
			if o.OnFailure != nil {
				o.OnFailure(c)
			}
		}
		if err := c.Down(context.Background()); err != nil {
			t.Errorf("clustertest: cluster down: %v", err)
		}
		if failed || (o.KeepEnv != "" && os.Getenv(o.KeepEnv) != "") {
			keepLogs(t, dir)
			return
		}
		os.RemoveAll(dir)
	})
	return c
}

// logTails is Cluster.LogTails for a cluster Up gave up on.
func logTails(dir string) string {
	return (&devcluster.Cluster{Dir: dir}).LogTails(logTail)
}

// keepLogs removes the subdirectories of a cluster's directory (data,
// mount point; not one still mounted) and keeps its files (process logs,
// cluster.json).
func keepLogs(t testing.TB, dir string) {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if sub := filepath.Join(dir, e.Name()); e.IsDir() && !devcluster.IsFUSEMount(sub) {
			os.RemoveAll(sub)
		}
	}
	t.Logf("cluster logs kept in %s", dir)
}

// dirName turns a test name into a short file name.
func dirName(test string) string {
	s := strings.Map(func(r rune) rune {
		if r < 0x80 && (unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '.') {
			return r
		}
		return '_'
	}, test)
	if len(s) > 40 {
		s = s[:40]
	}
	return s
}

// Need skips t unless program prog is installed (in $PATH).
func Need(t testing.TB, prog string) {
	t.Helper()
	if _, err := exec.LookPath(prog); err != nil {
		t.Skipf("%s not installed (make deps installs it)", prog)
	}
}

// Tail returns the last n bytes of s (all of s if shorter), for logging
// the end of a long output.
func Tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
