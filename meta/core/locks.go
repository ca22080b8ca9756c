package core

import (
	"context"
	"math"
	"slices"
	"syscall"
	"time"

	"github.com/rdmafs/rdmafs/meta/keys"
	"github.com/rdmafs/rdmafs/meta/kv"
	"github.com/rdmafs/rdmafs/meta/metaerr"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// File locks. The locks of a file are one record in the store, changed in a
// transaction like any metadata, so they survive a meta restart or failover;
// an index by session lets a session's end release its locks. Waiters are
// in memory on the serving meta: every change of a file's locks wakes the
// calls waiting on it, which try again. A wait lasts at most lockWaitMax per
// call (the client asks again), so a failover or a lost wake-up costs one
// round, never a hang.

// lockWaitMax bounds one Lock call's wait.
const lockWaitMax = 10 * time.Second

// lockState is the serving meta's in-memory side of locking.
type lockState struct {
	wake     map[uint64]chan struct{}                // ino -> closed at the next change of its locks
	waitsFor map[metapb.LockOwner][]metapb.LockOwner // a waiting record-lock owner -> the holders in its way
}

// Lock implements metapb.MetaServer.
func (s *Service) Lock(ctx context.Context, req *metapb.LockRequest) (*metapb.LockReply, error) {
	l := req.Lock
	if l == nil || l.Session == 0 {
		return nil, metaerr.New(syscall.EINVAL, "lock without an owner")
	}
	if l.Type > metapb.LockType_LOCK_UNLOCK || l.Start > l.End {
		return nil, metaerr.New(syscall.EINVAL, "lock of type %d over [%d, %d]", l.Type, l.Start, l.End)
	}
	if err := s.checkSession(l.Session); err != nil {
		return nil, err
	}
	norm := metapb.NormalLock(l)
	if req.Test {
		if other := s.reserved.fencedBy(l.Session, req.Ino); other != 0 && norm.Type != metapb.LockType_LOCK_UNLOCK {
			return &metapb.LockReply{Conflict: fencedLock(other)}, nil
		}
		var out *metapb.LockReply
		err := s.view(ctx, func(r kv.Reader) error {
			rec, err := getLocks(r, req.Ino)
			if err != nil {
				return err
			}
			out = &metapb.LockReply{}
			if c := metapb.ConflictingLock(rec.Locks, norm); c != nil {
				out.Conflict = c
			}
			return nil
		})
		return out, err
	}
	deadline := time.NewTimer(lockWaitMax)
	defer deadline.Stop()
	for {
		wake := s.lockWake(req.Ino)
		if other := s.reserved.fencedBy(l.Session, req.Ino); other != 0 && norm.Type != metapb.LockType_LOCK_UNLOCK {
			if !req.Wait {
				return nil, metaerr.New(syscall.EAGAIN, "inode %d: session %d may hold a lock it has not sent", req.Ino, other)
			}
			select {
			case <-wake:
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-deadline.C:
				return &metapb.LockReply{}, nil
			}
		}
		var holders []metapb.LockOwner
		var attr *metapb.Attr
		err := s.updateLogged(ctx, func(t kv.Txn) error {
			holders, attr = holders[:0], nil
			rec, err := getLocks(t, req.Ino)
			if err != nil {
				return err
			}
			if norm.Type != metapb.LockType_LOCK_UNLOCK {
				for _, c := range rec.Locks {
					if metapb.LockConflicts(c, norm) {
						holders = append(holders, metapb.OwnerOf(c))
					}
				}
				if len(holders) > 0 {
					return nil
				}
				ino := &metapb.InodeRecord{}
				if ok, err := getMsg(t, keys.Inode(req.Ino), ino); err != nil {
					return err
				} else if ok {
					attr = ino.Attr
				}
			}
			return putLocks(t, req.Ino, l.Session, metapb.SetLock(rec.Locks, norm))
		})
		if err != nil {
			return nil, err
		}
		if len(holders) == 0 {
			s.lockChanged(req.Ino)
			return &metapb.LockReply{Granted: true, Attr: attr}, nil
		}
		if !req.Wait {
			return nil, metaerr.New(syscall.EAGAIN, "inode %d: a conflicting lock is held", req.Ino)
		}
		me := metapb.OwnerOf(norm)
		if err := s.startWaiting(me, holders); err != nil {
			return nil, err
		}
		select {
		case <-wake:
			s.stopWaiting(me)
		case <-ctx.Done():
			s.stopWaiting(me)
			return nil, ctx.Err()
		case <-deadline.C:
			s.stopWaiting(me)
			return &metapb.LockReply{}, nil
		}
	}
}

// fencedLock is what F_GETLK reports of a file behind session's fence (see
// lease.go): a write lock of the whole file held by that session.
func fencedLock(session uint64) *metapb.FileLock {
	return &metapb.FileLock{Session: session, Type: metapb.LockType_LOCK_WRITE, End: math.MaxUint64}
}

// lockWake returns the channel closed at the next change of ino's locks.
func (s *Service) lockWake(ino uint64) <-chan struct{} {
	s.lockMu.Lock()
	defer s.lockMu.Unlock()
	ch := s.locks.wake[ino]
	if ch == nil {
		ch = make(chan struct{})
		s.locks.wake[ino] = ch
	}
	return ch
}

// lockChanged wakes the calls waiting on ino's locks.
func (s *Service) lockChanged(ino uint64) {
	s.lockMu.Lock()
	defer s.lockMu.Unlock()
	if ch := s.locks.wake[ino]; ch != nil {
		close(ch)
		delete(s.locks.wake, ino)
	}
}

// startWaiting records that me waits for holders, or fails with EDEADLK when
// one of them waits, directly or through others, for me (record locks only:
// flock waits are not checked, as on Linux).
func (s *Service) startWaiting(me metapb.LockOwner, holders []metapb.LockOwner) error {
	if me.Flock {
		return nil
	}
	s.lockMu.Lock()
	defer s.lockMu.Unlock()
	seen := map[metapb.LockOwner]bool{}
	var reaches func(o metapb.LockOwner) bool
	reaches = func(o metapb.LockOwner) bool {
		if o == me {
			return true
		}
		if seen[o] {
			return false
		}
		seen[o] = true
		return slices.ContainsFunc(s.locks.waitsFor[o], reaches)
	}
	if slices.ContainsFunc(holders, reaches) {
		return metaerr.New(syscall.EDEADLK, "waiting for this lock would deadlock")
	}
	s.locks.waitsFor[me] = holders
	return nil
}

func (s *Service) stopWaiting(me metapb.LockOwner) {
	if me.Flock {
		return
	}
	s.lockMu.Lock()
	delete(s.locks.waitsFor, me)
	s.lockMu.Unlock()
}

func getLocks(r kv.Reader, ino uint64) (*metapb.LockRecord, error) {
	rec := &metapb.LockRecord{}
	_, err := getMsg(r, keys.Lock(ino), rec)
	return rec, err
}

// putLocks stores ino's locks and keeps session's index entry for ino.
func putLocks(t kv.Txn, ino, session uint64, locks []*metapb.FileLock) error {
	if len(locks) == 0 {
		if err := t.Delete(keys.Lock(ino)); err != nil {
			return err
		}
	} else if err := putMsg(t, keys.Lock(ino), &metapb.LockRecord{Locks: locks}); err != nil {
		return err
	}
	if slices.ContainsFunc(locks, func(l *metapb.FileLock) bool { return l.Session == session }) {
		return t.Put(keys.SessionLock(session, ino), nil)
	}
	return t.Delete(keys.SessionLock(session, ino))
}

// dropSessionLocks releases every lock of session, in transaction t, and
// returns the files whose locks changed.
func dropSessionLocks(t kv.Txn, session uint64) ([]uint64, error) {
	var inos []uint64
	prefix := keys.SessionLockPrefix(session)
	if err := t.Scan(prefix, kv.PrefixEnd(prefix), 0, func(k, v []byte) error {
		_, ino, err := keys.ParseSessionLock(k)
		if err != nil {
			return err
		}
		inos = append(inos, ino)
		return nil
	}); err != nil {
		return nil, err
	}
	for _, ino := range inos {
		rec, err := getLocks(t, ino)
		if err != nil {
			return nil, err
		}
		left := slices.DeleteFunc(rec.Locks, func(l *metapb.FileLock) bool { return l.Session == session })
		if err := putLocks(t, ino, session, left); err != nil {
			return nil, err
		}
	}
	return inos, nil
}
