package fault

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmafs/rdmafs/internal/devcluster/clustertest"
)

// fioWrite is a fio job writing and verifying (crc32c) a 16 MiB file with
// an fsync every 8 blocks; with verifyOnly it only reads it back (O_DIRECT)
// and verifies.
func fioWrite(name string, verifyOnly bool) []string {
	a := []string{"--name=" + name, "--filename=" + name, "--rw=write", "--bs=128k", "--size=16M", "--ioengine=psync",
		"--verify=crc32c", "--verify_fatal=1"}
	if verifyOnly {
		return append(a, "--verify_only", "--direct=1")
	}
	return append(a, "--fsync=8", "--end_fsync=1", "--do_verify=1")
}

// fioLoop runs fioWrite jobs one after the other until ctx ends, their
// calls' latencies and errors recorded; done collects the files written and
// verified.
func fioLoop(rec *recorder, dir string, done *[]string, mu *sync.Mutex) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		for i := 0; ctx.Err() == nil; i++ {
			name := fmt.Sprintf("fio%03d", i)
			rctx, cancel := context.WithTimeout(context.Background(), 3*hangBound)
			start := time.Now()
			jobs, out, err := runFio(rctx, dir, fioWrite(name, false)...)
			cancel()
			for _, j := range jobs {
				rec.note("fio-write", name, j.MaxWrite, nil)
				rec.note("fio-fsync", name, j.MaxSync, nil)
				rec.note("fio-read", name, j.MaxRead, nil)
			}
			if err != nil {
				var errno syscall.Errno
				for _, j := range jobs {
					if j.Error != 0 {
						errno = syscall.Errno(j.Error)
					}
				}
				rec.note("fio", name, time.Since(start), fmt.Errorf("%v: %w\n%s", err, errno, clustertest.Tail(out, 1500)))
				return err
			}
			mu.Lock()
			*done = append(*done, name)
			mu.Unlock()
		}
		return nil
	}
}

// verifyFio reads back (O_DIRECT) and verifies every file fio wrote.
func verifyFio(t *testing.T, rec *recorder, dir string, names []string) {
	t.Helper()
	for _, name := range names {
		ctx, cancel := context.WithTimeout(context.Background(), hangBound)
		start := time.Now()
		jobs, out, err := runFio(ctx, dir, fioWrite(name, true)...)
		cancel()
		rec.note("fio-verify", name, time.Since(start), nil)
		if err != nil {
			t.Fatalf("fio --verify_only %s: %v\n%s", name, err, clustertest.Tail(out, 2000))
		}
		if len(jobs) != 1 || jobs[0].ReadBytes != 16<<20 {
			t.Fatalf("fio --verify_only %s read %+v, want 16 MiB", name, jobs)
		}
	}
	t.Logf("fio: %d files of 16 MiB verified (crc32c) again with O_DIRECT reads", len(names))
}

// TestKillChunkservers: fio (write + crc32c verify, fsync every 8 blocks)
// and a Go write+fsync loop run while one chunkserver of seven is killed
// with SIGKILL, then a second one (m = 2 down: five left, min-write-shards
// is five), then both restart. No application call may fail or stall past
// stallBound; every acknowledged byte and every fio file reads back, and
// the cluster returns to full redundancy.
func TestKillChunkservers(t *testing.T) {
	needRoot(t)
	clustertest.Need(t, "fio")
	c := newCluster(t, opts{})
	s := newScene(t, c, 5*time.Minute)
	goDir, fioDir := filepath.Join(c.MountPoint, "go"), filepath.Join(c.MountPoint, "fio")
	s.mkdir(goDir)
	s.mkdir(fioDir)
	var fioMu sync.Mutex
	var fioFiles []string
	s.phase("all 7 chunkservers up")
	s.startLoad("writer", loadSpec{Kind: "writer", Dir: goDir, Name: "w", FileSize: 4 << 20, Chunk: 256 << 10, SyncEvery: 1 << 20, Seed: 1})
	s.goLoad("fio", fioLoop(s.rec, fioDir, &fioFiles, &fioMu))
	s.progress("load with every chunkserver up", 4<<20, time.Second, time.Minute)

	s.kill(1)
	s.phase("chunkd 1 killed (6 of 7 up)")
	s.progress("writes with one chunkserver killed", 8<<20, 5*time.Second, time.Minute)
	s.kill(4)
	s.phase("chunkd 1 and 4 killed (5 of 7 up)")
	s.progress("writes with two chunkservers killed", 8<<20, 5*time.Second, time.Minute)
	// Degraded reads of everything acknowledged so far, past the page cache.
	s.verify()

	s.phase("chunkd 1 and 4 restarted")
	s.restart(7, 1, 4)
	s.progress("writes after the restart", 8<<20, 3*time.Second, time.Minute)
	s.stopLoad()
	s.phase("verify")
	waitRedundancy(t, c, 7, 90*time.Second)
	s.verify()
	fioMu.Lock()
	verifyFio(t, s.rec, fioDir, fioFiles)
	fioMu.Unlock()
	if len(fioFiles) == 0 {
		t.Error("fio completed no job")
	}
	s.rec.check(t, stallBound)
}

