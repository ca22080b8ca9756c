package client_test

import (
	"context"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/rdmafs/rdmafs/internal/stripe"
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
	return newBehindFixtureOpts(t, metatest.Options{})
}

func newBehindFixtureOpts(t *testing.T, opts metatest.Options) *behindFixture {
	m := metatest.Start(t, opts)
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

// TestCarryInline: a small file's data given to its create still queued is
// committed by the create, as stripe 0's first version with the times
// given; it is not given to a create in flight, or followed by another call
// on the file. A meta server that ignores the data (one that predates it:
// here a client that strips it from the batches) gets it by a commit of its
// own, and the file ends up the same.
func TestCarryInline(t *testing.T) {
	for _, strip := range []bool{false, true} {
		t.Run(map[bool]string{false: "carried", true: "meta ignores it"}[strip], func(t *testing.T) {
			f := newBehindFixtureOpts(t, metatest.Options{Layout: stripe.Layout{K: 4, M: 2, Unit: 64 << 10, Inline: 4096}})
			gate := &batchGate{strip: strip}
			c, err := client.Dial(f.m.Addr, f.m.Secret, grpc.WithUnaryInterceptor(gate.intercept))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			f.c = c
			if f.sess, err = f.c.StartSession(f.ctx, "behind test", 0); err != nil {
				t.Fatal(err)
			}
			f.c.SetLinger(time.Hour) // queued until a call takes them along
			data := []byte("small file content")
			at := time.Now().Add(-time.Hour).UnixNano()
			a := f.createBehind("a")
			if !f.sess.CarryInline(a, data, at) {
				t.Fatal("the data was not given to a create still queued")
			}
			if f.sess.CarryInline(a, []byte("again"), at) {
				t.Fatal("a create carried data twice")
			}
			b := f.createBehind("b")
			if !f.sess.SetAttrBehind(&metapb.SetAttrRequest{Caller: f.caller(), Ino: b, SetMode: true, Mode: 0o600}, f.done("chmod b")) {
				t.Fatal("SetAttrBehind queued nothing")
			}
			if f.sess.CarryInline(b, data, at) {
				t.Fatal("the data was given to a create followed by another call on the file")
			}
			// The batch with c's create is held in flight.
			cIno := f.createBehind("c")
			entered := gate.hold()
			waited := make(chan error, 1)
			go func() { waited <- f.sess.WaitBehind(f.ctx) }()
			<-entered
			if f.sess.CarryInline(cIno, data, at) {
				t.Fatal("the data was given to a create in flight")
			}
			gate.release()
			if err := <-waited; err != nil {
				t.Fatal(err)
			}
			// A create carrying data in flight, and a call on its file
			// queued meanwhile: with a meta that ignores the data, the
			// commit made in its place goes before that call.
			d := f.createBehind("d")
			if !f.sess.CarryInline(d, data, at) {
				t.Fatal("the data was not given to a create still queued")
			}
			entered = gate.hold()
			go func() { waited <- f.sess.WaitBehind(f.ctx) }()
			<-entered
			if !f.sess.SetAttrBehind(&metapb.SetAttrRequest{Caller: f.caller(), Ino: d, SetMode: true, Mode: 0o640}, f.done("chmod d")) {
				t.Fatal("SetAttrBehind queued nothing")
			}
			gate.release()
			if err := <-waited; err != nil {
				t.Fatal(err)
			}
			if err := f.sess.WaitBehind(f.ctx); err != nil {
				t.Fatal(err)
			}
			for _, name := range []string{"a", "b", "chmod b", "c", "d", "chmod d"} {
				if err, ok := f.outcome(name); !ok || err != nil {
					t.Fatalf("%s behind: done %v, %v", name, ok, err)
				}
			}
			r, err := f.c.GetAttr(f.ctx, &metapb.GetAttrRequest{Ino: a})
			if err != nil {
				t.Fatal(err)
			}
			if r.Attr.Size != uint64(len(data)) || r.Attr.Stored != uint64(len(data)) || r.Attr.MtimeNs != at {
				t.Fatalf("attributes of the file whose create carried its data: size %d stored %d mtime %d, want %d, %d, %d",
					r.Attr.Size, r.Attr.Stored, r.Attr.MtimeNs, len(data), len(data), at)
			}
			s, err := f.c.GetStripes(f.ctx, &metapb.GetStripesRequest{Ino: a, First: 0, Count: 1})
			if err != nil {
				t.Fatal(err)
			}
			if len(s.Stripes) != 1 || s.Stripes[0].Version != 1 || string(s.Stripes[0].InlineData) != string(data) {
				t.Fatalf("stripes of the file whose create carried its data: %v", s.Stripes)
			}
			if r, err := f.c.GetAttr(f.ctx, &metapb.GetAttrRequest{Ino: d}); err != nil || r.Attr.Size != uint64(len(data)) || r.Attr.Mode&0o777 != 0o640 {
				t.Fatalf("the file whose create carried its data, then chmod: %v, %v", r, err)
			}
			for _, ino := range []uint64{b, cIno} {
				if r, err := f.c.GetAttr(f.ctx, &metapb.GetAttrRequest{Ino: ino}); err != nil || r.Attr.Size != 0 {
					t.Fatalf("a file whose create carried nothing: %v, %v", r, err)
				}
			}
		})
	}
}

// batchGate intercepts a client's calls: with strip it removes the data
// creates carry from batches, as a meta server that predates
// CreateRequest.inline_data ignores it; after hold, the next batch waits
// (the channel hold returns is closed when it does) until release.
type batchGate struct {
	strip   bool
	mu      sync.Mutex
	held    chan struct{}
	entered chan struct{}
}

func (g *batchGate) hold() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.held, g.entered = make(chan struct{}), make(chan struct{})
	return g.entered
}

func (g *batchGate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	close(g.held)
	g.held = nil
}

func (g *batchGate) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	b, ok := req.(*metapb.BatchRequest)
	if !ok {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	g.mu.Lock()
	held, entered := g.held, g.entered
	g.entered = nil
	g.mu.Unlock()
	if held != nil && entered != nil {
		close(entered)
		<-held
	}
	for _, call := range b.Calls {
		if !g.strip || call.Method != "Create" {
			continue
		}
		cr := &metapb.CreateRequest{}
		if err := proto.Unmarshal(call.Request, cr); err != nil {
			return err
		}
		cr.InlineData, cr.InlineTimeNs = nil, 0
		body, err := proto.Marshal(cr)
		if err != nil {
			return err
		}
		call.Request = body
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}
