package fileio_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/rdmafs/rdmafs/chunkserver"
	"github.com/rdmafs/rdmafs/fs/fileio"
	"github.com/rdmafs/rdmafs/fs/fstest"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// countingMeta counts the stripe calls a mount makes.
type countingMeta struct {
	metapb.MetaClient
	grants, replaces, commits atomic.Int64
}

func (m *countingMeta) GrantWrite(ctx context.Context, in *metapb.GrantWriteRequest, opts ...grpc.CallOption) (*metapb.GrantWriteReply, error) {
	m.grants.Add(1)
	return m.MetaClient.GrantWrite(ctx, in, opts...)
}

func (m *countingMeta) ReplaceShards(ctx context.Context, in *metapb.ReplaceShardsRequest, opts ...grpc.CallOption) (*metapb.ReplaceShardsReply, error) {
	m.replaces.Add(1)
	return m.MetaClient.ReplaceShards(ctx, in, opts...)
}

func (m *countingMeta) CommitStripes(ctx context.Context, in *metapb.CommitStripesRequest, opts ...grpc.CallOption) (*metapb.CommitStripesReply, error) {
	m.commits.Add(1)
	return m.MetaClient.CommitStripes(ctx, in, opts...)
}

// writeSync writes data to a new file at p and fsyncs it.
func writeSync(p string, data []byte) error {
	f, err := os.Create(p)
	if err != nil {
		return err
	}
	_, werr := f.Write(data)
	serr := f.Sync()
	cerr := f.Close()
	return errors.Join(werr, serr, cerr)
}

func mustReadBack(t *testing.T, p string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("read %s: %v", p, err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s: read back %d bytes differing from the %d written", p, len(got), len(want))
	}
}

// degradedStripes returns the stripes meta counts as degraded or lost.
func degradedStripes(t *testing.T, c *fstest.Cluster) uint64 {
	t.Helper()
	st, err := c.Meta.Client(t).Status(context.Background(), &metapb.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return st.DegradedStripes
}

// TestWriteSurvivesChunkserverLoss writes with fsync while one, then m
// chunkservers of k+m+1 are gone: the first write finds a replacement for
// every shard (no stripe degraded), the second commits stripes degraded at
// min-write-shards, and every byte reads back. The stripe calls must stay
// proportional to the stripes written: no shard is rewritten over and over.
func TestWriteSurvivesChunkserverLoss(t *testing.T) {
	var cm *countingMeta
	c := fstest.Start(t, fstest.Options{Chunkservers: 7, WrapMeta: func(m metapb.MetaClient) metapb.MetaClient {
		cm = &countingMeta{MetaClient: m}
		return cm
	}})
	const size = 2 << 20 // 8 stripes of 4 x 64 KiB
	c.Chunk[0].Stop()
	one := random(size, 21)
	if err := writeSync(filepath.Join(c.Dir, "one-down"), one); err != nil {
		t.Fatalf("write with one chunkserver down: %v", err)
	}
	if n := c.Engine.Stats().DegradedWrites.Load(); n != 0 {
		t.Fatalf("%d stripes written degraded with a spare chunkserver up", n)
	}
	c.Chunk[1].Stop()
	two := random(size, 22)
	if err := writeSync(filepath.Join(c.Dir, "two-down"), two); err != nil {
		t.Fatalf("write with two chunkservers down: %v", err)
	}
	if n := c.Engine.Stats().DegradedWrites.Load(); n == 0 {
		t.Fatal("no stripe written degraded with only k+m-1 chunkservers up")
	}
	if n := degradedStripes(t, c); n == 0 {
		t.Fatal("meta records no degraded stripe")
	}
	mustReadBack(t, filepath.Join(c.Dir, "one-down"), one)
	mustReadBack(t, filepath.Join(c.Dir, "two-down"), two)
	const stripes = 2 * size / (4 * 64 << 10)
	g, r, cs := cm.grants.Load(), cm.replaces.Load(), cm.commits.Load()
	t.Logf("%d stripes: %d grants, %d replacements, %d commits", stripes, g, r, cs)
	if g == 0 || cs == 0 || g > 2*stripes || r > 4*stripes || cs > 2*stripes {
		t.Fatalf("%d stripes took %d grants, %d replacements, %d commits", stripes, g, r, cs)
	}
}

// TestWriteBelowMinWaitsThenEIO takes two of six chunkservers away from a
// 4+2 layout (min-write-shards 5): a write waits for them, at most the write
// timeout, then fsync fails with EIO — not a hang, not a connection error.
func TestWriteBelowMinWaitsThenEIO(t *testing.T) {
	const timeout = 2 * time.Second
	var cm *countingMeta
	c := fstest.Start(t, fstest.Options{WriteTimeout: timeout, WrapMeta: func(m metapb.MetaClient) metapb.MetaClient {
		cm = &countingMeta{MetaClient: m}
		return cm
	}})
	c.Chunk[2].Stop()
	c.Chunk[4].Stop()
	start := time.Now()
	err := writeSync(filepath.Join(c.Dir, "below-min"), random(1<<20, 23))
	took := time.Since(start)
	if !errors.Is(err, syscall.EIO) {
		t.Fatalf("write below min-write-shards: %v, want EIO", err)
	}
	if took < timeout || took > timeout+10*time.Second {
		t.Fatalf("EIO after %v, want about the write timeout %v", took, timeout)
	}
	t.Logf("EIO after %v (write timeout %v)", took, timeout)
	// The wait backs off: a few dozen calls, not a busy loop.
	if n := cm.grants.Load() + cm.replaces.Load(); n > 200 {
		t.Fatalf("%d grant and replace calls in %v", n, took)
	}
	// The mount is not wedged.
	if _, err := os.ReadDir(c.Dir); err != nil {
		t.Fatalf("readdir after the failed write: %v", err)
	}
}

// freezer is a TCP proxy in front of a chunkserver that can go silent: once
// frozen it accepts connections and keeps them open but forwards nothing,
// as a hung host or a partition does (nothing is refused or reset).
type freezer struct {
	ln      net.Listener
	backend atomic.Pointer[string]
	frozen  atomic.Bool
	mu      sync.Mutex
	conns   []net.Conn
}

func newFreezer(t *testing.T) *freezer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &freezer{ln: ln}
	t.Cleanup(f.close)
	go f.serve()
	return f
}