// TestWritesBelowMinimum: six chunkservers, EC 4+2, min-write-shards 5.
// With one killed a write succeeds degraded; with two killed a write
// waits, then fails with EIO within the write timeout (not before it, not
// much after), while acknowledged data still reads (k = 4 shards left). A
// process blocked in such a write dies at once of SIGKILL. After the two
// return, writes succeed again and redundancy is restored.
func TestWritesBelowMinimum(t *testing.T) {
	needRoot(t)
	c := newCluster(t, opts{chunkservers: 6})
	s := newScene(t, c, 4*time.Minute)
	w := &writer{rec: s.rec, led: s.led, dir: c.MountPoint, fileSize: 4 << 20, chunk: 1 << 20, syncEvery: 1 << 20, seed: 2}
	var table []string
	write := func(name string) (time.Duration, error) {
		start := time.Now()
		err := s.guard("write "+name, func() error {
			return w.file(s.ctx, filepath.Join(c.MountPoint, name), uint64(len(name))*7+uint64(start.UnixNano()%1000))
		})
		return time.Since(start), err
	}
	s.phase("6 of 6 up")
	if took, err := write("base"); err != nil {
		t.Fatalf("write with every chunkserver up: %v", err)
	} else {
		table = append(table, fmt.Sprintf("0 of 6 down: 4 MiB write+fsync ok in %v", took.Round(time.Millisecond)))
	}

	s.kill(0)
	s.phase("chunkd 0 killed (5 of 6 up = min-write-shards)")
	took, err := write("one-down")
	if err != nil {
		t.Fatalf("write with one of six chunkservers killed (5 = min-write-shards left) failed after %v: %v", took, err)
	}
	table = append(table, fmt.Sprintf("1 of 6 down: 4 MiB write+fsync ok in %v (degraded)", took.Round(time.Millisecond)))

	s.kill(1)
	s.phase("chunkd 0 and 1 killed (4 of 6 up < min-write-shards)")
	took, err = write("two-down")
	var en syscall.Errno
	switch {
	case err == nil:
		t.Errorf("a write with 4 of 6 chunkservers (below min-write-shards 5) succeeded in %v", took)
	case !errors.As(err, &en) || en != syscall.EIO:
		t.Errorf("a write below min-write-shards failed after %v with %v, want EIO", took, err)
	case took < writeTimeout-500*time.Millisecond || took > writeTimeout+10*time.Second:
		t.Errorf("a write below min-write-shards failed with EIO after %v, want between the write timeout %v and %v",
			took.Round(time.Millisecond), writeTimeout, writeTimeout+10*time.Second)
	}
	table = append(table, fmt.Sprintf("2 of 6 down: %v after %v", err, took.Round(time.Millisecond)))

	// What was acknowledged reads with four shards of six.
	for _, a := range s.led.all() {
		var sum [32]byte
		err := s.guard("read "+a.path, func() (err error) {
			sum, err = readSum(s.rec, a.path, a.size, true)
			return err
		})
		if err != nil || sum != a.sum {
			t.Fatalf("reading %s with 4 of 6 chunkservers: %v (checksum ok: %v)", a.path, err, sum == a.sum)
		}
	}

	// A process blocked in a write below the minimum dies of SIGKILL.
	reaped, blocked := killBlockedWriter(t, filepath.Join(c.MountPoint, "child"))
	table = append(table, fmt.Sprintf("2 of 6 down: a writer blocked %v in write/fsync reaped %v after SIGKILL",
		blocked.Round(time.Millisecond), reaped.Round(time.Millisecond)))
	if reaped > 3*time.Second {
		t.Errorf("a process blocked in a write took %v to die of SIGKILL", reaped)
	}

	s.phase("chunkd 0 and 1 restarted")
	s.restart(6, 0, 1)
	took, err = write("after")
	if err != nil {
		t.Errorf("write after the chunkservers returned failed after %v: %v", took, err)
		table = append(table, fmt.Sprintf("restarted: 4 MiB write+fsync: %v after %v", err, took.Round(time.Millisecond)))
	} else {
		table = append(table, fmt.Sprintf("restarted: 4 MiB write+fsync ok in %v", took.Round(time.Millisecond)))
	}
	s.phase("verify")
	waitRedundancy(t, c, 6, 90*time.Second)
	s.verify()
	t.Logf("what a write does, by chunkservers down (EC 4+2, 6 chunkservers, --write-timeout %v):\n  %s", writeTimeout, strings.Join(table, "\n  "))
	// The write that fails with EIO waits the write timeout; a call that
	// succeeds may not stall past stallBound.
	s.rec.check(t, writeTimeout+10*time.Second, syscall.EIO)
	if d, what := s.rec.maxOKStall(); d > stallBound {
		t.Errorf("a call that succeeded stalled %v (> %v): %s", d.Round(time.Millisecond), stallBound, what)
	}
}

