package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/fs/fileio"
	"github.com/rdmafs/rdmafs/internal/devcluster"
	"github.com/rdmafs/rdmafs/internal/devcluster/clustertest"
	"github.com/rdmafs/rdmafs/meta/auth"
	"github.com/rdmafs/rdmafs/meta/client"
	"github.com/rdmafs/rdmafs/meta/metapb"
	"github.com/rdmafs/rdmafs/rdma/transport"
	"golang.org/x/sys/unix"
)

// repairCluster starts meta and n chunkd processes with short heartbeat and
// repair grace periods, without a mount: data goes through an in-process
// fileio engine (a fresh one per check, so nothing is served from a cache).
func repairCluster(t *testing.T, n int) *devcluster.Cluster {
	t.Helper()
	return clustertest.Start(t, devcluster.Config{Bin: binDir, Chunkservers: n, ChunkdMem: "64MiB",
		HeartbeatTimeout: 1500 * time.Millisecond,
		MetaArgs:         []string{"--repair-grace", "1s", "--repair-task-timeout", "20s"},
		ChunkdArgs:       []string{"--repair-mem", "16MiB"}}, clustertest.Options{})
}

// fsClient is an in-process file client: meta connection + fileio engine.
type fsClient struct {
	mc  *client.Client
	eng *fileio.Engine
}

