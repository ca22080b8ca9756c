package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/rdmafs/rdmafs/internal/devcluster"
	"github.com/rdmafs/rdmafs/internal/devcluster/clustertest"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// relayoutTree is the data TestRelayout converts: 16 files of 64 MiB.
const (
	relayoutFiles    = 16
	relayoutFileSize = 64 << 20
)

// TestRelayout converts a 1 GiB tree written in 1+2 to 4+2 and back while
// fio verify jobs and a writer checked against a model read and write files
// in it. Meta and a chunkd are killed -9 in the middle of the first
// conversion, which resumes and completes. Every run of fio ends without
// error, every read of the model's file returns what was written, every
// byte of the tree reads back equal after each conversion, and the space
// the chunkservers use is the new layout's.
func TestRelayout(t *testing.T) {
	needRoot(t)
	clustertest.Need(t, "fio")
	c := up(t)
	dir := filepath.Join(c.MountPoint, "tree")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := rdmafs(t, "layout", "set", dir, "--ec", "1+2", "--unit", "1MiB"); err != nil {
		t.Fatalf("layout set: %v\n%s", err, out)
	}
	sums := make([][32]byte, relayoutFiles)
	for i := range relayoutFiles {
		data := make([]byte, relayoutFileSize+i*4099) // the last stripe short
		rand.NewChaCha8([32]byte{byte(i), 100}).Read(data)
		sums[i] = sha256.Sum256(data)
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%02d", i)), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	checkTree := func(what string) {
		t.Helper()
		for i := range relayoutFiles {
			p := filepath.Join(dir, fmt.Sprintf("f%02d", i))
			if got := fileSum(t, p); got != sums[i] {
				t.Fatalf("%s: %s reads back different bytes", what, p)
			}
		}
	}
	mc, err := c.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer mc.Close()

	// Phase 1: to 4+2, with load, meta and a chunkd killed -9 meanwhile.
	load := startRelayoutLoad(t, dir)
	t.Logf("%v: tree written, load running, relayout to 4+2", time.Now().Format(time.StampMilli))
	if out, err := rdmafs(t, "relayout", dir, "--ec", "4+2"); err != nil || !strings.Contains(out, "converting to 4+2") {
		t.Fatalf("rdmafs relayout: %v\n%s", err, out)
	}
	total := relayoutProgress(t, dir).BytesLeft
	if total < relayoutFiles*relayoutFileSize {
		t.Fatalf("relayout reports %d bytes to convert, want at least %d", total, relayoutFiles*relayoutFileSize)
	}
	waitConverted(t, dir, total/4)
	t.Logf("%v: %d of %d bytes converted: meta killed", time.Now().Format(time.StampMilli), total-relayoutProgress(t, dir).BytesLeft, total)
	if err := c.KillMeta(0); err != nil {
		t.Fatal(err)
	}
	if err := c.RestartMeta(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	t.Logf("%v: meta restarted", time.Now().Format(time.StampMilli))
	left := relayoutProgress(t, dir).BytesLeft
	if left == 0 {
		t.Fatal("the conversion finished before meta was killed: the test proves nothing (make the tree bigger)")
	}
	waitConverted(t, dir, total-left+total/8)
	t.Logf("%v: %d of %d bytes converted: chunkd 2 killed", time.Now().Format(time.StampMilli), total-relayoutProgress(t, dir).BytesLeft, total)
	if err := c.KillChunkd(2); err != nil {
		t.Fatal(err)
	}
	if err := c.RestartChunkd(context.Background(), 2); err != nil {
		t.Fatal(err)
	}
	waitConverted(t, dir, ^uint64(0))
	t.Logf("%v: every stripe converted", time.Now().Format(time.StampMilli))
	load.stop(t)
	st := status(t, mc)
	t.Logf("to 4+2: %+v", st.GetRelayout())
	checkTree("after 1+2 -> 4+2")
	checkLayoutAndSpace(t, c, dir, 4, 2)

	// Phase 2: back to 1+2 with load, timed.
	load = startRelayoutLoad(t, dir)
	start := time.Now()
	out, err := rdmafs(t, "relayout", dir, "--ec", "1+2", "--wait")
	if err != nil || !strings.Contains(out, "every stripe converted") {
		t.Fatalf("rdmafs relayout --wait: %v\n%s", err, out)
	}
	took := time.Since(start)
	load.stop(t)
	t.Logf("4+2 -> 1+2 of %d MiB under load: %v (%.1f MiB/s)", total>>20, took.Round(time.Millisecond), float64(total)/(1<<20)/took.Seconds())
	checkTree("after 4+2 -> 1+2")
	checkLayoutAndSpace(t, c, dir, 1, 2)
}

// fileSum hashes a file read through the mount, its cached pages dropped
// first so that the bytes come from the chunkservers.
func fileSum(t *testing.T, p string) [32]byte {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatalf("read %s: %v", p, err)
	}
	var out [32]byte
	copy(out[:], h.Sum(nil))
	return out
}