// killBlockedWriter starts a child process writing 8 MiB to path and
// fsyncing, lets it block for 2 s, kills it with SIGKILL and returns how long
// it took to be reaped and how long it had been blocked. The child must
// still be blocked when killed.
func killBlockedWriter(t *testing.T, path string) (reaped, blocked time.Duration) {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), childEnv+fmt.Sprintf("=write %s %d", path, 8<<20))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 4)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	select {
	case l := <-lines:
		if l != "start" {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("child said %q", l)
		}
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatal("child did not start")
	}
	start := time.Now()
	select {
	case l := <-lines:
		cmd.Wait()
		t.Fatalf("the child's write below min-write-shards ended (%q) after %v: it should still wait", l, time.Since(start))
	case <-time.After(2 * time.Second):
	}
	state := procState(cmd.Process.Pid)
	blocked = time.Since(start)
	killed := time.Now()
	cmd.Process.Signal(syscall.SIGKILL)
	done := make(chan struct{})
	go func() {
		for range lines {
		}
		cmd.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(hangBound):
		t.Fatalf("a child blocked in a write (state %s) was not reaped %v after SIGKILL", state, hangBound)
	}
	t.Logf("child blocked in write/fsync (state %s) reaped %v after SIGKILL", state, time.Since(killed).Round(time.Millisecond))
	return time.Since(killed), blocked
}

// procState is a process's state and kernel wait channel, e.g. "S fuse_...".
func procState(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	st := "?"
	if i := strings.LastIndexByte(string(b), ')'); i > 0 && i+2 < len(b) {
		st = string(b[i+2])
	}
	wchan, _ := os.ReadFile(fmt.Sprintf("/proc/%d/wchan", pid))
	return st + " " + string(wchan)
}

