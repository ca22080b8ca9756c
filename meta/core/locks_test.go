package core

import (
	"syscall"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/meta/metapb"
)

// TestLocks: record locks conflict only across owners and only where one is
// a write lock; an owner's locks split and merge; flocks are separate; a
// waiter is woken by the release; a wait that would close a cycle fails
// with EDEADLK; a session's end releases its locks.
func TestLocks(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		f := e.create(root, RootIno, "f", 0o644)
		sess := func() uint64 {
			r, err := e.s.OpenSession(e.ctx, &metapb.OpenSessionRequest{Client: "t"})
			if err != nil {
				t.Fatal(err)
			}
			return r.SessionId
		}
		sa, sb := sess(), sess()
		lk := func(s, owner uint64, typ metapb.LockType, start, end uint64) *metapb.FileLock {
			return &metapb.FileLock{Session: s, Owner: owner, Pid: uint32(owner), Type: typ, Start: start, End: end}
		}
		set := func(l *metapb.FileLock, wait bool) error {
			r, err := e.s.Lock(e.ctx, &metapb.LockRequest{Ino: f, Lock: l, Wait: wait})
			if err == nil && !r.Granted {
				t.Fatalf("lock %v: not granted, no error", l)
			}
			return err
		}
		must := func(l *metapb.FileLock) {
			t.Helper()
			if err := set(l, false); err != nil {
				t.Fatalf("lock %v: %v", l, err)
			}
		}
		refused := func(l *metapb.FileLock) {
			t.Helper()
			wantErrno(t, set(l, false), syscall.EAGAIN)
		}
		const W, R, U = metapb.LockType_LOCK_WRITE, metapb.LockType_LOCK_READ, metapb.LockType_LOCK_UNLOCK
		must(lk(sa, 1, W, 0, 99))
		refused(lk(sb, 2, R, 50, 60))
		must(lk(sb, 2, R, 100, 200))
		must(lk(sa, 1, W, 0, 99)) // the owner's own lock is no conflict
		r, err := e.s.Lock(e.ctx, &metapb.LockRequest{Ino: f, Lock: lk(sb, 2, W, 90, 95), Test: true})
		if err != nil || r.Conflict == nil || r.Conflict.Pid != 1 || r.Conflict.Start != 0 || r.Conflict.End != 99 {
			t.Fatalf("test for a conflict: %v %v", r, err)
		}
		// Unlocking the middle splits the lock.
		must(lk(sa, 1, U, 40, 59))
		must(lk(sb, 2, R, 45, 50))
		refused(lk(sb, 2, W, 30, 39))
		refused(lk(sb, 2, W, 60, 60))
		// Read locks share.
		must(lk(sb, 3, R, 45, 50))
		// flocks do not meet record locks.
		must(&metapb.FileLock{Session: sb, Owner: 7, Flock: true, Type: W})
		refused(&metapb.FileLock{Session: sa, Owner: 8, Flock: true, Type: R})

		// A waiter is woken by the release.
		got := make(chan error, 1)
		go func() { got <- set(lk(sb, 2, W, 0, 10), true) }()
		waitUntil(t, func() bool { return e.s.waiting(metapb.LockOwner{Session: sb, Owner: 2}) })
		must(lk(sa, 1, U, 0, metapb.LockToEOF))
		if err := <-got; err != nil {
			t.Fatalf("waiter: %v", err)
		}

		// Deadlock: owner 2 holds [0,10] and waits for [300,300] of owner
		// 1 (via 20); owner 1 then waiting for [0,0] closes the cycle.
		must(lk(sa, 1, W, 300, 300))
		go func() { got <- set(lk(sb, 2, W, 300, 300), true) }()
		waitUntil(t, func() bool { return e.s.waiting(metapb.LockOwner{Session: sb, Owner: 2}) })
		wantErrno(t, set(lk(sa, 1, W, 0, 0), true), syscall.EDEADLK)

		// The end of session a releases its locks: the waiter gets in.
		if _, err := e.s.CloseSession(e.ctx, &metapb.CloseSessionRequest{SessionId: sa}); err != nil {
			t.Fatal(err)
		}
		if err := <-got; err != nil {
			t.Fatalf("waiter after the holder's session ended: %v", err)
		}
		// Another owner of the same session is another holder.
		refused(&metapb.FileLock{Session: sb, Owner: 9, Flock: true, Type: R})
	})
}

