package chunkserver_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/chunkserver"
	"github.com/rdmafs/rdmafs/chunkserver/chunk"
	"github.com/rdmafs/rdmafs/chunkserver/chunktest"
	"github.com/rdmafs/rdmafs/chunkserver/proto"
	"github.com/rdmafs/rdmafs/chunkserver/store"
	"github.com/rdmafs/rdmafs/internal/testdisk"
	"github.com/rdmafs/rdmafs/rdma"
)

// TestFullDisk fills a chunkserver whose data dir is a 64 MiB tmpfs through the
// chunk protocol: the prepare that finds no room answers NoSpace (ENOSPC to
// the client) at once and the connection stays usable; a commit the file
// system refuses answers NoSpace too; heartbeats report the reserve as not
// free. Then the metadata service has everything deleted: the kept slots count
// as free at once, the file system gets the space back within seconds, and new
// writes succeed.
func TestFullDisk(t *testing.T) {
	const (
		size    = 64 << 20
		unit    = 1 << 20
		reserve = 8 << 20
	)
	// Mounted before the server starts: cleanups run in reverse, so the
	// server is stopped first.
	dir := testdisk.Tmpfs(t, "64m")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	m := newSpaceMembership()
	s := chunktest.Start(t, chunktest.Options{Dir: dir, MaxLength: unit, Reserve: reserve,
		Config: chunkserver.Config{Membership: m, HeartbeatInterval: 20 * time.Millisecond}})
	env := chunktest.NewClientEnv(t, 2*unit)
	c := env.Dial(t, s.Addr(), s.Secret)

	info := m.waitInfo(t, ctx)
	if info.Capacity != size-reserve || info.Used < 0 || info.Used > unit {
		t.Fatalf("registered capacity %d used %d, want %d and a few KiB", info.Capacity, info.Used, size-reserve)
	}

	// A commit the file system refuses (something else filled it) answers
	// NoSpace and leaves nothing behind.
	k := chunk.Key{Chunk: 9, Version: 1}
	st, err := c.PrepareWrite(ctx, k, unit)
	if err != nil {
		t.Fatalf("prepare on an empty disk: %v", err)
	}
	filler := fillDisk(t, dir)
	fill(env.Bytes()[:unit], k)
	if err := c.Write(ctx, st, 0, []rdma.SGE{env.SGE(0, unit)}); err != nil {
		t.Fatal(err)
	}
	err = c.Commit(ctx, k, store.Checksum(env.Bytes()[:unit]))
	if !proto.IsStatus(err, proto.StatusNoSpace) || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("commit on a file system full behind chunkd's back = %v, want NoSpace and ENOSPC", err)
	}
	if _, err := c.Stat(ctx, k); !proto.IsStatus(err, proto.StatusUnknownChunk) {
		t.Fatalf("after a failed commit: stat = %v, want unknown chunk", err)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}

	// Fill the disk through the protocol until a prepare is refused.
	var written []chunk.Key
	var refused error
	var refusedIn time.Duration
	for v := uint64(1); refused == nil; v++ {
		k := chunk.Key{Chunk: 1, Version: v}
		start := time.Now()
		st, err := c.PrepareWrite(ctx, k, unit)
		if err != nil {
			refused, refusedIn = err, time.Since(start)
			break
		}
		fill(env.Bytes()[:unit], k)
		if err := c.Write(ctx, st, 0, []rdma.SGE{env.SGE(0, unit)}); err != nil {
			t.Fatalf("write %v: %v", k, err)
		}
		if err := c.Commit(ctx, k, store.Checksum(env.Bytes()[:unit])); err != nil {
			t.Fatalf("commit %v after its prepare: %v", k, err)
		}
		written = append(written, k)
	}
	if !proto.IsStatus(refused, proto.StatusNoSpace) || !errors.Is(refused, syscall.ENOSPC) {
		t.Fatalf("prepare on a full disk = %v, want NoSpace and ENOSPC", refused)
	}
	if refusedIn > 5*time.Second {
		t.Fatalf("the refusal took %v", refusedIn)
	}
	// (size - reserve) / FileSize(unit), less the few KiB of chunkd's own files.
	if want := int((size - reserve) / store.FileSize(unit)); len(written) < want-1 {
		t.Fatalf("%d versions of 1 MiB fit, want about %d", len(written), want)
	}
	t.Logf("%d versions of 1 MiB written, then refused in %v", len(written), refusedIn)
	if free := testdisk.Free(t, dir); free < reserve {
		t.Fatalf("only %d bytes free: the reserve was not kept", free)
	}
	// The connection is still good.
	if c.Err() != nil {
		t.Fatalf("connection after the refusal: %v", c.Err())
	}
	if _, err := c.Stat(ctx, written[0]); err != nil {
		t.Fatalf("stat after the refusal: %v", err)
	}
	// Heartbeats say there is less than a unit free: meta places nothing here.
	beat := m.waitStats(t, ctx, "a heartbeat reporting the disk full", func(st chunkserver.Stats) bool { return st.Free < unit })
	if beat.Capacity != size-reserve {
		t.Fatalf("heartbeat capacity %d, want %d", beat.Capacity, size-reserve)
	}

	// Everything deleted through heartbeat replies.
	m.addGarbage(written...)
	m.waitDeleted(t, ctx, written)
	if _, err := c.Stat(ctx, written[0]); !proto.IsStatus(err, proto.StatusUnknownChunk) {
		t.Fatalf("stat of a deleted version = %v", err)
	}
	// Kept slots count as free at once...
	if st := s.Stats(); st.Free < size-reserve-2*unit {
		t.Fatalf("after deleting everything chunkd reports %d bytes free (%+v)", st.Free, s.Store.Space())
	}
	m.waitStats(t, ctx, "a heartbeat reporting the space back", func(st chunkserver.Stats) bool { return st.Free >= size-reserve-2*unit })
	// ... and the file system has them back within seconds.
	deadline := time.Now().Add(3 * store.DefaultKeepIdle)
	for testdisk.Free(t, dir) < size-unit {
		if time.Now().After(deadline) {
			t.Fatalf("%d bytes of the tmpfs free %v after deleting everything (%+v)", testdisk.Free(t, dir), 3*store.DefaultKeepIdle, s.Store.Space())
		}
		time.Sleep(20 * time.Millisecond)
	}
	// New writes succeed.
	putVersions(t, c, env, 2, 8, unit)
}

