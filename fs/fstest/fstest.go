// Package fstest starts a whole rdmafs for tests: a metadata server, chunkservers
// registered with it, the file I/O engine and a real FUSE mount, all on 127.0.0.1
// and all torn down (unmounted first) when the test ends.
package fstest

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rdmafs/rdmafs/chunkserver"
	"github.com/rdmafs/rdmafs/chunkserver/chunktest"
	"github.com/rdmafs/rdmafs/cmd/chunkd/metamember"
	"github.com/rdmafs/rdmafs/fs"
	"github.com/rdmafs/rdmafs/fs/fileio"
	"github.com/rdmafs/rdmafs/internal/stripe"
	"github.com/rdmafs/rdmafs/meta/metapb"
	"github.com/rdmafs/rdmafs/meta/metatest"
)

// Options configure a test cluster. Zero values: six chunkservers, EC 4+2 with
// 64 KiB units, 64 MiB of client buffer memory.
type Options struct {
	Chunkservers int
	Layout       stripe.Layout
	MemBytes     int
	// WrapMeta, when set, wraps the metadata client the first mount uses,
	// its file system and its data engine (to observe or alter its calls).
	WrapMeta func(metapb.MetaClient) metapb.MetaClient
	// DropBehind is fs.Options.DropBehind for every mount.
	DropBehind int64
	// FileDirtyLimit is fileio.Config.FileDirtyLimit (default: the engine's).
	FileDirtyLimit int
	// IOTimeout and WriteTimeout are fileio.Config's (default: the engine's).
	IOTimeout, WriteTimeout time.Duration
	// Wsync turns off creates and unlinks answered early (fs.Options.Early),
	// which mounts without WrapMeta use otherwise.
	Wsync bool
	// Linger, when set, is how long the mounts' calls behind wait for
	// another call to travel with (meta/client.Client.SetLinger).
	Linger time.Duration
	// ChunkConfig, when set, adjusts chunkserver i's configuration before it
	// starts (to advertise another address, say).
	ChunkConfig func(i int, cfg *chunkserver.Config)
	// Metrics and MetricsAddr are the first mount's fs.MountOptions.Metrics
	// and fs.Options.MetricsAddr.
	Metrics     prometheus.Registerer
	MetricsAddr string
	// EntryTimeout is fs.Options.EntryTimeout for every mount (default:
	// fs's).
	EntryTimeout time.Duration
}

// Cluster is a running test file system.
type Cluster struct {
	Meta   *metatest.Meta
	Chunk  []*chunktest.Server
	Engine *fileio.Engine
	// Dir is the mount point.
	Dir string

	opts Options
}

// Start brings up a cluster and mounts it. It skips the test where mounting is
// impossible (not root, no /dev/fuse).
func Start(t *testing.T, opts Options) *Cluster {
	t.Helper()
	NeedFUSE(t)
	if opts.Chunkservers == 0 {
		opts.Chunkservers = 6
	}
	if opts.Layout == (stripe.Layout{}) {
		opts.Layout = stripe.Layout{K: 4, M: 2, Unit: 64 << 10}
	}
	if opts.MemBytes == 0 {
		opts.MemBytes = 64 << 20
	}
	c := &Cluster{Meta: metatest.Start(t, metatest.Options{Layout: opts.Layout, HeartbeatTimeout: 2 * time.Second})}
	mc := c.Meta.Client(t)
	secret := []byte(c.Meta.Secret)
	for i := 0; i < opts.Chunkservers; i++ {
		cfg := chunkserver.Config{Membership: metamember.New(mc), HeartbeatInterval: 200 * time.Millisecond}
		if opts.ChunkConfig != nil {
			opts.ChunkConfig(i, &cfg)
		}
		c.Chunk = append(c.Chunk, chunktest.Start(t, chunktest.Options{Secret: secret, Config: cfg}))
	}
	c.WaitUp(t, opts.Chunkservers)
	c.opts = opts
	c.Dir, c.Engine = c.mount(t, opts.WrapMeta)
	return c
}