// waitUntil waits for cond, checked as the scheduler runs other goroutines.
func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 10s")
		}
		time.Sleep(time.Millisecond)
	}
}

// waiting reports whether record-lock owner o waits for a lock.
func (s *Service) waiting(o metapb.LockOwner) bool {
	s.lockMu.Lock()
	defer s.lockMu.Unlock()
	_, ok := s.locks.waitsFor[o]
	return ok
}

// TestKillPrivByWriter: someone who may write a set-user-ID, set-group-ID
// file but does not own it may clear those bits (the kernel's chmod on a
// writer's behalf) and nothing else; without write access, not even that.
func TestKillPrivByWriter(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		f := e.create(root, RootIno, "f", 0o644)
		chmod := func(c *metapb.Caller, mode uint32) error {
			_, err := e.s.SetAttr(e.ctx, &metapb.SetAttrRequest{Caller: c, Ino: f, SetMode: true, Mode: mode})
			return err
		}
		if err := chmod(root, 0o6666); err != nil {
			t.Fatal(err)
		}
		wantErrno(t, chmod(alice, 0o6644), syscall.EPERM) // not only the bits
		if err := chmod(alice, 0o666); err != nil {
			t.Fatalf("clearing both bits as a writer: %v", err)
		}
		if m := e.attr(f).Mode & 0o7777; m != 0o666 {
			t.Fatalf("mode %o after the writer's chmod, want 666", m)
		}
		if err := chmod(root, 0o6644); err != nil {
			t.Fatal(err)
		}
		wantErrno(t, chmod(alice, 0o644), syscall.EPERM) // may not write it
	})
}

// TestStateInReplies: a granted lock answers the file's attributes, and a
// commit names the ctime it replaced, so that a mount can tell whether the
// state its caches show is still the file's (fs/cachestamp.go).
func TestStateInReplies(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		f := smallFile(t, e)
		r, err := e.s.OpenSession(e.ctx, &metapb.OpenSessionRequest{Client: "t"})
		if err != nil {
			t.Fatal(err)
		}
		lock := func(typ metapb.LockType) *metapb.LockReply {
			t.Helper()
			lr, err := e.s.Lock(e.ctx, &metapb.LockRequest{Ino: f, Lock: &metapb.FileLock{Session: r.SessionId, Owner: 1, Type: typ, End: 99}})
			if err != nil || !lr.Granted {
				t.Fatalf("lock %v: %v %v", typ, lr, err)
			}
			return lr
		}
		before := e.attr(f)
		if a := lock(metapb.LockType_LOCK_WRITE).Attr; a == nil || a.Ino != f || a.CtimeNs != before.CtimeNs || a.MtimeNs != before.MtimeNs {
			t.Fatalf("lock's attributes %v, want the file's %v", a, before)
		}
		commit := func(expected uint64, data string) *metapb.CommitStripesReply {
			t.Helper()
			c, err := e.s.CommitStripes(e.ctx, &metapb.CommitStripesRequest{Ino: f, Size: uint64(len(data)), MtimeNs: time.Now().UnixNano(),
				Stripes: []*metapb.StripeCommit{{Stripe: 0, ExpectedVersion: expected, Length: uint64(len(data)), Inline: true, Data: []byte(data)}}})
			if err != nil {
				t.Fatal(err)
			}
			return c
		}
		c1 := commit(0, "one")
		if c1.PrevCtimeNs != before.CtimeNs {
			t.Fatalf("first commit replaced ctime %d, want %d", c1.PrevCtimeNs, before.CtimeNs)
		}
		c2 := commit(c1.Versions[0], "two")
		if c2.PrevCtimeNs != c1.Attr.CtimeNs || c2.Attr.CtimeNs == c1.Attr.CtimeNs {
			t.Fatalf("second commit replaced ctime %d (now %d), want the first's %d", c2.PrevCtimeNs, c2.Attr.CtimeNs, c1.Attr.CtimeNs)
		}
		if a := lock(metapb.LockType_LOCK_READ).Attr; a.CtimeNs != c2.Attr.CtimeNs || a.Size != 3 {
			t.Fatalf("lock after the commits: %v, want the second commit's state %v", a, c2.Attr)
		}
		if a := lock(metapb.LockType_LOCK_UNLOCK).Attr; a != nil {
			t.Fatalf("an unlock answered attributes %v", a)
		}
	})
}