func (f *freezer) addr() string { return f.ln.Addr().String() }

func (f *freezer) serve() {
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		f.track(c)
		if f.frozen.Load() {
			continue // accepted, never answered
		}
		b := f.backend.Load()
		if b == nil {
			c.Close()
			continue
		}
		up, err := net.Dial("tcp", *b)
		if err != nil {
			c.Close()
			continue
		}
		f.track(up)
		go f.pipe(c, up)
		go f.pipe(up, c)
	}
}

func (f *freezer) track(c net.Conn) {
	f.mu.Lock()
	f.conns = append(f.conns, c)
	f.mu.Unlock()
}

// pipe copies src to dst until frozen: then the bytes read stay here.
func (f *freezer) pipe(dst, src net.Conn) {
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if f.frozen.Load() {
			io.Copy(io.Discard, src)
			return
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			dst.Close()
			return
		}
	}
}

func (f *freezer) close() {
	f.ln.Close()
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.conns {
		c.Close()
	}
}

// TestSilentChunkserver freezes one chunkserver (it neither answers nor
// refuses) and reads a file cold and writes another: both complete within a
// few seconds each, the read rebuilt from the other shards, the write placed
// elsewhere, instead of waiting for TCP's timeouts.
func TestSilentChunkserver(t *testing.T) {
	fz := newFreezer(t)
	c := fstest.Start(t, fstest.Options{Chunkservers: 7, IOTimeout: 2 * time.Second,
		ChunkConfig: func(i int, cfg *chunkserver.Config) {
			if i == 0 {
				cfg.AdvertiseAddr = fz.addr()
			}
		}})
	backend := c.Chunk[0].Addr()
	fz.backend.Store(&backend)
	data := random(4<<20, 24)
	p := filepath.Join(c.Dir, "before")
	if err := writeSync(p, data); err != nil {
		t.Fatal(err)
	}
	fz.frozen.Store(true)

	// A second mount reads cold: no connection yet, no cached lease.
	dir, eng := c.Mount(t)
	start := time.Now()
	mustReadBack(t, filepath.Join(dir, "before"), data)
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("cold read with a silent chunkserver took %v", took)
	} else {
		t.Logf("cold read: %v", took)
	}
	// 16 stripes over 7 chunkservers: the silent one holds data shards of
	// some (all but a one-in-a-million placement).
	if eng.Stats().DegradedReads.Load() == 0 {
		t.Fatal("no stripe was rebuilt: the reads did not meet the silent chunkserver")
	}
	// The first mount's connection is established: its requests go
	// unanswered until the stall timeout fails it.
	start = time.Now()
	mustReadBack(t, p, data)
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("read over a connection gone silent took %v", took)
	} else {
		t.Logf("read over a silent connection: %v", took)
	}
	if c.Engine.Stats().DegradedReads.Load() == 0 {
		t.Fatal("the first mount rebuilt no stripe: its reads did not meet the silent chunkserver")
	}
	after := random(4<<20, 25)
	start = time.Now()
	if err := writeSync(filepath.Join(dir, "after"), after); err != nil {
		t.Fatalf("write with a silent chunkserver: %v", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("write with a silent chunkserver took %v", took)
	} else {
		t.Logf("write: %v", took)
	}
	mustReadBack(t, filepath.Join(c.Dir, "after"), after)
}

