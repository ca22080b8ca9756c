package client_test

import (
	"context"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/meta/client"
	"github.com/rdmafs/rdmafs/meta/core"
	"github.com/rdmafs/rdmafs/meta/metapb"
	"github.com/rdmafs/rdmafs/meta/metatest"
)

// behindFixture is a session whose creates are sent behind.
type behindFixture struct {
	t    *testing.T
	ctx  context.Context
	m    *metatest.Meta
	c    *client.Client
	sess *client.Session
	mu   sync.Mutex
	errs map[string]error // outcome of each call sent behind, by name
}

func newBehindFixture(t *testing.T) *behindFixture {
	m := metatest.Start(t, metatest.Options{})
	f := &behindFixture{t: t, ctx: context.Background(), m: m, c: m.Client(t), errs: map[string]error{}}
	var err error
	if f.sess, err = f.c.StartSession(f.ctx, "behind test", 0); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *behindFixture) caller() *metapb.Caller { return &metapb.Caller{Session: f.sess.ID()} }

// ino returns an inode number of the session's own, waiting for the first
// range to arrive.
func (f *behindFixture) ino() uint64 {
	f.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if ino, ok := f.sess.NextIno(); ok {
			return ino
		}
		if time.Now().After(deadline) {
			f.t.Fatal("no inode numbers from AllocInodes")
		}
		time.Sleep(time.Millisecond)
	}
}

// done returns the completion of the call sent behind named name.
func (f *behindFixture) done(name string) func(error) {
	return func(err error) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.errs[name] = err
	}
}

func (f *behindFixture) outcome(name string) (error, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	err, ok := f.errs[name]
	return err, ok
}

// createBehind reserves name in the root and queues its create behind.
func (f *behindFixture) createBehind(name string) uint64 {
	f.t.Helper()
	r, err := f.c.Lookup(f.ctx, &metapb.LookupRequest{Caller: f.caller(), Parent: core.RootIno, Name: name, Reserve: true})
	if err != nil || !r.Reserved {
		f.t.Fatalf("lookup %q with reserve: %v, %v", name, r, err)
	}
	ino := f.ino()
	if !f.sess.CreateBehind(&metapb.CreateRequest{Caller: f.caller(), Parent: core.RootIno, Name: name, Mode: 0o644,
		Exclusive: true, SessionId: f.sess.ID(), OpenFlags: syscall.O_WRONLY, Ino: ino, TimeNs: time.Now().UnixNano()}, f.done(name)) {
		f.t.Fatal("CreateBehind queued nothing")
	}
	return ino
}

// TestCallsBehindOrder: a call that depends on a call sent behind sees it
// applied; a release of a file whose create is still queued leaves it open
// nowhere; an unlink naming another inode removes nothing; a create meta
// refuses is reported.
func TestCallsBehindOrder(t *testing.T) {
	f := newBehindFixture(t)
	a := f.createBehind("a")
	// Each depends on the create: it must find the file.
	if r, err := f.c.GetAttr(f.ctx, &metapb.GetAttrRequest{Ino: a}); err != nil || r.Attr.Ino != a {
		t.Fatalf("getattr right after a create behind: %v, %v", r, err)
	}
	if r, err := f.c.Lookup(f.ctx, &metapb.LookupRequest{Parent: core.RootIno, Name: "a"}); err != nil || r.Attr.Ino != a {
		t.Fatalf("lookup right after a create behind: %v, %v", r, err)
	}

	// Released right after the create was queued: either the create opens
	// nothing (it was still queued) or the release follows it.
	b := f.createBehind("b")
	if !f.sess.ReleaseBehind(b, f.done("release b")) {
		t.Fatal("ReleaseBehind queued nothing")
	}
	if err := f.sess.WaitBehind(f.ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := f.c.Unlink(f.ctx, &metapb.UnlinkRequest{Parent: core.RootIno, Name: "b"}); err != nil {
		t.Fatal(err)
	}
	// Not open anywhere: the unlink deleted it (an open one would stay).
	if _, err := f.c.GetAttr(f.ctx, &metapb.GetAttrRequest{Ino: b}); client.Errno(err) != syscall.ENOENT {
		t.Fatalf("a closed file is open after its unlink: %v", err)
	}

	if !f.sess.UnlinkBehind(&metapb.UnlinkRequest{Caller: f.caller(), Parent: core.RootIno, Name: "a", Ino: a + 1000}, f.done("unlink a")) {
		t.Fatal("UnlinkBehind queued nothing")
	}
	// An inode number that is not the session's: meta refuses the create.
	if !f.sess.CreateBehind(&metapb.CreateRequest{Caller: f.caller(), Parent: core.RootIno, Name: "c", Mode: 0o644,
		Exclusive: true, Ino: 1 << 40}, f.done("c")) {
		t.Fatal("CreateBehind queued nothing")
	}
	if err := f.sess.WaitBehind(f.ctx); err != nil {
		t.Fatal(err)
	}
	if err, _ := f.outcome("unlink a"); client.Errno(err) != syscall.ENOENT {
		t.Fatalf("unlink naming another inode: %v, want ENOENT", err)
	}
	if _, err := f.c.GetAttr(f.ctx, &metapb.GetAttrRequest{Ino: a}); err != nil {
		t.Fatalf("a removed by an unlink that named another inode: %v", err)
	}
	for _, name := range []string{"a", "b", "release b"} {
		if err, ok := f.outcome(name); !ok || err != nil {
			t.Errorf("%s behind: done %v, %v", name, ok, err)
		}
	}
	if err, _ := f.outcome("c"); client.Errno(err) != syscall.EINVAL {
		t.Errorf("create with a foreign inode number: %v, want EINVAL", err)
	}
}

// TestCallsBehindSurviveRestart: creates queued behind while meta restarts
// are applied once it is back, once each.
func TestCallsBehindSurviveRestart(t *testing.T) {
	f := newBehindFixture(t)
	inos := map[string]uint64{}
	for _, name := range []string{"x", "y", "z"} {
		inos[name] = f.createBehind(name)
	}
	f.m.Restart(t)
	if err := f.sess.WaitBehind(f.ctx); err != nil {
		t.Fatal(err)
	}
	for name, ino := range inos {
		if err, ok := f.outcome(name); !ok || err != nil {
			t.Errorf("create %s behind a restart: done %v, %v", name, ok, err)
		}
		r, err := f.c.Lookup(f.ctx, &metapb.LookupRequest{Parent: core.RootIno, Name: name})
		if err != nil || r.Attr.Ino != ino {
			t.Errorf("lookup %s after the restart: %v, %v (want inode %d)", name, r, err, ino)
		}
	}
}
