// Package e2e tests rdmafs as users run it: real rdmafs meta, chunkd and rdmafs
// mount processes on 127.0.0.1, a real FUSE mount, and real programs (fio, cp,
// diff, sqlite3) on it.
package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmafs/rdmafs/internal/cmdbuild"
	"github.com/rdmafs/rdmafs/internal/devcluster"
	"github.com/rdmafs/rdmafs/internal/devcluster/clustertest"
)

// binDir holds the rdmafs binaries TestMain built; empty when not root (every
// test then skips in needRoot before it would use it).
var binDir string

// TestMain builds the binaries, as root only: without root every test skips
// itself (needRoot), so go test -v lists each as SKIP with its reason
// instead of the package passing having run nothing.
func TestMain(m *testing.M) {
	if child := os.Getenv(childEnv); child != "" {
		os.Exit(runChild(child))
	}
	if os.Geteuid() != 0 {
		os.Exit(m.Run())
	}
	dir, remove, err := cmdbuild.Temp()
	if err != nil {
		fmt.Printf("e2e: %v\n", err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	remove()
	os.Exit(code)
}

// needRoot skips t unless the test runs as root: the suite mounts FUSE file
// systems and runs its daemons as root, and TestMain builds the binaries only
// then. Every test calls it first.
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("e2e needs root: it mounts FUSE and runs the daemons as root (binaries are built only as root)")
	}
}

// up starts a cluster of real processes, mounted, torn down after the test.
func up(t *testing.T) *devcluster.Cluster {
	t.Helper()
	return upWith(t, nil)
}

// upWith is up with the configuration adjusted by adjust (if not nil).
func upWith(t *testing.T, adjust func(*devcluster.Config)) *devcluster.Cluster {
	t.Helper()
	cfg := devcluster.Config{Bin: binDir, Mount: true, ChunkdMem: "64MiB", ClientMem: "128MiB",
		HeartbeatTimeout: 3 * time.Second}
	if adjust != nil {
		adjust(&cfg)
	}
	return clustertest.Start(t, cfg, clustertest.Options{})
}

func run(t *testing.T, dir, prog string, args ...string) string {
	t.Helper()
	cmd := exec.Command(prog, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", prog, strings.Join(args, " "), err, clustertest.Tail(string(out), 3000))
	}
	return string(out)
}

func pattern(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, ^seed))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// TestFioVerify runs fio jobs that verify every block they wrote (crc32c):
// buffered sequential and random writes, and O_DIRECT random writes and reads
// through libaio at queue depth 16, which the kernel sends to the mount
// concurrently (asynchronous direct I/O).
func TestFioVerify(t *testing.T) {
	needRoot(t)
	clustertest.Need(t, "fio")
	c := up(t)
	out := run(t, c.MountPoint, "fio", "--name=seq", "--rw=write", "--bs=1M", "--size=96M", "--end_fsync=1",
		"--verify=crc32c", "--verify_fatal=1", "--do_verify=1",
		"--name=rand", "--rw=randwrite", "--bs=4k", "--size=16M", "--verify=crc32c", "--verify_fatal=1", "--do_verify=1",
		"--name=aio", "--ioengine=libaio", "--iodepth=16", "--direct=1", "--rw=randwrite", "--bs=4k", "--size=16M",
		"--verify=crc32c", "--verify_fatal=1", "--do_verify=1")
	if strings.Contains(out, "verify: bad") || strings.Count(out, "err= 0") != 3 {
		t.Fatalf("fio verify failed (every one of the 3 jobs must end with err= 0):\n%s", clustertest.Tail(out, 3000))
	}
}

// TestCopyTree copies a tree in with cp -a and compares it with diff -r: file
// contents, symlinks, modes.
func TestCopyTree(t *testing.T) {
	needRoot(t)
	c := up(t)
	src := t.TempDir()
	for i := 0; i < 40; i++ {
		d := filepath.Join(src, fmt.Sprintf("dir%d", i%7), fmt.Sprintf("sub%d", i%3))
		os.MkdirAll(d, 0o755)
		os.WriteFile(filepath.Join(d, fmt.Sprintf("f%d", i)), pattern(i*7919, uint64(i)), os.FileMode(0o600|(i%2)*0o44))
	}
	os.Symlink("dir1/sub1", filepath.Join(src, "link"))
	os.WriteFile(filepath.Join(src, "empty"), nil, 0o644)
	// The repository's own sources make a realistic tree too.
	run(t, "", "cp", "-a", "../../rdma", filepath.Join(src, "rdma-src"))
	dst := filepath.Join(c.MountPoint, "copy")
	varyOwnersAndTimes(t, src)
	run(t, "", "cp", "-a", src, dst)
	run(t, "", "diff", "-r", "--no-dereference", src, dst)
	sameMetadata(t, "cp -a", src, dst)
}