// relayoutProgress reads what is left to convert below dir through the
// rdmafs.relayout attribute.
func relayoutProgress(t *testing.T, dir string) *metapb.RelayoutReply {
	t.Helper()
	b := make([]byte, 4096)
	n, err := unix.Getxattr(dir, "rdmafs.relayout", b)
	if err != nil {
		t.Fatalf("getxattr rdmafs.relayout: %v", err)
	}
	r := &metapb.RelayoutReply{}
	if err := protojson.Unmarshal(b[:n], r); err != nil {
		t.Fatalf("rdmafs.relayout %q: %v", b[:n], err)
	}
	return r
}

// waitConverted waits until at least done bytes below dir are converted
// (all of them for ^0), for at most three minutes.
func waitConverted(t *testing.T, dir string, done uint64) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		r := relayoutProgress(t, dir)
		if r.StripesLeft == 0 || r.BytesTotal-r.BytesLeft >= done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("relayout stalled: %+v", r)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// checkLayoutAndSpace checks that every file below dir has layout k+m and
// that, once the old layout's chunks are collected, the chunkservers hold
// (k+m)/k times the tree's bytes.
func checkLayoutAndSpace(t *testing.T, c *devcluster.Cluster, dir string, k, m int) {
	t.Helper()
	out, err := rdmafs(t, "info", "--json", filepath.Join(dir, "f00"), filepath.Join(dir, "fio.0.0"))
	if err != nil {
		t.Fatalf("rdmafs info: %v\n%s", err, out)
	}
	var infos infoJSON
	if err := json.Unmarshal([]byte(out), &infos); err != nil {
		t.Fatal(err)
	}
	for _, in := range infos {
		if in.Info.Layout.K != k || in.Info.Layout.M != m {
			t.Fatalf("%s: layout %d+%d, want %d+%d", in.Path, in.Info.Layout.K, in.Info.Layout.M, k, m)
		}
		for _, s := range in.Info.Stripes {
			if len(s.Shards) != k+m {
				t.Fatalf("%s stripe %s: %d shards, want %d", in.Path, s.Stripe, len(s.Shards), k+m)
			}
		}
	}
	want := float64(relayoutProgress(t, dir).BytesTotal) * float64(k+m) / float64(k)
	// The old layout's chunks go as the chunkservers heartbeat.
	mc, err := c.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer mc.Close()
	deadline := time.Now().Add(time.Minute)
	for status(t, mc).PendingDeletes > 0 {
		if time.Now().After(deadline) {
			st := status(t, mc)
			var per []string
			for _, cs := range st.Chunkservers {
				per = append(per, fmt.Sprintf("%s up=%v pending=%d", cs.Id, cs.Up, cs.PendingDeletes))
			}
			t.Fatalf("%d chunk deletes still pending after a minute: %s", st.PendingDeletes, strings.Join(per, "; "))
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Then the slots of deleted versions a chunkd keeps for reuse go once
	// idle (chunkd's KeepIdle). What stays beyond the data: each version's
	// header block and the empty slots each chunkd creates ahead (a few
	// percent here; the layouts differ by a factor of two).
	for {
		var stored int64
		for _, ch := range c.Chunk {
			stored += dirBytes(t, filepath.Join(ch.Data, "chunks"))
		}
		ratio := float64(stored) / want
		if ratio > 0.97 && ratio < 1.08 {
			t.Logf("%d+%d: chunkservers hold %d MiB for %.0f MiB expected (%.3f)", k, m, stored>>20, want/(1<<20), ratio)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d+%d: chunkservers hold %d bytes, want about %.0f (ratio %.3f)", k, m, stored, want, ratio)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// dirBytes sums the sizes of the files below dir.
func dirBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			if os.IsNotExist(err) {
				return nil // deleted meanwhile
			}
			return err
		}
		if d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// relayoutLoad is what runs against a tree while it is converted: fio
// verify jobs, over and over, and a writer whose every read is checked
// against a model of its file. Both run in child processes: a process that
// holds a file of the mount with unflushed data must not start the meta
// server, as the test does, since the new process's exec closes its copy of
// the descriptor, and that close flushes the data through the meta server
// it is about to become (NFS's close-to-open has the same shape).
type relayoutLoad struct {
	done       chan struct{}
	stopFile   string // the model writer stops once this file exists
	countFile  string // where the model writer counts its checked reads
	wg         sync.WaitGroup
	mu         sync.Mutex
	errs       []string
	fioRuns    int
	checks     string
	startCount int // the model writer's checked reads when the load was ready
}

func (l *relayoutLoad) fail(format string, args ...any) {
	l.mu.Lock()
	l.errs = append(l.errs, fmt.Sprintf(format, args...))
	l.mu.Unlock()
}

func (l *relayoutLoad) stopped() bool {
	select {
	case <-l.done:
		return true
	default:
		return false
	}
}

// startRelayoutLoad starts the load on dir and returns once the model
// writer has checked a read, so that what the caller starts next runs under
// the load.
func startRelayoutLoad(t *testing.T, dir string) *relayoutLoad {
	t.Helper()
	tmp := t.TempDir()
	l := &relayoutLoad{done: make(chan struct{}), stopFile: filepath.Join(tmp, "stop"), countFile: filepath.Join(tmp, "checks")}
	l.wg.Go(func() {
		for !l.stopped() {
			out, err := exec.Command("fio", "--name=fio", "--directory="+dir, "--rw=randwrite", "--bs=64k", "--size=16M", "--nrfiles=2",
				"--direct=1", "--ioengine=psync", "--verify=crc32c", "--verify_fatal=1", "--do_verify=1", "--verify_backlog=16", "--fsync=8").CombinedOutput()
			if err != nil || bytes.Contains(out, []byte("verify: bad")) || !bytes.Contains(out, []byte("err= 0")) {
				l.fail("fio: %v\n%s", err, clustertest.Tail(string(out), 2000))
				return
			}
			l.mu.Lock()
			l.fioRuns++
			l.mu.Unlock()
		}
	})
	l.wg.Go(func() {
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), childEnv+"=model "+filepath.Join(dir, "model")+" "+l.stopFile+" "+l.countFile)
		out, err := cmd.CombinedOutput()
		if err != nil {
			l.fail("model writer: %v\n%s", err, out)
			return
		}
		l.mu.Lock()
		l.checks = strings.TrimSpace(string(out))
		l.mu.Unlock()
	})
	deadline := time.Now().Add(2 * time.Minute)
	for l.startCount = readCount(l.countFile); l.startCount == 0; l.startCount = readCount(l.countFile) {
		l.mu.Lock()
		errs := l.errs
		l.mu.Unlock()
		if len(errs) > 0 || time.Now().After(deadline) {
			l.stop(t)
			t.Fatalf("the model writer checked no read in two minutes")
		}
		time.Sleep(50 * time.Millisecond)
	}
	return l
}

// writeCount records n in the file p, replacing it whole.
func writeCount(p string, n int) error {
	if err := os.WriteFile(p+".new", []byte(strconv.Itoa(n)), 0o644); err != nil {
		return err
	}
	return os.Rename(p+".new", p)
}

// readCount returns the count writeCount recorded in p, 0 if none yet.
func readCount(p string) int {
	b, err := os.ReadFile(p)
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(string(b))
	return n
}

// modelWriter writes random ranges of a 24 MiB file, syncs every few
// writes, and reads random aligned ranges back with O_DIRECT (so that they
// come from the chunkservers), each compared with the model and counted
// with checked, until stop; then it compares the whole file. It returns the
// reads checked.
func modelWriter(p string, stop func() bool, checked func(int) error) (int, error) {
	const size = 24 << 20
	model := pattern(size, 77)
	if err := os.WriteFile(p, model, 0o644); err != nil {
		return 0, err
	}
	w, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		return 0, err
	}
	defer w.Close()
	r := rand.New(rand.NewPCG(5, 6))
	rbuf, err := unix.Mmap(-1, 0, 1<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE) // aligned for O_DIRECT
	if err != nil {
		return 0, err
	}
	defer unix.Munmap(rbuf)
	checks := 0
	for i := 0; !stop(); i++ {
		n := 1 + r.IntN(200<<10)
		at := r.IntN(size - n)
		chunk := make([]byte, n)
		for j := range chunk {
			chunk[j] = byte(r.Uint32())
		}
		if _, err := w.WriteAt(chunk, int64(at)); err != nil {
			return checks, fmt.Errorf("write %d at %d: %w", n, at, err)
		}
		copy(model[at:], chunk)
		if i%4 != 3 {
			continue
		}
		if err := w.Sync(); err != nil {
			return checks, fmt.Errorf("fsync: %w", err)
		}
		fd, err := unix.Open(p, unix.O_RDONLY|unix.O_DIRECT, 0)
		if err != nil {
			return checks, fmt.Errorf("open O_DIRECT: %w", err)
		}
		ro := int64(r.IntN(size/4096-256)) * 4096
		got, err := unix.Pread(fd, rbuf, ro)
		unix.Close(fd)
		if err != nil || got != len(rbuf) || !bytes.Equal(rbuf, model[ro:ro+int64(len(rbuf))]) {
			return checks, fmt.Errorf("O_DIRECT read of %d at %d after %d checks: %d bytes, %v, equal %v", len(rbuf), ro, checks, got, err,
				got == len(rbuf) && bytes.Equal(rbuf, model[ro:ro+int64(len(rbuf))]))
		}
		checks++
		if err := checked(checks); err != nil {
			return checks, err
		}
	}
	if err := w.Sync(); err != nil {
		return checks, fmt.Errorf("fsync: %w", err)
	}
	got, err := os.ReadFile(p)
	if err != nil || !bytes.Equal(got, model) {
		return checks, fmt.Errorf("the whole file read back differs (%v)", err)
	}
	return checks, nil
}

// stop ends the load and fails the test if any of it failed.
func (l *relayoutLoad) stop(t *testing.T) {
	t.Helper()
	close(l.done)
	if err := os.WriteFile(l.stopFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	l.wg.Wait()
	if len(l.errs) > 0 {
		t.Fatalf("the load failed during the conversion:\n%s", strings.Join(l.errs, "\n"))
	}
	var checks int
	if _, err := fmt.Sscanf(l.checks, "checks %d", &checks); err != nil {
		t.Fatalf("model writer printed %q", l.checks)
	}
	if l.fioRuns == 0 || checks <= l.startCount {
		t.Fatalf("the load did nothing during the conversion: %d fio runs, model writer checked %d reads, %d of them before", l.fioRuns, checks, l.startCount)
	}
	t.Logf("load during the conversion: %d fio verify runs, model writer: %d reads checked (%d before the conversion)", l.fioRuns, checks, l.startCount)
}