// Mount mounts the cluster's file system once more, as another client would,
// and returns the mount point and its engine; both go away with the test.
func (c *Cluster) Mount(t *testing.T) (string, *fileio.Engine) {
	t.Helper()
	return c.mount(t, nil)
}

func (c *Cluster) mount(t *testing.T, wrap func(metapb.MetaClient) metapb.MetaClient) (string, *fileio.Engine) {
	t.Helper()
	ctx := context.Background()
	mc := c.Meta.Client(t)
	if c.opts.Linger != 0 {
		mc.SetLinger(c.opts.Linger)
	}
	var fsMeta metapb.MetaClient = mc
	if wrap != nil {
		fsMeta = wrap(mc)
	}
	eng, err := fileio.New(fileio.Config{Meta: fsMeta, Device: chunktest.NewDevice(t), Secret: []byte(c.Meta.Secret), MemBytes: c.opts.MemBytes, FileDirtyLimit: c.opts.FileDirtyLimit,
		IOTimeout: c.opts.IOTimeout, WriteTimeout: c.opts.WriteTimeout})
	if err != nil {
		t.Fatal(err)
	}
	sess, err := mc.StartSession(ctx, "fstest", 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sess.Close(ctx)
		eng.Close()
	})
	opts := fs.Options{Meta: fsMeta, Session: sess.ID(), Data: eng, DropBehind: c.opts.DropBehind, EntryTimeout: c.opts.EntryTimeout}
	var mopts fs.MountOptions
	if c.Dir == "" { // the first mount
		opts.MetricsAddr, mopts.Metrics = c.opts.MetricsAddr, c.opts.Metrics
	}
	if wrap == nil && !c.opts.Wsync {
		opts.Early = sess // calls sent behind would bypass a wrapper
	}
	fsys, root := fs.New(opts)
	t.Cleanup(fsys.Close)
	dir := MountRootWith(t, root, mopts)
	// Tests that lean on directory leases get them from the first lookup.
	select {
	case <-fsys.LeasesReady():
	case <-time.After(10 * time.Second):
		t.Fatal("fstest: the mount heard nothing from meta's Recalls in 10s")
	}
	return dir, eng
}

// NeedFUSE skips t unless this process can mount FUSE file systems: it runs
// as root and /dev/fuse exists.
func NeedFUSE(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("no /dev/fuse")
	}
}

// MountRoot mounts the file system of root (from fs.New) at a new
// directory and returns it. The directory is not under t.TempDir, whose
// parent is private (mode 0700): tests run commands in it as other users.
// When the test ends it is unmounted, retried for up to 2s while busy, and
// removed; cleanups registered before MountRoot run after that.
func MountRoot(t testing.TB, root *fs.Node) string {
	t.Helper()
	return MountRootWith(t, root, fs.MountOptions{})
}

// MountRootWith is MountRoot with the mount's options.
func MountRootWith(t testing.TB, root *fs.Node, opts fs.MountOptions) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "rdmafs-mnt-")
	if err != nil {
		t.Fatalf("fstest: %v", err)
	}
	os.Chmod(dir, 0o755)
	t.Cleanup(func() { os.Remove(dir) })
	srv, err := fs.Mount(dir, root, opts)
	if err != nil {
		t.Fatalf("fstest: mount at %s: %v", dir, err)
	}
	t.Cleanup(func() {
		for i := 0; ; i++ {
			if err := srv.Unmount(); err == nil || i == 100 {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
	return dir
}

// WaitUp waits until n chunkservers are registered and up.
func (c *Cluster) WaitUp(t *testing.T, n int) {
	t.Helper()
	mc := c.Meta.Client(t)
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := mc.Status(context.Background(), &metapb.StatusRequest{})
		if err == nil && st.ChunkserversUp() >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("fstest: fewer than %d chunkservers up after 10s (%v)", n, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