// TestTarTree extracts a tar archive of a tree (the repository's sources,
// owners and times varied) onto the mount as root, as a package manager or
// a backup restore would: every file's bytes, mode, owner and modification
// time (nanoseconds: POSIX pax format) arrive.
func TestTarTree(t *testing.T) {
	needRoot(t)
	clustertest.Need(t, "tar")
	c := up(t)
	src := t.TempDir()
	run(t, "", "cp", "-a", "../../fs", filepath.Join(src, "fs-src"))
	os.WriteFile(filepath.Join(src, "setuid"), []byte("#!/bin/sh\n"), 0o755)
	os.Chmod(filepath.Join(src, "setuid"), 0o4755)
	varyOwnersAndTimes(t, src)
	dst := filepath.Join(c.MountPoint, "untar")
	os.Mkdir(dst, 0o755)
	archive := filepath.Join(t.TempDir(), "tree.tar")
	run(t, "", "tar", "--format=posix", "-C", src, "-cf", archive, ".")
	run(t, "", "tar", "-C", dst, "-xpf", archive)
	run(t, "", "diff", "-r", "--no-dereference", src, dst)
	sameMetadata(t, "tar -x", src, dst)
}

// varyOwnersAndTimes gives the entries of the tree at root different owners
// and modification times (with nanoseconds), deepest first so that setting
// a directory's time is not undone by changes inside it.
func varyOwnersAndTimes(t *testing.T, root string) {
	t.Helper()
	var paths []string
	filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err == nil && p != root {
			paths = append(paths, p)
		}
		return nil
	})
	for i := len(paths) - 1; i >= 0; i-- {
		p := paths[i]
		if err := os.Lchown(p, 1000+i%3, 2000+i%5); err != nil {
			t.Fatal(err)
		}
		ts := []unix.Timespec{unix.NsecToTimespec(int64(1e18) + int64(i)*1e9 + int64(i*7919)), unix.NsecToTimespec(int64(1.5e18) + int64(i)*1e9 + 123456789)}
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			t.Fatal(err)
		}
	}
}

// sameMetadata compares every entry under src with its copy under dst:
// mode, owner and modification time (to the nanosecond).
func sameMetadata(t *testing.T, how, src, dst string) {
	t.Helper()
	var diffs []string
	n := 0
	filepath.Walk(src, func(p string, _ os.FileInfo, err error) error {
		if err != nil || p == src {
			return nil
		}
		n++
		rel, _ := filepath.Rel(src, p)
		var a, b unix.Stat_t
		if err := unix.Lstat(p, &a); err != nil {
			return nil
		}
		if err := unix.Lstat(filepath.Join(dst, rel), &b); err != nil {
			diffs = append(diffs, fmt.Sprintf("%s: %v", rel, err))
			return nil
		}
		if a.Mode != b.Mode || a.Uid != b.Uid || a.Gid != b.Gid || a.Mtim != b.Mtim {
			diffs = append(diffs, fmt.Sprintf("%s: mode %o/%o owner %d:%d/%d:%d mtime %d.%09d/%d.%09d", rel,
				a.Mode, b.Mode, a.Uid, a.Gid, b.Uid, b.Gid, a.Mtim.Sec, a.Mtim.Nsec, b.Mtim.Sec, b.Mtim.Nsec))
		}
		return nil
	})
	if len(diffs) > 0 {
		t.Fatalf("%s: %d of %d entries differ in mode, owner or mtime (source/copy), first ones:\n%s", how, len(diffs), n,
			strings.Join(diffs[:min(len(diffs), 10)], "\n"))
	}
	t.Logf("%s: %d entries with the same mode, owner and mtime", how, n)
}

