// Package fault is rdmafs' fault-injection suite (issue 22): real meta,
// chunkd and mount processes, a real FUSE mount and real programs (fio, a
// writer that fsyncs, a child process blocked in a write), while processes
// are killed with SIGKILL and restarted, disks fill, and chunkservers in
// network namespaces of their own lose packets or are cut off.
//
// Every case checks that applications see only the errors a local disk
// gives (0, EIO, ENOSPC, EINTR, each only where the case allows it), that
// no single write, fsync or read stalls past a bound, that every byte
// acknowledged by a successful fsync reads back with its checksum, and that
// the cluster returns to full redundancy once the failed parts return.
//
// Environment:
//
//	RDMAFS_FAULT_BIN=DIR         use rdmafs and chunkd from DIR instead of building ./cmd/...
//	RDMAFS_FAULT_MOUNT_ARGS="…"  mount flags instead of the default (--write-timeout 8s
//	                             --io-timeout 3s); "none" for none (older binaries)
//	RDMAFS_FAULT_KEEP=1          keep every cluster directory (logs) after the test
//	RDMAFS_SOAK=1                run TestSoak (make soak); RDMAFS_SOAK_CYCLES=N (default 200)
package fault

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/internal/cmdbuild"
	"github.com/rdmafs/rdmafs/internal/devcluster"
	"github.com/rdmafs/rdmafs/internal/devcluster/clustertest"
)

// binDir holds the rdmafs and chunkd binaries TestMain built (or
// RDMAFS_FAULT_BIN); empty when the suite cannot run here (every test then
// skips in needRoot before it would use it).
var binDir string

// writeTimeout is the mount's --write-timeout in these tests: how long a
// write below min-write-shards waits before EIO.
const writeTimeout = 8 * time.Second

// stallBound is the longest any single write, fsync, read (or metadata
// call) may take in a case that allows no error.
const stallBound = 10 * time.Second

// hangBound is how long an operation may be in flight before the case
// stops waiting for it and fails as a hang (goroutine dump of the mount in
// its log).
const hangBound = 90 * time.Second

func mountArgs() []string {
	if s, ok := os.LookupEnv("RDMAFS_FAULT_MOUNT_ARGS"); ok {
		if s == "none" {
			return nil
		}
		return strings.Fields(s)
	}
	return []string{"--write-timeout", writeTimeout.String(), "--io-timeout", "3s"}
}

// TestMain builds the binaries, only where the suite can run (as root, with
// /dev/fuse): elsewhere every test skips itself (needRoot), so go test -v
// lists each as SKIP with its reason instead of the package passing having
// run nothing.
func TestMain(m *testing.M) {
	if spec := os.Getenv(childEnv); spec != "" {
		os.Exit(runChild(spec))
	}
	if whyNot() != "" {
		os.Exit(m.Run())
	}
	// One cluster suite at a time on this machine: the cases bound stalls
	// in seconds, and another suite's cluster on the same two cores (go
	// test runs packages in parallel) would stretch them. Other suites may
	// take the same lock.
	if lock, err := os.OpenFile(filepath.Join(os.TempDir(), "rdmafs-cluster-tests.lock"), os.O_CREATE|os.O_RDWR, 0o644); err == nil {
		syscall.Flock(int(lock.Fd()), syscall.LOCK_EX) // released when the process exits
	}
	if dir := os.Getenv("RDMAFS_FAULT_BIN"); dir != "" {
		binDir = dir
		os.Exit(m.Run())
	}
	dir, remove, err := cmdbuild.Temp()
	if err != nil {
		fmt.Printf("fault: %v\n", err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	remove()
	os.Exit(code)
}

// whyNot says why the suite cannot run on this machine, "" when it can: it
// mounts FUSE file systems, runs the daemons as root and (TestNetworkFaults)
// creates network namespaces.
func whyNot() string {
	if os.Geteuid() != 0 {
		return "fault needs root: it mounts FUSE and runs the daemons as root (binaries are built only as root)"
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		return fmt.Sprintf("fault needs /dev/fuse: %v", err)
	}
	return ""
}

// needRoot skips t unless the suite can run here (whyNot: root and
// /dev/fuse), with the reason; TestMain builds the binaries only then. Every
// test calls it first.
func needRoot(t *testing.T) {
	t.Helper()
	if why := whyNot(); why != "" {
		t.Skip(why)
	}
}

// opts adjusts a case's cluster.
type opts struct {
	chunkservers int    // default 7 (k+m+1)
	disk         string // a tmpfs of this size per chunkd
	net          *devcluster.Net
	noMount      bool
	metaArgs     []string // more meta flags
}

// newCluster brings up meta, the chunkservers and a mount with short
// heartbeat and repair grace periods, torn down (by PID) after the test.
// On failure clustertest logs every process log's tail and keeps the logs,
// and the mount writes a goroutine dump (SIGQUIT) into its log.
func newCluster(t *testing.T, o opts) *devcluster.Cluster {
	t.Helper()
	if o.chunkservers == 0 {
		o.chunkservers = 7
	}
	cfg := devcluster.Config{Bin: binDir, Chunkservers: o.chunkservers, Transport: "tcp",
		ChunkdMem: "64MiB", ClientMem: "128MiB", Mount: !o.noMount, HeartbeatTimeout: 2 * time.Second,
		MetaArgs:   append([]string{"--repair-grace", "1s", "--repair-task-timeout", "20s"}, o.metaArgs...),
		ChunkdArgs: []string{"--repair-mem", "16MiB"},
		MountArgs:  mountArgs(), ChunkdDisk: o.disk, Net: o.net}
	return clustertest.Start(t, cfg, clustertest.Options{Timeout: 90 * time.Second, StopGrace: 15 * time.Second,
		KeepEnv: "RDMAFS_FAULT_KEEP", OnFailure: func(c *devcluster.Cluster) {
			if c.Mount != nil {
				syscall.Kill(c.Mount.PID, syscall.SIGQUIT)
				waitGone(c.Mount.PID, 5*time.Second)
			}
		}})
}

// waitGone polls until process pid has exited, for at most d.
func waitGone(pid int, d time.Duration) {
	deadline := time.Now().Add(d)
	for !devcluster.Exited(pid) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
}

// rdmafsStatus runs `rdmafs status` against the cluster and returns its output.
func rdmafsStatus(c *devcluster.Cluster) string {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	out, err := c.Command(ctx, "rdmafs", append([]string{"status", c.MetaAddr}, c.ClientArgs()...)...).CombinedOutput()
	if err != nil {
		return fmt.Sprintf("rdmafs status: %v\n%s", err, out)
	}
	return string(out)
}

// waitRedundancy waits until every stripe has all its shards again with up
// chunkservers up, logs how long that took and `rdmafs status`.
func waitRedundancy(t *testing.T, c *devcluster.Cluster, up int, timeout time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout+10*time.Second)
	defer cancel()
	took, err := c.WaitFullRedundancy(ctx, up, timeout)
	st := rdmafsStatus(c)
	if err != nil {
		t.Fatalf("%v\n%s", err, st)
	}
	if !strings.Contains(st, " 0 degraded, 0 lost") {
		t.Fatalf("rdmafs status does not show full redundancy:\n%s", st)
	}
	t.Logf("full redundancy %v after the failed parts returned", took.Round(time.Millisecond))
}

// sleepCtx waits d (a fault's duration, never a synchronization) or until
// ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}