// fillDisk writes a file into dir until the file system is full and returns
// its path.
func fillDisk(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	for {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("filling %s: %v", dir, err)
			}
			return path
		}
	}
}

// spaceMembership is a metadata service that records registrations and
// heartbeats and hands out garbage until the chunkserver reports it deleted.
type spaceMembership struct {
	mu      sync.Mutex
	changed chan struct{} // closed and replaced on every call
	info    *chunkserver.Info
	last    *chunkserver.Stats
	garbage map[chunk.Key]bool
	deleted map[chunk.Key]bool
	scrub   time.Duration // the scrub interval heartbeat replies give
	// inventory is the list of stored versions sent, complete once
	// inventoryDone.
	inventory      []chunk.Key
	inventoryDone  bool
	inventoryTaken time.Time
}

func newSpaceMembership() *spaceMembership {
	return &spaceMembership{changed: make(chan struct{}), garbage: map[chunk.Key]bool{}, deleted: map[chunk.Key]bool{}}
}

func (m *spaceMembership) notifyLocked() {
	close(m.changed)
	m.changed = make(chan struct{})
}

func (m *spaceMembership) Register(ctx context.Context, info chunkserver.Info) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.info = &info
	m.notifyLocked()
	return nil
}

func (m *spaceMembership) Inventory(_ context.Context, _ string, taken time.Time, versions []chunk.Key, last bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !taken.Equal(m.inventoryTaken) {
		m.inventory, m.inventoryTaken = nil, taken
	}
	m.inventory = append(m.inventory, versions...)
	m.inventoryDone = last
	return nil
}

func (m *spaceMembership) Heartbeat(ctx context.Context, st chunkserver.Stats) (chunkserver.HeartbeatReply, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.last = &st
	for _, k := range st.Deleted {
		delete(m.garbage, k)
		m.deleted[k] = true
	}
	out := make([]chunk.Key, 0, len(m.garbage))
	for k := range m.garbage {
		out = append(out, k)
	}
	m.notifyLocked()
	return chunkserver.HeartbeatReply{Garbage: out, ScrubInterval: m.scrub}, nil
}

func (m *spaceMembership) addGarbage(keys ...chunk.Key) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, k := range keys {
		m.garbage[k] = true
	}
}

// wait calls cond under the lock after every registration or heartbeat until
// it holds or ctx ends.
func (m *spaceMembership) wait(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for {
		m.mu.Lock()
		ok, ch := cond(), m.changed
		m.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-ch:
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v", what, ctx.Err())
		}
	}
}

func (m *spaceMembership) waitInfo(t *testing.T, ctx context.Context) chunkserver.Info {
	t.Helper()
	var info chunkserver.Info
	m.wait(t, ctx, "the registration", func() bool {
		if m.info != nil {
			info = *m.info
		}
		return m.info != nil
	})
	return info
}

// waitStats waits for a heartbeat, sent from now on, whose stats satisfy ok.
func (m *spaceMembership) waitStats(t *testing.T, ctx context.Context, what string, ok func(chunkserver.Stats) bool) chunkserver.Stats {
	t.Helper()
	m.mu.Lock()
	m.last = nil
	m.mu.Unlock()
	var st chunkserver.Stats
	m.wait(t, ctx, what, func() bool {
		if m.last != nil && ok(*m.last) {
			st = *m.last
			return true
		}
		return false
	})
	return st
}

func (m *spaceMembership) waitDeleted(t *testing.T, ctx context.Context, keys []chunk.Key) {
	t.Helper()
	m.wait(t, ctx, "the deletions to be reported", func() bool {
		for _, k := range keys {
			if !m.deleted[k] {
				return false
			}
		}
		return true
	})
}