// TestSQLite runs a database on the mount and checks its integrity.
func TestSQLite(t *testing.T) {
	needRoot(t)
	clustertest.Need(t, "sqlite3")
	c := up(t)
	db := filepath.Join(c.MountPoint, "test.db")
	var sql strings.Builder
	sql.WriteString("PRAGMA journal_mode=WAL; CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT);\n")
	for tx := 0; tx < 20; tx++ {
		sql.WriteString("BEGIN;\n")
		for i := 0; i < 500; i++ {
			fmt.Fprintf(&sql, "INSERT INTO t(v) VALUES('%s');\n", strings.Repeat(string(rune('a'+(tx+i)%26)), 50+i%200))
		}
		sql.WriteString("COMMIT;\n")
	}
	sql.WriteString("DELETE FROM t WHERE id % 3 = 0; VACUUM;\n")
	cmd := exec.Command("sqlite3", db)
	cmd.Stdin = strings.NewReader(sql.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("sqlite3: %v\n%s", err, out)
	}
	out := run(t, "", "sqlite3", db, "PRAGMA integrity_check; SELECT count(*) FROM t;")
	if got := strings.Fields(out); len(got) != 2 || got[0] != "ok" || got[1] != "6667" {
		t.Fatalf("integrity_check and count: %q, want ok and 6667", out)
	}
}

// TestChunkdKilledDuringReads kills one and then a second chunkd with SIGKILL
// while readers loop over a file: every read returns the right bytes, reads
// go on after each kill, and the mount counts degraded stripe reads once a
// chunkserver is dead. The readers use O_DIRECT, so that every read reaches
// the mount: with the kernel's page cache (kept while the file is unchanged)
// they would read the file's pages again and never the chunkservers. The
// mount's readahead memory holds two of the file's six stripes, so that
// each read fetches most of them from the chunkservers (with the default,
// the whole file could stay in it and the reads never need a chunkserver).
func TestChunkdKilledDuringReads(t *testing.T) {
	needRoot(t)
	c := upWith(t, func(cfg *devcluster.Config) {
		cfg.MountArgs = append(cfg.MountArgs, "--metrics", "127.0.0.1:0", "--readahead-mem", "8MiB")
	})
	metrics := mountMetricsAddr(t, c)
	data := pattern(24<<20, 42)
	want := sha256.Sum256(data)
	p := filepath.Join(c.MountPoint, "big")
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	const readers = 2
	reads := newProgress()
	var stop atomic.Bool
	var wg sync.WaitGroup
	for r := 0; r < readers; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf, err := unix.Mmap(-1, 0, 1<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE) // page-aligned, for O_DIRECT
			if err != nil {
				t.Error(err)
				reads.fail()
				return
			}
			defer unix.Munmap(buf)
			for !stop.Load() {
				got, n, err := readDirect(p, buf)
				if err != nil || n != int64(len(data)) || got != want {
					t.Errorf("read during failures: %v (%d bytes of %d, same checksum: %v)", err, n, len(data), got == want)
					reads.fail()
					return
				}
				reads.step()
			}
		}()
	}
	// The readers stop before the test returns, also when it fails.
	defer func() {
		stop.Store(true)
		wg.Wait()
	}()
	if !reads.wait(readers, 2*time.Minute) {
		t.Fatalf("the readers did not get going: %d reads", reads.load())
	}
	const counter = "rdmafs_client_degraded_stripe_reads_total"
	degraded := mountCounter(t, metrics, counter)
	t.Logf("%d reads with every chunkserver up, %v degraded stripe reads", reads.load(), degraded)
	for _, i := range []int{1, 4} {
		if err := c.KillChunkd(i); err != nil { // returns once the process is gone
			t.Fatal(err)
		}
		// Each reader has at most one read in flight at the kill: of the
		// 2*readers reads acknowledged after it, at least readers ran
		// entirely without the chunkserver.
		before := reads.load()
		if !reads.wait(before+2*readers, 2*time.Minute) {
			t.Fatalf("reads stalled after chunkd %d was killed: %d after the kill (%d before)", i, reads.load()-before, before)
		}
		now := mountCounter(t, metrics, counter)
		if now <= degraded {
			t.Fatalf("%d reads after chunkd %d was killed, yet no degraded stripe read (%v before, %v after): the reads did not need its shards",
				reads.load()-before, i, degraded, now)
		}
		t.Logf("chunkd %d killed: %d reads since, %v degraded stripe reads", i, reads.load()-before, now-degraded)
		degraded = now
	}
}

