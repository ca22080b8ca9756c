package fileio_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/rdmafs/rdmafs/fs/fstest"
	"github.com/rdmafs/rdmafs/internal/stripe"
	"github.com/rdmafs/rdmafs/meta/metaerr"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// inlineLayout keeps files up to 16 KiB in metadata.
var inlineLayout = stripe.Layout{K: 4, M: 2, Unit: 64 << 10, Inline: 16 << 10}

// TestInlineSmallFiles writes many small files: each waits in slabs (no
// registered buffer), commits into metadata (no chunkserver stores a
// version) and reads back, from this mount and from another, byte for byte.
func TestInlineSmallFiles(t *testing.T) {
	c := fstest.Start(t, fstest.Options{Layout: inlineLayout})
	other, _ := c.Mount(t)
	sizes := []int{1, 100, 4095, 4096, 4097, 10000, 16 << 10}
	before, sparse := c.Engine.Stats().InlineCommits.Load(), c.Engine.Stats().SparseStripes.Load()
	for i := 0; i < 60; i++ {
		n := sizes[i%len(sizes)]
		data := random(n, uint64(i))
		name := filepath.Join("d", "f"+string(rune('a'+i%26))+string(rune('a'+i/26)))
		if i == 0 {
			if err := os.Mkdir(filepath.Join(c.Dir, "d"), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(c.Dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
		readsBack(t, name, data, c.Dir, other)
	}
	if got := c.Engine.Stats().InlineCommits.Load() - before; got != 60 {
		t.Errorf("%d inline commits for 60 small files, want 60", got)
	}
	// Their data waited in slabs, not in whole-stripe registered buffers.
	if got := c.Engine.Stats().SparseStripes.Load() - sparse; got != 60 {
		t.Errorf("%d of 60 small files were buffered sparse, want all", got)
	}
	for i, cs := range c.Chunk {
		if v := cs.Stats().Versions; v != 0 {
			t.Errorf("chunkserver %d holds %d chunk versions after only small files were written", i, v)
		}
	}
}

// TestInlineModel runs random writes, truncates and reopens on files that
// cross the inline size both ways (inline → shards → truncated small →
// inline again) and checks every byte against a model after each close,
// from a second mount too. Rewrites of an inline file send only what
// changed (StripeCommit.patch), over bytes cut and grown by truncates.
func TestInlineModel(t *testing.T) {
	c := fstest.Start(t, fstest.Options{Layout: inlineLayout})
	other, _ := c.Mount(t)
	r := rand.New(rand.NewPCG(7, 8))
	patched := c.Engine.Stats().InlinePatched.Load()
	for file := 0; file < 4; file++ {
		name := "m" + string(rune('0'+file))
		p := filepath.Join(c.Dir, name)
		var model []byte
		for step := 0; step < 40; step++ {
			f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			switch op := r.IntN(10); {
			case op < 6: // a write, mostly small, sometimes past the inline size
				limit := 20 << 10
				if r.IntN(4) == 0 {
					limit = 400 << 10
				}
				off := r.IntN(limit)
				b := random(1+r.IntN(8<<10), r.Uint64())
				if _, err := f.WriteAt(b, int64(off)); err != nil {
					t.Fatal(err)
				}
				if end := off + len(b); end > len(model) {
					model = append(model, make([]byte, end-len(model))...)
				}
				copy(model[off:], b)
			case op < 9: // truncate, down or up
				n := r.IntN(24 << 10)
				if err := f.Truncate(int64(n)); err != nil {
					t.Fatal(err)
				}
				if n < len(model) {
					model = model[:n]
				} else {
					model = append(model, make([]byte, n-len(model))...)
				}
			default: // overwrite in place within the first bytes
				if len(model) == 0 {
					break
				}
				off := r.IntN(len(model))
				b := random(1+r.IntN(min(512, len(model)-off)), r.Uint64())
				if _, err := f.WriteAt(b, int64(off)); err != nil {
					t.Fatal(err)
				}
				copy(model[off:], b)
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
			readsBack(t, name, model, c.Dir, other)
		}
	}
	// Rewrites of an inline file send only what changed.
	if n := c.Engine.Stats().InlinePatched.Load() - patched; n == 0 {
		t.Error("no inline commit was patched")
	}
}

// holdingMeta holds inline commits until release is closed, telling
// entered when one starts.
type holdingMeta struct {
	metapb.MetaClient
	entered chan struct{}
	release chan struct{}
}

func (m *holdingMeta) CommitStripes(ctx context.Context, in *metapb.CommitStripesRequest, opts ...grpc.CallOption) (*metapb.CommitStripesReply, error) {
	if len(in.Stripes) == 1 && in.Stripes[0].Inline {
		select {
		case m.entered <- struct{}{}:
		default:
		}
		<-m.release
	}
	return m.MetaClient.CommitStripes(ctx, in, opts...)
}

// TestReadDuringInlineCommit reads a small file while its data is being
// committed into metadata straight from the slabs its writes wait in (in
// 4 MiB stripes a small file's writes, short of a quarter stripe, never
// take a registered buffer): the read takes the bytes from the slabs; it
// dereferenced the missing buffer, a panic under the file's lock. The
// engine is called directly: the panic would leave the kernel's requests
// of the file waiting forever.
func TestReadDuringInlineCommit(t *testing.T) {
	hm := &holdingMeta{entered: make(chan struct{}, 1), release: make(chan struct{})}
	c := fstest.Start(t, fstest.Options{Layout: stripe.Layout{K: 4, M: 2, Unit: 1 << 20, Inline: 16 << 10},
		WrapMeta: func(m metapb.MetaClient) metapb.MetaClient {
			hm.MetaClient = m
			return hm
		}})
	released := false
	defer func() {
		if !released {
			close(hm.release)
		}
	}()
	p := filepath.Join(c.Dir, "f")
	if err := os.WriteFile(p, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	data := random(5000, 31)
	if _, err := c.Engine.Write(ctx, st.Ino, data, 3000); err != nil {
		t.Fatal(err)
	}
	want := append(make([]byte, 3000), data...)
	flushed := make(chan error, 1)
	go func() { flushed <- c.Engine.Flush(ctx, st.Ino) }()
	select {
	case <-hm.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the flush sent no inline commit in 30s")
	}
	read := func(what string) {
		t.Helper()
		got := make([]byte, 16<<10)
		n, err := func() (n int, err error) {
			defer func() {
				if r := recover(); r != nil {
					err = fmt.Errorf("panic: %v", r)
				}
			}()
			return c.Engine.Read(ctx, st.Ino, got, 0)
		}()
		if err != nil || !bytes.Equal(got[:n], want) {
			t.Fatalf("read %s: %d bytes, %v; want %d equal", what, n, err, len(want))
		}
	}
	read("during the inline commit")
	close(hm.release)
	released = true
	if err := <-flushed; err != nil {
		t.Fatal(err)
	}
	read("after it")
	if n := c.Engine.Stats().InlineCommits.Load(); n != 1 {
		t.Errorf("%d inline commits, want 1", n)
	}
}

// readsBack checks that name reads as want in each of the mount points.
func readsBack(t *testing.T, name string, want []byte, mounts ...string) {
	t.Helper()
	for _, dir := range mounts {
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%s read %d bytes from %s, want %d; they differ", name, len(got), dir, len(want))
		}
	}
}

// TestForgottenFilesDropped: the engine keeps no state of files the kernel
// forgot (dropped from its inode cache) once their data is committed, and
// they read back whole when looked up again.
func TestForgottenFilesDropped(t *testing.T) {
	c := fstest.Start(t, fstest.Options{Layout: inlineLayout})
	dir := filepath.Join(c.Dir, "d")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	const n = 300
	want := map[string][]byte{}
	for i := range n {
		size := 100 + i*37
		if i%100 == 0 {
			size = 1 << 20 // past the inline size: shards
		}
		name := filepath.Join(dir, "f"+strconv.Itoa(i))
		want[name] = random(size, uint64(i))
		if err := os.WriteFile(name, want[name], 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if got := c.Engine.Files(); got < n {
		t.Fatalf("the engine knows %d files after %d were written", got, n)
	}
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("2"), 0); err != nil {
		t.Skipf("cannot make the kernel forget inodes: %v", err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for c.Engine.Files() > n/10 {
		if time.Now().After(deadline) {
			t.Fatalf("the engine still knows %d of %d files the kernel forgot", c.Engine.Files(), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for name, data := range want {
		got, err := os.ReadFile(name)
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("%s read back after the engine forgot it: %d bytes, %v; want %d", name, len(got), err, len(data))
		}
	}
}

// TestFlushOfRemovedFile: a flush of a file removed at meta meanwhile (its
// last close released, then unlinked, before the data got there) fails, as
// EIO to an application, and says the file was removed: nothing is lost.
func TestFlushOfRemovedFile(t *testing.T) {
	c := fstest.Start(t, fstest.Options{Layout: inlineLayout})
	ctx := context.Background()
	mc := c.Meta.Client(t)
	r, err := mc.Create(ctx, &metapb.CreateRequest{Parent: 1, Name: "gone", Mode: 0o644})
	if err != nil {
		t.Fatal(err)
	}
	ino := r.Attr.Ino
	if err := c.Engine.Open(ctx, ino); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Engine.Write(ctx, ino, []byte("written, then removed"), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := mc.Unlink(ctx, &metapb.UnlinkRequest{Parent: 1, Name: "gone"}); err != nil {
		t.Fatal(err)
	}
	err = c.Engine.Flush(ctx, ino)
	var removed interface{ Removed() bool }
	if !errors.As(err, &removed) || !removed.Removed() || !errors.Is(err, syscall.EIO) {
		t.Fatalf("flush of a removed file: %v, want EIO that says the file was removed", err)
	}
}

// patchRefusingMeta refuses patched inline commits with EINVAL, as a meta
// server that predates them does.
type patchRefusingMeta struct {
	metapb.MetaClient
	refused atomic.Int64
}

func (m *patchRefusingMeta) CommitStripes(ctx context.Context, in *metapb.CommitStripesRequest, opts ...grpc.CallOption) (*metapb.CommitStripesReply, error) {
	for _, sc := range in.Stripes {
		if sc.Patch {
			m.refused.Add(1)
			return nil, metaerr.New(syscall.EINVAL, "inline commit of 0 bytes with length %d", sc.Length)
		}
	}
	return m.MetaClient.CommitStripes(ctx, in, opts...)
}

// TestInlinePatchesRefused: against a meta server that refuses patched
// inline commits, rewrites of a small file go whole after the first
// refusal, and every byte reads back right through another mount.
func TestInlinePatchesRefused(t *testing.T) {
	m := &patchRefusingMeta{}
	c := fstest.Start(t, fstest.Options{Layout: inlineLayout, WrapMeta: func(mc metapb.MetaClient) metapb.MetaClient {
		m.MetaClient = mc
		return m
	}})
	other, _ := c.Mount(t)
	p := filepath.Join(c.Dir, "db")
	data := random(12<<10, 1)
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for i := range 10 {
		page := random(512, uint64(i+2))
		off := 4096 * (i % 3)
		if _, err := f.WriteAt(page, int64(off)); err != nil {
			t.Fatal(err)
		}
		copy(data[off:], page)
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	if n := m.refused.Load(); n != 1 {
		t.Errorf("%d patched commits refused, want 1 (then whole)", n)
	}
	if n := c.Engine.Stats().InlinePatched.Load(); n != 0 {
		t.Errorf("%d inline commits counted as patched against a server that refuses them", n)
	}
	readsBack(t, "db", data, c.Dir, other)
}
