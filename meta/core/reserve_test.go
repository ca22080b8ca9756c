package core

import (
	"syscall"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/meta/metaerr"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// session opens a session and gives it n inode numbers.
func (e *env) session(n uint32) (id, first uint64) {
	e.t.Helper()
	r, err := e.s.OpenSession(e.ctx, &metapb.OpenSessionRequest{Client: "test"})
	if err != nil {
		e.t.Fatal(err)
	}
	a, err := e.s.AllocInodes(e.ctx, &metapb.AllocInodesRequest{SessionId: r.SessionId, Count: n})
	if err != nil {
		e.t.Fatal(err)
	}
	if a.Count != n || a.First == 0 {
		e.t.Fatalf("AllocInodes = %v", a)
	}
	return r.SessionId, a.First
}

// reserve looks name up with reserve for session and fails unless it is held.
func (e *env) reserve(session, parent uint64, name string) *metapb.EntryReply {
	e.t.Helper()
	r, err := e.s.Lookup(e.ctx, &metapb.LookupRequest{Caller: &metapb.Caller{Session: session}, Parent: parent, Name: name, Reserve: true})
	if err != nil {
		e.t.Fatalf("lookup %q with reserve: %v", name, err)
	}
	if !r.Reserved || r.Attr != nil || r.Parent.GetIno() != parent || r.NewLayout == nil {
		e.t.Fatalf("lookup %q with reserve = %v, want reserved", name, r)
	}
	return r
}

// createEarly is the create a client sends after answering it: the inode
// number is the client's.
func (e *env) createEarly(session, parent uint64, name string, ino uint64) (*metapb.EntryReply, error) {
	return e.s.Create(e.ctx, &metapb.CreateRequest{Caller: &metapb.Caller{Session: session}, Parent: parent, Name: name,
		Mode: 0o644, SessionId: session, OpenFlags: syscall.O_WRONLY, Ino: ino, TimeNs: 42})
}

type result struct {
	r   *metapb.EntryReply
	err error
}

// blocked fails t if a call whose outcome arrives on done returns within a
// moment: it must wait for a reservation, which only the test ends (the
// fake clock does not move). The moment only bounds the check.
func blocked[T any](t *testing.T, done <-chan T, what string) {
	t.Helper()
	select {
	case v := <-done:
		t.Fatalf("%s returned (%v) while another session held the name", what, v)
	case <-time.After(200 * time.Millisecond):
	}
}

func TestReservedName(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		a, aFirst := e.session(16)
		b, _ := e.session(16)

		// A holds "f": B's create of it waits for A's, then finds it.
		e.reserve(a, RootIno, "f")
		done := make(chan result, 1)
		go func() {
			r, err := e.s.Create(e.ctx, &metapb.CreateRequest{Caller: &metapb.Caller{Session: b}, Parent: RootIno, Name: "f", Mode: 0o600, Exclusive: true})
			done <- result{r, err}
		}()
		blocked(t, done, "another session's create")
		r, err := e.createEarly(a, RootIno, "f", aFirst)
		if err != nil {
			t.Fatalf("early create: %v", err)
		}
		if r.Attr.Ino != aFirst || r.Attr.MtimeNs != 42 || !r.Created {
			t.Fatalf("early create = %v, want inode %d, mtime 42", r, aFirst)
		}
		got := <-done
		wantErrno(t, got.err, syscall.EEXIST)

		// An existing name is not reserved: the lookup finds it.
		if l, err := e.s.Lookup(e.ctx, &metapb.LookupRequest{Caller: &metapb.Caller{Session: a}, Parent: RootIno, Name: "f", Reserve: true}); err != nil || l.Reserved || l.Attr.GetIno() != aFirst {
			t.Fatalf("lookup of an existing name with reserve = %v, %v", l, err)
		}
		// Without a session, or without reserve, a missing name is ENOENT.
		_, err = e.s.Lookup(e.ctx, &metapb.LookupRequest{Parent: RootIno, Name: "g", Reserve: true})
		wantErrno(t, err, syscall.ENOENT)
		_, err = e.s.Lookup(e.ctx, &metapb.LookupRequest{Caller: &metapb.Caller{Session: a}, Parent: RootIno, Name: "g"})
		wantErrno(t, err, syscall.ENOENT)

		// Another session cannot reserve a name A holds.
		e.reserve(a, RootIno, "g")
		_, err = e.s.Lookup(e.ctx, &metapb.LookupRequest{Caller: &metapb.Caller{Session: b}, Parent: RootIno, Name: "g", Reserve: true})
		wantErrno(t, err, syscall.ENOENT)

		// Once A's reservation has expired, B's create goes ahead and A's
		// late create of the name fails.
		e.clock.Advance(time.Second)
		e.create(&metapb.Caller{Session: b}, RootIno, "g", 0o600)
		_, err = e.createEarly(a, RootIno, "g", aFirst+1)
		wantErrno(t, err, syscall.EEXIST)

		// Inode numbers: only the session's own, never twice.
		e.reserve(a, RootIno, "h")
		_, err = e.createEarly(a, RootIno, "h", aFirst+100)
		wantErrno(t, err, syscall.EINVAL)
		_, err = e.createEarly(b, RootIno, "h", aFirst+2)
		wantErrno(t, err, syscall.EINVAL)
		_, err = e.createEarly(a, RootIno, "h", aFirst)
		wantErrno(t, err, syscall.EEXIST)
		if _, err := e.createEarly(a, RootIno, "h", aFirst+2); err != nil {
			t.Fatal(err)
		}

		// A create sent after its file was closed opens nothing: its
		// unlink deletes it.
		e.reserve(a, RootIno, "k")
		if _, err := e.s.Create(e.ctx, &metapb.CreateRequest{Caller: &metapb.Caller{Session: a}, Parent: RootIno, Name: "k",
			Mode: 0o644, Ino: aFirst + 3}); err != nil {
			t.Fatal(err)
		}
		if _, err := e.s.Unlink(e.ctx, &metapb.UnlinkRequest{Parent: RootIno, Name: "k"}); err != nil {
			t.Fatal(err)
		}
		if _, err := e.s.GetAttr(e.ctx, &metapb.GetAttrRequest{Ino: aFirst + 3}); metaerr.Errno(err) != syscall.ENOENT {
			t.Fatalf("a create without an open left its file open: %v", err)
		}
	})
}