// readDirect reads the whole file at p with O_DIRECT, through buf (which
// must be page-aligned, as an anonymous mapping is), and returns the SHA-256
// of its bytes and how many it read. Every read goes to the file system,
// none is served from the kernel's page cache.
func readDirect(p string, buf []byte) ([32]byte, int64, error) {
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_DIRECT, 0)
	if err != nil {
		return [32]byte{}, 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.CopyBuffer(h, struct{ io.Reader }{f}, buf) // the struct hides File.WriteTo, which would not use buf
	var sum [32]byte
	h.Sum(sum[:0])
	return sum, n, err
}

// mountMetricsAddr returns the address the cluster's mount serves its
// metrics on (started with --metrics 127.0.0.1:0, it logs the port it took).
func mountMetricsAddr(t *testing.T, c *devcluster.Cluster) string {
	t.Helper()
	log, err := os.ReadFile(c.Mount.Log)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`msg=metrics addr=(\S+)`).FindSubmatch(log)
	if m == nil {
		t.Fatalf("the mount logged no metrics address (started with --metrics?):\n%s", clustertest.Tail(string(log), 2000))
	}
	return string(m[1])
}

// mountCounter returns the value of the metric name (a counter or gauge
// without labels) the mount serves at addr; the test fails if it cannot be
// read.
func mountCounter(t *testing.T, addr, name string) float64 {
	t.Helper()
	cl := http.Client{Timeout: 10 * time.Second}
	resp, err := cl.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				t.Fatalf("metric %s: %v", name, err)
			}
			return f
		}
	}
	t.Fatalf("the mount serves no metric %s", name)
	return 0
}

// TestClientKilledDuringWrites kills the mount process with SIGKILL while a
// writer rewrites a file block by block with fsync after each: after a new
// mount, every block holds its old or its new content, and every block whose
// fsync returned holds the new.
func TestClientKilledDuringWrites(t *testing.T) {
	needRoot(t)
	c := up(t)
	const block, blocks = 1 << 20, 48
	p := filepath.Join(c.MountPoint, "victim")
	old := pattern(block*blocks, 1)
	if err := os.WriteFile(p, old, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	fresh := pattern(block*blocks, 2)
	var synced atomic.Int64 // blocks [0, synced) are durable with new content
	var werr error          // why the writer stopped, read after done
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < blocks; i++ {
			if _, werr = f.WriteAt(fresh[i*block:(i+1)*block], int64(i*block)); werr != nil {
				return
			}
			if werr = f.Sync(); werr != nil {
				return
			}
			synced.Store(int64(i + 1))
		}
	}()
	for synced.Load() < 6 {
		select {
		case <-done:
			t.Fatalf("the writer stopped after %d blocks, before the kill: %v", synced.Load(), werr)
		case <-time.After(5 * time.Millisecond):
		}
	}
	if err := syscall.Kill(c.Mount.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-done
	f.Close()
	durable := synced.Load()
	syscall.Unmount(c.MountPoint, syscall.MNT_DETACH)
	c.Mount = nil
	if err := c.MountFS(context.Background(), c.MountPoint, "128MiB"); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(old) {
		t.Fatalf("file is %d bytes after the crash, want %d", len(got), len(old))
	}
	for i := 0; i < blocks; i++ {
		g := got[i*block : (i+1)*block]
		isNew, isOld := bytes.Equal(g, fresh[i*block:(i+1)*block]), bytes.Equal(g, old[i*block:(i+1)*block])
		switch {
		case int64(i) < durable && !isNew:
			t.Fatalf("block %d was fsynced but does not hold the new content (old: %v)", i, isOld)
		case !isNew && !isOld:
			t.Fatalf("block %d holds neither the old nor the new content", i)
		}
	}
	t.Logf("%d of %d blocks fsynced before the kill; all blocks old or new", durable, blocks)
}

// TestRemount unmounts cleanly (SIGTERM to the mount) and mounts again:
// everything written is there.
func TestRemount(t *testing.T) {
	needRoot(t)
	c := up(t)
	files := map[string][]byte{}
	for i := 0; i < 10; i++ {
		name := filepath.Join(c.MountPoint, fmt.Sprintf("keep%d", i))
		files[name] = pattern(i*123457+1, uint64(i+100))
		if err := os.WriteFile(name, files[name], 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Unmount(); err != nil {
		t.Fatal(err)
	}
	if err := c.MountFS(context.Background(), c.MountPoint, "128MiB"); err != nil {
		t.Fatal(err)
	}
	for name, want := range files {
		got, err := os.ReadFile(name)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s after remount: %v (%d bytes, want %d)", name, err, len(got), len(want))
		}
	}
}
