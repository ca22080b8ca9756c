package core

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/rdmafs/rdmafs/meta/metapb"
)

// recalls makes one Recalls call of session (it returns after the poll wait
// when nothing is recalled).
func (e *env) recalls(session, epoch uint64, release ...uint64) *metapb.RecallsReply {
	e.t.Helper()
	r, err := e.s.Recalls(e.ctx, &metapb.RecallsRequest{SessionId: session, Epoch: epoch, Release: release})
	if err != nil {
		e.t.Fatalf("recalls: %v", err)
	}
	return r
}

// leaseLookup looks name up in dir for session asking for the lease.
func (e *env) leaseLookup(session, dir uint64, name string) *metapb.EntryReply {
	e.t.Helper()
	r, err := e.s.Lookup(e.ctx, &metapb.LookupRequest{Caller: &metapb.Caller{Session: session}, Parent: dir, Name: name, Reserve: true, Lease: true})
	if err != nil {
		e.t.Fatalf("lookup %q with lease: %v", name, err)
	}
	return r
}

// TestDirLease: a session listening for recalls gets a directory's lease
// with its names; another session's lookup there recalls it and waits until
// the holder has sent its create and given the lease back, then finds the
// file. The holder's own calls do not recall it, and the directory is not
// leased again at once.
func TestDirLease(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		a, aFirst := e.session(16)
		b, _ := e.session(16)
		dir := e.mkdir(root, RootIno, "d", 0o777)
		e.create(root, dir, "x", 0o644)

		// Not listening for recalls: no lease.
		if r := e.leaseLookup(a, dir, "y"); r.Lease != nil {
			t.Fatalf("lease granted to a session that does not call Recalls: %v", r.Lease)
		}
		epoch := e.recalls(a, 0).Epoch
		r := e.leaseLookup(a, dir, "y")
		if r.Lease == nil || r.Lease.Epoch != epoch || !slices.Equal(r.Lease.Names, []string{"x"}) {
			t.Fatalf("lease = %v, want epoch %d and names [x]", r.Lease, epoch)
		}
		id := r.Lease.Id

		// The holder's own reads do not wait.
		if _, err := e.s.GetAttr(e.ctx, &metapb.GetAttrRequest{Ino: dir, LeaseSession: a}); err != nil {
			t.Fatal(err)
		}
		if _, err := e.s.ReadDir(e.ctx, &metapb.ReadDirRequest{Caller: &metapb.Caller{Session: a}, Ino: dir}); err != nil {
			t.Fatal(err)
		}

		polled := make(chan *metapb.RecallsReply, 1)
		go func() {
			r, _ := e.s.Recalls(e.ctx, &metapb.RecallsRequest{SessionId: a, Epoch: epoch})
			polled <- r // nil on an error: the check below fails
		}()
		done := make(chan result, 1)
		go func() {
			r, err := e.s.Lookup(e.ctx, &metapb.LookupRequest{Caller: &metapb.Caller{Session: b}, Parent: dir, Name: "y"})
			done <- result{r, err}
		}()
		if rec := <-polled; rec == nil || !slices.Equal(rec.Recall, []uint64{id}) {
			t.Fatalf("recalls = %v, want [%d]", rec, id)
		}
		blocked(t, done, "another session's lookup")
		// The holder sends the create it answered, then gives the lease back.
		if _, err := e.createEarly(a, dir, "y", aFirst); err != nil {
			t.Fatal(err)
		}
		blocked(t, done, "another session's lookup")
		released := make(chan error, 1)
		go func() {
			_, err := e.s.Recalls(e.ctx, &metapb.RecallsRequest{SessionId: a, Epoch: epoch, Release: []uint64{id}})
			released <- err
		}()
		res := <-done
		if err := <-released; err != nil {
			t.Fatal(err)
		}
		if res.err != nil || res.r.Attr.GetIno() != aFirst {
			t.Fatalf("lookup after the recall = %v, %v; want inode %d", res.r, res.err, aFirst)
		}

		// Recalled a moment ago: not leased again yet; later it is.
		e.recalls(a, epoch)
		if r := e.leaseLookup(a, dir, "z"); r.Lease != nil {
			t.Fatalf("lease granted again right after a recall: %v", r.Lease)
		}
		e.clock.Advance(2 * time.Second)
		e.recalls(a, epoch)
		if r := e.leaseLookup(a, dir, "z"); r.Lease == nil || !slices.Equal(r.Lease.Names, []string{"x", "y"}) {
			t.Fatalf("lease = %v, want names [x y]", r.Lease)
		}
	})
}