// stallingMeta holds GetStripes calls, as a metadata service that is down
// would, until their context ends or release is closed.
type stallingMeta struct {
	metapb.MetaClient
	stall   atomic.Bool
	entered chan struct{} // receives a value when a call starts stalling
	release chan struct{}
}

func (m *stallingMeta) GetStripes(ctx context.Context, in *metapb.GetStripesRequest, opts ...grpc.CallOption) (*metapb.GetStripesReply, error) {
	if m.stall.Load() {
		select {
		case m.entered <- struct{}{}:
		default:
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-m.release:
		}
	}
	return m.MetaClient.GetStripes(ctx, in, opts...)
}

// TestKillReaderWaitingOnMeta: a read that waits on the metadata service
// (its stripe map is not cached and meta does not answer) ends when its
// process is killed, instead of keeping it unkillable until meta answers.
func TestKillReaderWaitingOnMeta(t *testing.T) {
	sm := &stallingMeta{entered: make(chan struct{}, 1), release: make(chan struct{})}
	c := fstest.Start(t, fstest.Options{WrapMeta: func(m metapb.MetaClient) metapb.MetaClient {
		sm.MetaClient = m
		return sm
	}})
	defer close(sm.release)
	p := filepath.Join(c.Dir, "f")
	if err := writeSync(p, random(1<<20, 26)); err != nil {
		t.Fatal(err)
	}
	sm.stall.Store(true)
	cmd := exec.Command("dd", "if="+p, "of=/dev/null", "bs=64k", "iflag=direct") // direct: the read waits in the request itself, not on a page lock
	if err := cmd.Start(); err != nil {
		t.Skip("no dd:", err)
	}
	select {
	case <-sm.entered:
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatal("the reader never reached the metadata service")
	}
	start := time.Now()
	cmd.Process.Signal(syscall.SIGKILL)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
		t.Logf("reader waiting on meta reaped %v after SIGKILL", time.Since(start))
	case <-time.After(3 * time.Second):
		t.Fatal("a reader waiting on the metadata service was not reaped 3s after SIGKILL")
	}
}

func TestMinIOTimeout(t *testing.T) {
	for _, tt := range []struct{ ceiling, want time.Duration }{
		{time.Second, time.Second},
		{3 * time.Second, 2 * time.Second},
		{10 * time.Second, 2 * time.Second},
		{30 * time.Second, 6 * time.Second},
	} {
		if got := fileio.MinIOTimeout(tt.ceiling); got != tt.want {
			t.Errorf("floor under %v: %v, want %v", tt.ceiling, got, tt.want)
		}
	}
}

// TestWriteFailureReportedToEveryOpen: a write-back that fails for good is
// reported once to every file description open when it failed, not only to
// the first that closes or syncs (a forked child's close, another open of
// the file): the writer's fsync fails too, as with Linux's errseq; a
// description opened after the failure, or one that reported it already,
// syncs cleanly.
func TestWriteFailureReportedToEveryOpen(t *testing.T) {
	c := fstest.Start(t, fstest.Options{WriteTimeout: time.Second})
	p := filepath.Join(c.Dir, "f")
	w, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	other, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	c.Chunk[2].Stop()
	c.Chunk[4].Stop() // below 4+2's min-write-shards: writes fail after the timeout
	if _, err := w.Write(random(1<<20, 5)); err != nil {
		t.Fatal(err)
	}
	if err := other.Sync(); !errors.Is(err, syscall.EIO) {
		t.Fatalf("fsync of another open: %v, want EIO", err)
	}
	if err := w.Sync(); !errors.Is(err, syscall.EIO) {
		t.Fatalf("fsync of the writer after another open met its failure: %v, want EIO", err)
	}
	if err := w.Sync(); err != nil {
		t.Fatalf("second fsync of the writer: %v, want the failure reported once", err)
	}
	late, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer late.Close()
	if err := late.Sync(); err != nil {
		t.Fatalf("fsync of an open made after the failure: %v", err)
	}
}