// TestDisksFill: seven chunkservers with a 64 MiB tmpfs each. Writing a
// file bigger than the cluster fails with ENOSPC (from write, fsync or
// close) within seconds; after rm the mount's statfs shows the space back
// and a new file writes; acknowledged data stays intact and redundancy full.
func TestDisksFill(t *testing.T) {
	needRoot(t)
	c := newCluster(t, opts{disk: "64MiB"})
	s := newScene(t, c, 4*time.Minute)
	w := &writer{rec: s.rec, led: s.led, dir: c.MountPoint, fileSize: 4 << 20, chunk: 1 << 20, syncEvery: 4 << 20, seed: 3}
	s.phase("disks with room")
	if err := s.guard("write keep", func() error { return w.file(s.ctx, filepath.Join(c.MountPoint, "keep"), 33) }); err != nil {
		t.Fatalf("writing a 4 MiB file: %v", err)
	}
	avail0 := s.statfs(c.MountPoint)
	t.Logf("statfs: %.1f MiB available", float64(avail0)/(1<<20))

	s.phase("filling the disks")
	big := filepath.Join(c.MountPoint, "big")
	start := time.Now()
	var wrote int64
	ferr := s.guard("fill", func() (err error) {
		wrote, err = fill(s.rec, big, 2<<30)
		return err
	})
	var en syscall.Errno
	if ferr == nil {
		t.Fatalf("wrote %d MiB (more than the cluster holds) without ENOSPC", wrote>>20)
	}
	if !errors.As(ferr, &en) || en != syscall.ENOSPC {
		t.Fatalf("filling the disks: %v after %d MiB, want ENOSPC", ferr, wrote>>20)
	}
	t.Logf("ENOSPC after %d MiB in %v: %v", wrote>>20, time.Since(start).Round(time.Millisecond), ferr)
	if d, what := s.rec.maxStall(); d > stallBound {
		t.Errorf("a call stalled %v while the disks filled: %s", d.Round(time.Millisecond), what)
	}

	s.phase("rm")
	if err := s.guard("rm", func() error { return s.rec.do("unlink", big, func() error { return os.Remove(big) }) }); err != nil {
		t.Fatalf("rm: %v", err)
	}
	freed := time.Now()
	var avail uint64
	s.waitFor("statfs to show the space back", 30*time.Second, func() bool {
		avail = s.statfs(c.MountPoint)
		return avail >= avail0*85/100
	}, syscall.ENOSPC)
	t.Logf("statfs: %.1f MiB available %v after rm (%.1f before the fill)", float64(avail)/(1<<20),
		time.Since(freed).Round(time.Millisecond), float64(avail0)/(1<<20))

	s.phase("writing after rm")
	w.fileSize, w.syncEvery = 32<<20, 8<<20
	if err := s.guard("write after", func() error { return w.file(s.ctx, filepath.Join(c.MountPoint, "after"), 34) }); err != nil {
		t.Fatalf("writing 32 MiB after rm: %v", err)
	}
	s.phase("verify")
	s.verify()
	waitRedundancy(t, c, 7, 60*time.Second)
	s.rec.check(t, stallBound, syscall.ENOSPC)
}

// statfs returns the bytes available on the mount (recorded as a call).
func (s *scene) statfs(dir string) uint64 {
	s.t.Helper()
	var st unix.Statfs_t
	if err := s.guard("statfs", func() error { return s.rec.do("statfs", dir, func() error { return unix.Statfs(dir, &st) }) }); err != nil {
		s.t.Fatalf("statfs: %v", err)
	}
	return st.Bavail * uint64(st.Bsize)
}

// fill writes path in 1 MiB calls with an fsync every 16 MiB until a call
// fails or limit bytes are written; it returns the bytes written and the
// first error (of write, fsync or close).
func fill(rec *recorder, path string, limit int64) (int64, error) {
	var f *os.File
	if err := rec.do("create", path, func() (err error) {
		f, err = os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		return err
	}); err != nil {
		return 0, err
	}
	buf := make([]byte, 1<<20)
	pattern(buf, 77, 0)
	var off int64
	var err error
	for off < limit && err == nil {
		err = rec.do("write", path, func() error {
			_, err := f.WriteAt(buf, off)
			return err
		})
		if err == nil {
			off += int64(len(buf))
			if off%(16<<20) == 0 {
				err = rec.do("fsync", path, f.Sync)
			}
		}
	}
	if err == nil {
		err = rec.do("fsync", path, f.Sync)
	}
	if cerr := rec.do("close", path, f.Close); err == nil {
		err = cerr
	}
	return off, err
}