// TestDirLeaseSilentHolder: a holder that stops calling Recalls (a killed
// mount) loses its lease once silent for LeaseSilence, and the call that
// recalled it goes on.
func TestDirLeaseSilentHolder(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		a, _ := e.session(16)
		b, _ := e.session(16)
		dir := e.mkdir(root, RootIno, "d", 0o777)
		e.recalls(a, 0)
		if r := e.leaseLookup(a, dir, "y"); r.Lease == nil {
			t.Fatal("no lease")
		}
		done := make(chan result, 1)
		go func() {
			r, err := e.s.Create(e.ctx, &metapb.CreateRequest{Caller: &metapb.Caller{Session: b}, Parent: dir, Name: "y", Mode: 0o644, Exclusive: true})
			done <- result{r, err}
		}()
		blocked(t, done, "another session's create")
		e.clock.Advance(4 * time.Second) // past LeaseSilence (3s) since the last poll
		select {
		case res := <-done:
			if res.err != nil {
				t.Fatalf("create after the holder went silent: %v", res.err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("create still waiting 10s after the holder went silent")
		}
	})
}

// TestDirLeaseExcludesReservations: a directory in which another session
// holds a name is not leased, and a session's lease keeps others from
// reserving names in it until recalled.
func TestDirLeaseExcludesReservations(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		a, _ := e.session(16)
		b, _ := e.session(16)
		dir := e.mkdir(root, RootIno, "d", 0o777)
		e.recalls(a, 0)
		e.reserve(b, dir, "n")
		if r := e.leaseLookup(a, dir, "m"); r.Lease != nil {
			t.Fatalf("lease granted while another session holds a name in the directory: %v", r.Lease)
		}
		e.clock.Advance(time.Second) // B's hold ends
		e.recalls(a, 0)
		if r := e.leaseLookup(a, dir, "m"); r.Lease == nil {
			t.Fatal("no lease once the other hold ended")
		}
		// A silent holder, so that B's reserving lookup ends the lease.
		e.clock.Advance(4 * time.Second)
		e.reserve(b, dir, "n")
	})
}