func newFSClient(t *testing.T, c *devcluster.Cluster) *fsClient {
	t.Helper()
	secret, err := auth.ReadSecretFile(c.SecretFile)
	if err != nil {
		t.Fatal(err)
	}
	mc, err := c.Client()
	if err != nil {
		t.Fatal(err)
	}
	dev, err := transport.Open(c.Transport, nil)
	if err != nil {
		t.Fatal(err)
	}
	eng, err := fileio.New(fileio.Config{Meta: mc, Device: dev, Secret: []byte(secret), MemBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	fc := &fsClient{mc: mc, eng: eng}
	t.Cleanup(func() {
		eng.Close()
		dev.Close()
		mc.Close()
	})
	return fc
}

// write creates name in the root directory with data, flushed and committed.
func (fc *fsClient) write(ctx context.Context, name string, data []byte) (uint64, error) {
	r, err := fc.mc.Create(ctx, &metapb.CreateRequest{Caller: &metapb.Caller{}, Parent: 1, Name: name, Mode: 0o644, Exclusive: true})
	if err != nil {
		return 0, fmt.Errorf("create %s: %w", name, err)
	}
	ino := r.Attr.Ino
	if err := fc.eng.Open(ctx, ino); err != nil {
		return 0, err
	}
	for off := 0; off < len(data); {
		n := min(len(data)-off, 1<<20)
		if _, err := fc.eng.Write(ctx, ino, data[off:off+n], int64(off)); err != nil {
			return 0, fmt.Errorf("write %s at %d: %w", name, off, err)
		}
		off += n
	}
	if err := fc.eng.Flush(ctx, ino); err != nil {
		return 0, fmt.Errorf("flush %s: %w", name, err)
	}
	return ino, nil
}

// sum reads a whole file and returns its SHA-256.
func (fc *fsClient) sum(ctx context.Context, ino uint64, size int) ([32]byte, error) {
	if err := fc.eng.Open(ctx, ino); err != nil {
		return [32]byte{}, err
	}
	h := sha256.New()
	buf := make([]byte, 1<<20)
	for off := 0; off < size; {
		n, err := fc.eng.Read(ctx, ino, buf[:min(len(buf), size-off)], int64(off))
		if err != nil {
			return [32]byte{}, fmt.Errorf("read inode %d at %d: %w", ino, off, err)
		}
		if n == 0 {
			return [32]byte{}, fmt.Errorf("read inode %d: short at %d of %d", ino, off, size)
		}
		h.Write(buf[:n])
		off += n
	}
	var out [32]byte
	h.Sum(out[:0])
	return out, nil
}

type written struct {
	name string
	ino  uint64
	size int
	sum  [32]byte
}

// verifyAll reads every file with a fresh client and compares checksums; it
// returns the number of degraded stripe reads.
func verifyAll(t *testing.T, c *devcluster.Cluster, files []written) int64 {
	t.Helper()
	fc := newFSClient(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, f := range files {
		got, err := fc.sum(ctx, f.ino, f.size)
		if err != nil {
			t.Fatalf("%s: %v", f.name, err)
		}
		if got != f.sum {
			t.Fatalf("%s: %d bytes read back with a different checksum", f.name, f.size)
		}
	}
	return fc.eng.Stats().DegradedReads.Load()
}

func status(t *testing.T, mc *client.Client) *metapb.StatusReply {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := mc.Status(ctx, &metapb.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// waitHealthy waits until every stripe is healthy and nothing is queued, and
// returns the bytes rebuilt meanwhile and how long the repair work took (from
// the first moment work was queued or in flight).
func waitHealthy(t *testing.T, mc *client.Client, live int, timeout time.Duration) (uint64, time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	start := status(t, mc).GetRepair().GetBytesRebuilt()
	var began time.Time
	for {
		st := status(t, mc)
		r := st.GetRepair()
		if began.IsZero() && r.GetQueued()+r.GetInFlight() > 0 {
			began = time.Now()
		}
		up := st.ChunkserversUp()
		if up == live && r.GetDegradedStripes() == 0 && r.GetLostStripes() == 0 && r.GetQueued() == 0 && r.GetInFlight() == 0 &&
			r.GetHealthyStripes() == st.Stripes {
			if began.IsZero() {
				began = time.Now()
			}
			return r.GetBytesRebuilt() - start, time.Since(began)
		}
		if time.Now().After(deadline) {
			t.Fatalf("not healthy after %v: %d up, repair %+v", timeout, up, r)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func rdmafs(t *testing.T, args ...string) (string, error) {
	t.Helper()
	out, err := exec.Command(filepath.Join(binDir, "rdmafs"), args...).CombinedOutput()
	return string(out), err
}

// rdmafsOn runs `rdmafs args...` as a client of c: with its secret and TLS
// flags.
func rdmafsOn(t *testing.T, c *devcluster.Cluster, args ...string) (string, error) {
	t.Helper()
	return rdmafs(t, append(args, c.ClientArgs()...)...)
}

// TestRepairAfterLosingChunkservers writes files, kills two chunkservers
// with SIGKILL, checks degraded reads, lets repair rebuild their shards (on
// the four survivors plus two replacement chunkservers: a 4+2 stripe needs
// six distinct ones), kills two more and reads every byte back.
func TestRepairAfterLosingChunkservers(t *testing.T) {
	needRoot(t)
	c := repairCluster(t, 6)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	fc := newFSClient(t, c)
	var files []written
	big := 40 << 20
	if mb, err := strconv.Atoi(os.Getenv("RDMAFS_REPAIR_MB")); err == nil && mb > 0 {
		big = mb << 20 // a larger data set to measure repair throughput
	}
	for i, size := range []int{big, 5<<20 + 12345, 1000, 4 << 20} {
		data := pattern(size, uint64(100+i))
		name := fmt.Sprintf("f%d", i)
		ino, err := fc.write(ctx, name, data)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, written{name, ino, size, sha256.Sum256(data)})
	}
	mc := fc.mc
	if n := verifyAll(t, c, files); n != 0 {
		t.Fatalf("%d degraded reads with every chunkserver up", n)
	}

	for _, i := range []int{1, 4} {
		if err := c.KillChunkd(i); err != nil {
			t.Fatal(err)
		}
	}
	if n := verifyAll(t, c, files); n == 0 {
		t.Fatal("reads with two chunkservers killed were not degraded")
	}
	t.Logf("two chunkservers killed: every byte read back with degraded reads")

	// Two replacement chunkservers join; repair rebuilds onto all six.
	for _, i := range []int{6, 7} {
		p, err := c.StartChunkd(ctx, i, "64MiB")
		if err != nil {
			t.Fatal(err)
		}
		c.Chunk = append(c.Chunk, p)
	}
	bytes, took := waitHealthy(t, mc, 6, 90*time.Second)
	t.Logf("repair: %.1f MiB rebuilt in %v: %.1f MiB/s", float64(bytes)/(1<<20), took.Round(time.Millisecond),
		float64(bytes)/(1<<20)/took.Seconds())
	if bytes == 0 {
		t.Fatal("healthy, but nothing was rebuilt")
	}
	out, err := rdmafsOn(t, c, "admin", "repair", c.MetaAddr, "--wait", "--timeout", "30s")
	if err != nil || !strings.Contains(out, "full redundancy") {
		t.Fatalf("admin repair --wait: %v\n%s", err, out)
	}
	out, err = rdmafsOn(t, c, "status", c.MetaAddr)
	if err != nil || !strings.Contains(out, " 0 degraded, 0 lost") {
		t.Fatalf("status: %v\n%s", err, out)
	}
	st := status(t, mc)
	for _, cs := range st.Chunkservers {
		if !cs.Up && cs.Shards != 0 {
			t.Fatalf("down chunkserver %s still holds %d shards after repair", cs.Id, cs.Shards)
		}
	}

	for _, i := range []int{0, 2} {
		if err := c.KillChunkd(i); err != nil {
			t.Fatal(err)
		}
	}
	if n := verifyAll(t, c, files); n == 0 {
		t.Fatal("reads with four chunkservers killed were not degraded")
	}
	t.Logf("two more chunkservers killed: every byte read back")
	// Lost is what status must report once stripes can no longer be read:
	// kill a fifth and check that admin repair --wait fails with a clear message.
	if err := c.KillChunkd(3); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		out, err = rdmafsOn(t, c, "admin", "repair", c.MetaAddr, "--wait", "--timeout", "5s")
		if err != nil && strings.Contains(out, "stripes lost") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("admin repair --wait with three of six shards gone: %v\n%s", err, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestDrainUnderLoad adds a chunkserver and rebalances, then drains another
// one while writers and readers keep going: no byte is lost and the drained
// chunkserver ends with zero chunks.
func TestDrainUnderLoad(t *testing.T) {
	needRoot(t)
	c := repairCluster(t, 6)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	fc := newFSClient(t, c)
	var mu sync.Mutex
	var files []written
	for i := 0; i < 4; i++ {
		data := pattern(4<<20+i*4096, uint64(200+i))
		name := fmt.Sprintf("base%d", i)
		ino, err := fc.write(ctx, name, data)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, written{name, ino, len(data), sha256.Sum256(data)})
	}
	mc := fc.mc

	// A new chunkserver joins; rebalance moves shards onto it.
	p, err := c.StartChunkd(ctx, 6, "64MiB")
	if err != nil {
		t.Fatal(err)
	}
	c.Chunk = append(c.Chunk, p)
	if err := c.WaitUp(ctx, 7, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	out, err := rdmafsOn(t, c, "admin", "rebalance", c.MetaAddr, "--wait", "--timeout", "60s")
	if err != nil {
		t.Fatalf("admin rebalance: %v\n%s", err, out)
	}
	t.Logf("rebalance: %s", strings.SplitN(out, "\n", 2)[0])
	var newID, drainID string
	for _, cs := range status(t, mc).Chunkservers {
		switch cs.Address {
		case c.Chunk[6].Addr:
			newID = cs.Id
			if cs.Shards == 0 {
				t.Fatalf("rebalance moved nothing onto the new chunkserver %s", cs.Id)
			}
		case c.Chunk[0].Addr:
			drainID = cs.Id
		}
	}
	if newID == "" || drainID == "" {
		t.Fatal("chunkservers not found in status")
	}

	// Load: writers create files, readers verify what is written.
	const writers, readers = 2, 2
	var stop atomic.Bool
	var wg sync.WaitGroup
	var loadErr atomic.Value
	writes, reads := newProgress(), newProgress()
	fail := func(err error) {
		loadErr.CompareAndSwap(nil, err)
		writes.fail()
		reads.fail()
	}
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			wc := newFSClient(t, c)
			for i := 0; !stop.Load(); i++ {
				data := pattern(1<<20+w*4096+i*512, uint64(1000*w+i))
				name := fmt.Sprintf("load-%d-%d", w, i)
				ino, err := wc.write(ctx, name, data)
				if err != nil {
					fail(err)
					return
				}
				mu.Lock()
				files = append(files, written{name, ino, len(data), sha256.Sum256(data)})
				mu.Unlock()
				writes.step()
			}
		}()
	}
	for r := 0; r < readers; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rc := newFSClient(t, c)
			for i := 0; !stop.Load(); i++ {
				mu.Lock()
				f := files[(i*7+r)%len(files)]
				mu.Unlock()
				got, err := rc.sum(ctx, f.ino, f.size)
				if err != nil {
					fail(fmt.Errorf("%s: %w", f.name, err))
					return
				}
				if got != f.sum {
					fail(fmt.Errorf("%s read back with a different checksum", f.name))
					return
				}
				reads.step()
			}
		}()
	}
	stopLoad := func() {
		stop.Store(true)
		wg.Wait()
	}
	// The drain starts once the load runs: writes and reads acknowledged.
	if !writes.wait(writers, time.Minute) || !reads.wait(readers, time.Minute) {
		stopLoad()
		t.Fatalf("the load did not get going: %d writes, %d reads (error: %v)", writes.load(), reads.load(), loadErr.Load())
	}
	w0, r0 := writes.load(), reads.load()
	out, err = rdmafsOn(t, c, "admin", "drain", c.MetaAddr, drainID, "--wait", "--timeout", "60s")
	wDrain, rDrain := writes.load()-w0, reads.load()-r0
	stopLoad()
	if err != nil {
		t.Fatalf("admin drain --wait: %v\n%s", err, out)
	}
	if e := loadErr.Load(); e != nil {
		t.Fatalf("load during drain: %v", e)
	}
	// Every load goroutine was running when the drain began, kept starting
	// operations until it ended and finished the one in flight after the
	// stop: each overlapped the drain with an operation and acknowledged at
	// least one after the counts taken as the drain began. Fewer than one
	// per goroutine means the load stopped early.
	wAll, rAll := writes.load()-w0, reads.load()-r0
	t.Logf("drain under load: %d files written and %d verified while the drain ran, %d and %d up to the stop",
		wDrain, rDrain, wAll, rAll)
	if wAll < writers || rAll < readers {
		t.Fatalf("the load did not keep going during the drain: %d writes and %d reads acknowledged after it began, want at least %d and %d",
			wAll, rAll, writers, readers)
	}
	for _, cs := range status(t, mc).Chunkservers {
		if cs.Id == drainID && (cs.Shards != 0 || cs.ChunkCount != 0) {
			t.Fatalf("drained chunkserver holds %d shards, %d chunks", cs.Shards, cs.ChunkCount)
		}
	}
	// The drained chunkserver can go: every byte still reads back.
	if err := c.KillChunkd(0); err != nil {
		t.Fatal(err)
	}
	if n := verifyAll(t, c, files); n != 0 {
		t.Fatalf("%d degraded reads after the drained chunkserver stopped: it still held data", n)
	}
}

// TestLayoutCommand sets a directory's layout with `rdmafs layout set` on a
// mount, writes a file below it and reads it back: the file has the
// directory's layout (2+1, 64 KiB units), its bytes survive, and a file
// written before keeps the old layout.
func TestLayoutCommand(t *testing.T) {
	needRoot(t)
	c := up(t)
	dir := filepath.Join(c.MountPoint, "narrow")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	before := filepath.Join(c.MountPoint, "before")
	if err := os.WriteFile(before, pattern(1<<20, 3), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := rdmafs(t, "layout", "set", dir, "--ec", "2+1", "--unit", "64KiB")
	if err != nil || !strings.Contains(out, "ec 2+1, unit 64.0KiB") {
		t.Fatalf("layout set: %v\n%s", err, out)
	}
	data := pattern(3<<20+5, 4)
	f := filepath.Join(dir, "f")
	if err := os.WriteFile(f, data, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err = rdmafs(t, "layout", "get", f, before)
	if err != nil || !strings.Contains(out, f+": ec 2+1, unit 64.0KiB") || !strings.Contains(out, before+": ec 4+2") {
		t.Fatalf("layout get: %v\n%s", err, out)
	}
	// Read from the chunkservers, not the page cache the write filled.
	fh, err := os.Open(f)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Fadvise(int(fh.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(fh)
	fh.Close()
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back a 2+1 file: %v (equal %v)", err, bytes.Equal(got, data))
	}
	if out, err := rdmafs(t, "layout", "set", dir, "--ec", "0+1"); err == nil {
		t.Fatalf("layout set --ec 0+1 succeeded:\n%s", out)
	}
	// Wider than the cluster: refused, saying why it may be.
	if out, err := rdmafs(t, "layout", "set", dir, "--ec", "8+3"); err == nil || !strings.Contains(out, "fewer than 11 chunkservers") {
		t.Fatalf("layout set --ec 8+3 on a cluster of %d chunkservers: %v\n%s", len(c.Chunk), err, out)
	}
}