// TestMetaRestart: the meta server (bbolt) is killed with SIGKILL and
// restarted 1.5 s later, twice, while four workers create, write, fsync,
// close and rename files through the mount. No application call may fail
// (no ENOSPC, no EIO) or stall past stallBound, the mount keeps working
// afterwards, and every acknowledged file reads back.
func TestMetaRestart(t *testing.T) {
	needRoot(t)
	c := newCluster(t, opts{})
	s := newScene(t, c, 4*time.Minute)
	for wk := 0; wk < 4; wk++ {
		dir := filepath.Join(c.MountPoint, fmt.Sprintf("m%d", wk))
		s.mkdir(dir)
		s.startLoad(fmt.Sprintf("worker%d", wk), loadSpec{Kind: "meta", Dir: dir, Name: "f", Seed: uint64(wk)})
	}
	files := func() int64 { return s.led.count.Load() }
	s.phase("meta up")
	base := files()
	s.waitFor("files created", time.Minute, func() bool { return files() >= base+20 })
	for cycle := 1; cycle <= 2; cycle++ {
		s.phase("meta killed (cycle %d)", cycle)
		if err := c.KillMeta(0); err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		if err := sleepCtx(s.ctx, 1500*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		s.phase("meta restarted (cycle %d)", cycle)
		if err := c.RestartMeta(s.ctx, 0); err != nil {
			t.Fatal(err)
		}
		t.Logf("meta down for %v", time.Since(killed).Round(time.Millisecond))
		base := files()
		s.waitFor("files created after the restart", time.Minute, func() bool { return files() >= base+30 })
	}
	s.stopLoad()
	// The mount is not wedged: a new file writes and reads back.
	s.phase("after the restarts")
	w := &writer{rec: s.rec, led: s.led, dir: c.MountPoint, fileSize: 4 << 20, chunk: 1 << 20, syncEvery: 4 << 20, seed: 4}
	if err := s.guard("write after", func() error { return w.file(s.ctx, filepath.Join(c.MountPoint, "after"), 44) }); err != nil {
		t.Fatalf("a write after the meta restarts: %v", err)
	}
	s.verify()
	waitRedundancy(t, c, 7, 60*time.Second)
	s.rec.check(t, stallBound)
}

// metaWorker creates files of 16-144 KiB: create, write, fsync, close, and
// a rename of every third; the ledger has each under its final name.
func metaWorker(rec *recorder, led *ledger, dir, name string, seed uint64, onErr func(error) bool) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		for i := 0; ctx.Err() == nil; i++ {
			if err := metaFile(rec, led, filepath.Join(dir, fmt.Sprintf("%s%05d", name, i)), seed, i); err != nil {
				if onErr == nil || !onErr(err) {
					return err
				}
			}
		}
		return nil
	}
}

// metaFile is one file of metaWorker.
func metaFile(rec *recorder, led *ledger, path string, seed uint64, i int) error {
	data := make([]byte, 16<<10+(i*37%9)*(16<<10))
	pattern(data, seed<<32|uint64(i), 0)
	var f *os.File
	if err := rec.do("create", path, func() (err error) {
		f, err = os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		return err
	}); err != nil {
		return err
	}
	err := rec.do("write", path, func() error { _, err := f.Write(data); return err })
	if err == nil {
		err = rec.do("fsync", path, f.Sync)
	}
	if err != nil {
		f.Close()
		return err
	}
	led.ack(path, data, false)
	if err := rec.do("close", path, f.Close); err != nil {
		return err
	}
	final := path
	if i%3 == 0 {
		final = path + ".r"
		if err := rec.do("rename", path, func() error { return os.Rename(path, final) }); err != nil {
			return err
		}
		led.forget(path)
	}
	led.ack(final, data, true)
	return nil
}