// TestLeaseFence: the files a holder created under a lease taken back from
// it (it went silent) stay locked for other sessions — the holder may have
// granted locks of them it has not sent — until it gives the lease back
// after sending its calls, or its session ends. A lease given back leaves
// no fence.
func TestLeaseFence(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		a, aFirst := e.session(16)
		b, _ := e.session(16)
		const W, U = metapb.LockType_LOCK_WRITE, metapb.LockType_LOCK_UNLOCK
		lock := func(s, ino uint64, typ metapb.LockType, wait bool) error {
			r, err := e.s.Lock(e.ctx, &metapb.LockRequest{Ino: ino, Lock: &metapb.FileLock{Session: s, Owner: s, Flock: true, Type: typ}, Wait: wait})
			if err == nil && !r.Granted {
				return errors.New("not granted")
			}
			return err
		}
		// leased creates a file of a under a lease of dir, then has b's
		// lookup take the lease back from a silent a.
		leased := func(dir uint64, name string, ino uint64) uint64 {
			t.Helper()
			e.recalls(a, 0)
			r := e.leaseLookup(a, dir, name)
			if r.Lease == nil {
				t.Fatal("no lease")
			}
			if _, err := e.createEarly(a, dir, name, ino); err != nil {
				t.Fatal(err)
			}
			done := make(chan result, 1)
			go func() {
				r, err := e.s.Lookup(e.ctx, &metapb.LookupRequest{Caller: &metapb.Caller{Session: b}, Parent: dir, Name: name})
				done <- result{r, err}
			}()
			blocked(t, done, "another session's lookup")
			e.clock.Advance(4 * time.Second) // past LeaseSilence
			if res := <-done; res.err != nil {
				t.Fatalf("lookup after the holder went silent: %v", res.err)
			}
			return r.Lease.Id
		}

		dir := e.mkdir(root, RootIno, "d", 0o777)
		id := leased(dir, "f", aFirst)
		f := aFirst
		wantErrno(t, lock(b, f, W, false), syscall.EAGAIN)
		if r, err := e.s.Lock(e.ctx, &metapb.LockRequest{Ino: f, Lock: &metapb.FileLock{Session: b, Owner: b, Type: W, End: 10}, Test: true}); err != nil || r.Conflict == nil || r.Conflict.Session != a {
			t.Fatalf("F_GETLK behind a fence = %v, %v; want a conflict of session %d", r, err, a)
		}
		waiter := make(chan error, 1)
		go func() { waiter <- lock(b, f, W, true) }()
		blocked(t, waiter, "a lock behind a fence")
		// The recall goes out with every answer until the lease comes back
		// (one answer may be lost).
		for range 2 {
			if rec := e.recalls(a, 0); !slices.Contains(rec.Recall, id) {
				t.Fatalf("recalls after the takeback = %v, want %d again", rec.Recall, id)
			}
		}
		// The holder sends the lock it granted, then gives the lease back:
		// the waiter now waits for that lock, until it is unlocked.
		if err := lock(a, f, W, false); err != nil {
			t.Fatalf("the holder's own lock: %v", err)
		}
		e.recalls(a, e.recalls(a, 0).Epoch, id)
		blocked(t, waiter, "a lock behind the holder's")
		if err := lock(a, f, U, false); err != nil {
			t.Fatal(err)
		}
		if err := <-waiter; err != nil {
			t.Fatalf("lock after the fence was lifted and the holder unlocked: %v", err)
		}

		// The end of the holder's session lifts its fence.
		dir2 := e.mkdir(root, RootIno, "d2", 0o777)
		leased(dir2, "g", aFirst+1)
		g := aFirst + 1
		go func() { waiter <- lock(b, g, W, true) }()
		blocked(t, waiter, "a lock behind a fence")
		if err := e.s.endSession(e.ctx, a, "test"); err != nil {
			t.Fatal(err)
		}
		if err := <-waiter; err != nil {
			t.Fatalf("lock after the holder's session ended: %v", err)
		}

		// A lease given back leaves no fence.
		c, cFirst := e.session(16)
		dir3 := e.mkdir(root, RootIno, "d3", 0o777)
		epoch := e.recalls(c, 0).Epoch
		r := e.leaseLookup(c, dir3, "h")
		if r.Lease == nil {
			t.Fatal("no lease")
		}
		if _, err := e.createEarly(c, dir3, "h", cFirst); err != nil {
			t.Fatal(err)
		}
		e.recalls(c, epoch, r.Lease.Id)
		if err := lock(b, cFirst, W, false); err != nil {
			t.Fatalf("lock of a file created under a lease given back: %v", err)
		}
	})
}

// TestDirLeaseOfLargeDirectory: a directory of MaxLeaseNames entries is
// leased with all of them, in a reply the mount's gRPC client takes (4 MiB
// by default) even when every name is NAME_MAX bytes long; one entry more
// and it is not leased.
func TestDirLeaseOfLargeDirectory(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		a, _ := e.session(16)
		dir := e.mkdir(root, RootIno, "d", 0o777)
		long := strings.Repeat("n", 255-5)
		for i := range MaxLeaseNames {
			e.create(root, dir, fmt.Sprintf("%s%05d", long, i), 0o644)
		}
		epoch := e.recalls(a, 0).Epoch
		r := e.leaseLookup(a, dir, "missing")
		if r.Lease == nil || r.Lease.Epoch != epoch || len(r.Lease.Names) != MaxLeaseNames {
			t.Fatalf("lease of a directory of %d entries: %d names (lease %v)", MaxLeaseNames, len(r.GetLease().GetNames()), r.Lease != nil)
		}
		if n := proto.Size(r); n >= 4<<20 {
			t.Fatalf("the lease's reply is %d bytes, more than gRPC's default 4 MiB", n)
		}
		e.recalls(a, epoch, r.Lease.Id) // given back
		e.create(root, dir, "one more", 0o644)
		if r := e.leaseLookup(a, dir, "missing too"); r.Lease != nil {
			t.Fatalf("lease of a directory of %d entries", MaxLeaseNames+1)
		}
	})
}
