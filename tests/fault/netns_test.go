package fault

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/internal/devcluster"
	"github.com/rdmafs/rdmafs/internal/netns"
)

// netLab builds network namespaces for a cluster: a hub with a bridge, and
// hosts meta, mnt and c0..c(n-1), each a namespace of its own. It skips
// the test when namespaces cannot be made here.
func netLab(t *testing.T, n int) (*netns.Lab, *devcluster.Net, []*netns.Host) {
	t.Helper()
	if err := netns.Available(); err != nil {
		t.Skipf("network fault tests need ip (iproute2), nsenter (util-linux) and root: %v", err)
	}
	if _, err := exec.LookPath("tc"); err != nil {
		t.Skip("network fault tests need tc (iproute2)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	lab, err := netns.New(ctx, fmt.Sprintf("rdfault%d", os.Getpid()%100000), "10.77.0")
	if err != nil {
		t.Skipf("cannot create network namespaces here: %v", err)
	}
	// Registered before the cluster: runs after its processes are stopped.
	t.Cleanup(func() {
		if err := lab.Close(); err != nil {
			t.Errorf("removing the namespaces: %v", err)
		}
	})
	host := func(name string) *netns.Host {
		h, err := lab.AddHost(ctx, name)
		if err != nil {
			t.Fatalf("network namespace %s: %v", name, err)
		}
		return h
	}
	meta, mnt := host("meta"), host("mnt")
	var chunk []*netns.Host
	for i := 0; i < n; i++ {
		chunk = append(chunk, host(fmt.Sprintf("c%d", i)))
	}
	place := func(h *netns.Host) devcluster.Host { return devcluster.Host{IP: h.IP, Prefix: h.Prefix()} }
	nw := &devcluster.Net{Meta: place(meta), Mount: place(mnt),
		Chunkd: func(i int) devcluster.Host { return place(chunk[i]) }, Dial: meta.DialContext}
	return lab, nw, chunk
}

// sameNetns reports whether process pid runs in the namespace at path.
func sameNetns(pid int, path string) bool {
	var a, b syscall.Stat_t
	if syscall.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &a) != nil || syscall.Stat(path, &b) != nil {
		return false
	}
	return a.Ino == b.Ino && a.Dev == b.Dev
}

func rootAddrs(t *testing.T) string {
	var all string
	for _, what := range []string{"addr", "link"} {
		out, err := exec.Command("ip", "-o", what, "show").CombinedOutput()
		if err != nil {
			t.Fatalf("ip %s: %v: %s", what, err, out)
		}
		all += string(out)
	}
	return all
}

// TestNetworkFaults puts each chunkserver, meta and the mount in a network
// namespace of its own, joined by veth pairs to a bridge in a hub namespace
// (no address in the test's own namespace), and runs a writer (write +
// fsync) and a reader (cold O_DIRECT reads of acknowledged files) while one
// chunkserver at a time loses 30% of its packets, is slowed down, is
// blackholed (every packet dropped, the process still running: a silent
// peer) and is partitioned (link down). No application call may fail or
// stall past stallBound; after healing, the cluster returns to full
// redundancy and every acknowledged byte reads back.
func TestNetworkFaults(t *testing.T) {
	needRoot(t)
	before := rootAddrs(t)
	_, nw, chunk := netLab(t, 7)
	c := newCluster(t, opts{net: nw})
	s := newScene(t, c, 5*time.Minute)
	ctx := s.ctx

	// Where everything runs: the mount process in its namespace, its FUSE
	// mount visible here (nsenter --net changes only the network).
	if !devcluster.IsFUSEMount(c.MountPoint) {
		t.Fatalf("the mount at %s is not visible in the test's mount namespace", c.MountPoint)
	}
	for name, chk := range map[string]struct {
		pid int
		ns  []string
	}{"mount": {c.Mount.PID, nw.Mount.Prefix}, "meta": {c.Meta.PID, nw.Meta.Prefix}, "chunkd 0": {c.Chunk[0].PID, nw.Chunkd(0).Prefix}} {
		path := strings.TrimPrefix(chk.ns[1], "--net=")
		if !sameNetns(chk.pid, path) {
			t.Fatalf("%s (pid %d) does not run in network namespace %s", name, chk.pid, path)
		}
	}
	if after := rootAddrs(t); after != before {
		t.Fatalf("the test's own network namespace changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	t.Logf("meta %s, chunkservers %s..%s, mount: each in a namespace of its own; the mount is visible here",
		c.MetaAddr, c.Chunk[0].Addr, c.Chunk[6].Addr)

	// Files to read back cold, written before any fault.
	s.phase("no fault")
	w := &writer{rec: s.rec, led: s.led, dir: c.MountPoint, name: "base", fileSize: 8 << 20, chunk: 1 << 20, syncEvery: 8 << 20, seed: 5}
	var files []fileSum
	for i := 0; i < 3; i++ {
		p := filepath.Join(c.MountPoint, fmt.Sprintf("base%d", i))
		if err := s.guard("write "+p, func() error { return w.file(ctx, p, uint64(50+i)) }); err != nil {
			t.Fatalf("writing %s: %v", p, err)
		}
	}
	for _, a := range s.led.all() {
		files = append(files, fileSum{Path: a.path, Size: a.size, Sum: hex.EncodeToString(a.sum[:])})
	}
	wdir := filepath.Join(c.MountPoint, "w")
	s.mkdir(wdir)
	s.startLoad("writer", loadSpec{Kind: "writer", Dir: wdir, Name: "w", FileSize: 4 << 20, Chunk: 256 << 10, SyncEvery: 1 << 20, Seed: 6})
	s.startLoad("reader", loadSpec{Kind: "reader", Files: files})
	reads := func() int { return s.rec.count("read") }
	pass := 0 // 1 MiB reads (readSum) in a pass over every file
	for _, f := range files {
		pass += int((f.Size + 1<<20 - 1) >> 20)
	}
	// A fault lasts until the writer has acknowledged 8 MiB more and the
	// reader has read every file once more, and for at least 6 s (past
	// meta's heartbeat timeout, so the chunkserver is also marked down).
	under := func(what string) {
		t.Helper()
		r0 := reads()
		s.progress(what, 8<<20, 6*time.Second, 90*time.Second)
		s.waitFor(what+": a full pass of cold reads", 60*time.Second, func() bool { return reads() >= r0+pass+1 })
	}
	clearFaults := func(h *netns.Host) {
		t.Helper()
		if err := h.Clear(ctx); err != nil {
			t.Fatalf("clearing the faults of %s: %v", h.Name, err)
		}
	}
	under("no fault")

	s.phase("chunkd 2 loses 30%% of its packets")
	if err := chunk[2].Loss(ctx, 30); errors.Is(err, netns.ErrUnsupported) {
		t.Logf("packet loss not injected: %v", err)
	} else if err != nil {
		t.Fatal(err)
	} else {
		under("30% packet loss on chunkd 2")
	}
	clearFaults(chunk[2])

	if chunk[2].HasNetem(ctx) {
		s.phase("chunkd 2 delayed 300ms")
		if err := chunk[2].Delay(ctx, 300*time.Millisecond, 50*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		under("300 ms delay on chunkd 2")
	} else {
		s.phase("chunkd 2 throttled to 4 mbit/s (no netem in this kernel: no delay)")
		if err := chunk[2].Throttle(ctx, "4mbit"); err != nil {
			t.Fatal(err)
		}
		under("chunkd 2 throttled to 4 mbit/s")
	}
	clearFaults(chunk[2])

	s.phase("chunkd 3 blackholed (every packet dropped, process running)")
	err := chunk[3].Blackhole(ctx)
	if errors.Is(err, netns.ErrUnsupported) && chunk[3].HasNetem(ctx) {
		err = chunk[3].Netem(ctx, "loss", "100%")
	}
	if errors.Is(err, netns.ErrUnsupported) {
		t.Logf("blackhole not injected (no nftables, no netem): %v", err)
	} else if err != nil {
		t.Fatal(err)
	} else {
		under("chunkd 3 blackholed")
	}
	clearFaults(chunk[3])

	s.phase("chunkd 5 partitioned (link down)")
	if err := chunk[5].Partition(ctx); err != nil {
		t.Fatal(err)
	}
	under("chunkd 5 partitioned")
	s.phase("healed")
	if err := chunk[5].Heal(ctx); err != nil {
		t.Fatal(err)
	}
	under("healed")
	s.stopLoad()
	s.phase("verify")
	waitRedundancy(t, c, 7, 90*time.Second)
	s.verify()
	s.rec.check(t, stallBound)
}