func TestReservedNameBlocksRemovalAndChmod(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		a, aFirst := e.session(4)
		b, _ := e.session(4)
		d := e.mkdir(&metapb.Caller{}, RootIno, "d", 0o777)
		e.reserve(a, d, "x")
		rmdir := make(chan error, 1)
		go func() {
			_, err := e.s.Rmdir(e.ctx, &metapb.RmdirRequest{Caller: &metapb.Caller{Session: b}, Parent: RootIno, Name: "d"})
			rmdir <- err
		}()
		chmod := make(chan error, 1)
		go func() {
			_, err := e.s.SetAttr(e.ctx, &metapb.SetAttrRequest{Caller: &metapb.Caller{Session: b}, Ino: d, SetMode: true, Mode: 0o500})
			chmod <- err
		}()
		blocked(t, rmdir, "rmdir of the directory")
		blocked(t, chmod, "chmod of the directory")
		if _, err := e.createEarly(a, d, "x", aFirst); err != nil {
			t.Fatalf("early create in a directory being removed: %v", err)
		}
		wantErrno(t, <-rmdir, syscall.ENOTEMPTY)
		if err := <-chmod; err != nil {
			t.Fatal(err)
		}
		// The holder's own calls do not wait for its reservation.
		e.reserve(a, d, "y")
		if _, err := e.s.Mkdir(e.ctx, &metapb.MkdirRequest{Caller: &metapb.Caller{Session: a}, Parent: d, Name: "y", Mode: 0o755}); err != nil {
			t.Fatal(err)
		}
		// An unlink that names the inode it saw removes nothing else.
		yIno, _ := e.lookup(d, "y")
		_, err := e.s.Unlink(e.ctx, &metapb.UnlinkRequest{Parent: d, Name: "x", Ino: yIno})
		wantErrno(t, err, syscall.ENOENT)
		if _, err := e.lookup(d, "x"); err != nil {
			t.Fatalf("x removed by an unlink that named another inode: %v", err)
		}
		if _, err := e.s.Unlink(e.ctx, &metapb.UnlinkRequest{Parent: d, Name: "x", Ino: aFirst}); err != nil {
			t.Fatal(err)
		}
	})
}

// TestReserveGrace: after a restart with live sessions, a create another
// session answered before it (and replays now) goes first; other name
// changes wait for the grace.
func TestReserveGrace(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		a, aFirst := e.session(4)
		e.reserve(a, RootIno, "f")
		const grace = 300 * time.Millisecond
		e.reserveGrace = grace
		e.restart()
		start := time.Now()
		if _, err := e.createEarly(a, RootIno, "f", aFirst); err != nil {
			t.Fatalf("replayed create after a restart: %v", err)
		}
		if el := time.Since(start); el >= grace {
			t.Fatalf("the replayed create waited %v for the grace", el)
		}
		e.create(&metapb.Caller{}, RootIno, "g", 0o600)
		if el := time.Since(start); el < grace {
			t.Fatalf("a create %v after the restart did not wait for the grace (%v)", el, grace)
		}
	})
}
