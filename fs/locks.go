package fs

import (
	"context"
	"slices"
	"sync"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/rdmafs/rdmafs/meta/metapb"
)

// File locks are held by the metadata service for this mount's session, so
// they hold across mounts: flock(2), POSIX record locks (fcntl F_SETLK,
// F_SETLKW, F_GETLK) and open file description locks (the kernel gives
// each its own owner). The kernel does not keep them itself; it asks us to
// release a process's record locks on a file when the process closes any
// descriptor of it (FLUSH, with the lock owner), and a file's flock when its
// last descriptor closes (RELEASE).

var (
	_ gofs.FileGetlker  = (*fileHandle)(nil)
	_ gofs.FileSetlker  = (*fileHandle)(nil)
	_ gofs.FileSetlkwer = (*fileHandle)(nil)
)

// lockTable is what this mount knows of the locks it holds: which record
// lock owners hold locks on which files (so that a close releases them),
// and the lock owners of the FLUSH requests in flight.
type lockTable struct {
	mu    sync.Mutex
	posix map[uint64]map[uint64]bool // owner -> inodes it holds record locks on
	// flushing holds the lock owner of each FLUSH request being served:
	// go-fuse's node API does not pass it on.
	flushing reqNotes[uint64]
}

// held records that owner holds (or, with held false, released) record
// locks on ino.
func (t *lockTable) held(owner, ino uint64, held bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.posix == nil {
		t.posix = map[uint64]map[uint64]bool{}
	}
	inos := t.posix[owner]
	if held {
		if inos == nil {
			inos = map[uint64]bool{}
			t.posix[owner] = inos
		}
		inos[ino] = true
		return
	}
	delete(inos, ino)
	if len(inos) == 0 {
		delete(t.posix, owner)
	}
}

// holds reports whether owner holds record locks on ino (any inode when
// ino is 0).
func (t *lockTable) holds(owner, ino uint64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	inos := t.posix[owner]
	return len(inos) > 0 && (ino == 0 || inos[ino])
}

// lockOf converts the kernel's lock to the service's.
func (f *fileHandle) lockOf(owner uint64, lk *fuse.FileLock, flags uint32) *metapb.FileLock {
	return &metapb.FileLock{Session: f.fsys.opts.Session, Owner: owner, Pid: lk.Pid, Flock: flags&fuse.LK_FLOCK != 0,
		Type: metapb.LockType(lk.Typ), Start: lk.Start, End: lk.End}
}

// Getlk implements gofs.FileGetlker (F_GETLK, F_OFD_GETLK).
func (f *fileHandle) Getlk(ctx context.Context, owner uint64, lk *fuse.FileLock, flags uint32, out *fuse.FileLock) syscall.Errno {
	l := f.lockOf(owner, lk, flags)
	c, local := f.node.testOwned(metapb.NormalLock(l))
	if !local {
		ctx, done := killable(ctx)
		defer done()
		r, err := f.fsys.meta.Lock(ctx, &metapb.LockRequest{Ino: f.ino, Lock: l, Test: true})
		if err != nil {
			return errno(err)
		}
		c = r.Conflict
	}
	if c != nil {
		*out = fuse.FileLock{Start: c.Start, End: c.End, Typ: uint32(c.Type), Pid: c.Pid}
	} else {
		*out = fuse.FileLock{Typ: syscall.F_UNLCK}
	}
	return 0
}

// Setlk implements gofs.FileSetlker (F_SETLK, flock with LOCK_NB): EAGAIN
// when another owner holds a conflicting lock.
func (f *fileHandle) Setlk(ctx context.Context, owner uint64, lk *fuse.FileLock, flags uint32) syscall.Errno {
	return f.setLock(ctx, owner, lk, flags, false)
}

// Setlkw implements gofs.FileSetlkwer (F_SETLKW, flock): it waits for the
// conflicting locks to go; a signal interrupts it (EINTR), and a wait that
// would deadlock fails with EDEADLK.
func (f *fileHandle) Setlkw(ctx context.Context, owner uint64, lk *fuse.FileLock, flags uint32) syscall.Errno {
	return f.setLock(ctx, owner, lk, flags, true)
}

func (f *fileHandle) setLock(ctx context.Context, owner uint64, lk *fuse.FileLock, flags uint32, wait bool) syscall.Errno {
	ctx, done := killable(ctx)
	defer done()
	l := f.lockOf(owner, lk, flags)
	locking := l.Type != metapb.LockType_LOCK_UNLOCK
	if !locking {
		if err := f.commitBeforeUnlock(ctx); err != nil {
			return dataErrno(err)
		}
	}
	var granted *metapb.Attr // the file's state meta answered with the lock
	if local, e := f.node.lockOwned(metapb.NormalLock(l), wait); local {
		if e != 0 {
			return e
		}
	} else {
		for {
			r, err := f.fsys.meta.Lock(ctx, &metapb.LockRequest{Ino: f.ino, Lock: l, Wait: wait})
			if err != nil {
				return errno(err)
			}
			if r.Granted {
				granted = r.Attr
				break
			}
			// The service bounds each wait: ask again.
		}
	}
	if locking && !f.node.owns() && !f.fsys.stamps.shows(f.ino, granted) {
		// A lock taken: what this mount cached of the file may predate the
		// last holder's writes on another mount, as NFS clients assume
		// too. Reread it: the engine's committed state, the kernel's pages
		// and attributes. (A file the mount owns no other mount has
		// reached, and one whose state is what the caches show (its
		// stamp, cachestamp.go) nobody changed since: their caches are
		// current.)
		if f.fsys.opts.Data != nil {
			if err := f.fsys.opts.Data.Open(ctx, f.ino); err != nil {
				return dataErrno(err)
			}
		}
		f.node.NotifyContent(0, 0)
		f.fsys.stamps.set(f.ino, granted)
	}
	if locking {
		f.revalidateSiblings()
	}
	if l.Flock {
		f.lockMu.Lock()
		f.flockOwner, f.hasFlock = owner, locking
		f.lockMu.Unlock()
	} else if locking {
		f.fsys.locks.held(owner, f.ino, true)
		f.lockMu.Lock()
		if !slices.Contains(f.posixOwners, owner) {
			f.posixOwners = append(f.posixOwners, owner)
		}
		f.lockMu.Unlock()
	}
	return 0
}

// maxSiblings bounds the names revalidateSiblings drops: a lock on a file in
// a large directory does not cost one notification per name.
const maxSiblings = 256

// revalidateSiblings drops the kernel's cached names next to the file, so
// that a lock holder sees the files another mount's holder created or
// removed (a database's journal) at its next lookup, not after the entry
// timeout.
func (f *fileHandle) revalidateSiblings() {
	_, parent := f.node.Parent()
	if parent == nil {
		return
	}
	if p, ok := parent.Operations().(*Node); ok && p.leased() {
		return // no other mount has changed its names: they would have recalled the lease
	}
	kids := parent.Children()
	if len(kids) > maxSiblings {
		return
	}
	for name := range kids {
		parent.NotifyEntry(name)
	}
}

// commitBeforeUnlock commits what was written to the file before a lock of
// it goes, so that the next holder, on any mount, reads it.
func (f *fileHandle) commitBeforeUnlock(ctx context.Context) error {
	if f.fsys.opts.Data == nil {
		return nil
	}
	return f.fsys.opts.Data.Flush(ctx, f.ino)
}

// releaseLocks is called at FLUSH (every close of a descriptor): the closing
// process's record locks on the file go, as POSIX wants, once what was
// written under them is committed (as at an unlock); they go even if that
// fails, whose error it returns. The caller holds the request's own context.
func (f *fileHandle) releaseLocks(ctx context.Context) error {
	owner, ok := f.fsys.locks.flushing.of(ctx)
	if !ok || !f.fsys.locks.holds(owner, f.ino) {
		return nil
	}
	kctx, done := killable(ctx)
	err := f.commitBeforeUnlock(kctx)
	done()
	f.unlockAll(owner, false)
	f.fsys.locks.held(owner, f.ino, false)
	return err
}

// releaseFileLocks is called at RELEASE (the last close of the open file):
// its flock goes, and its open file description locks, which the kernel
// owns by the open file. Record locks of processes taken through it went
// at their processes' closes already (FLUSH), so every record lock still
// held by an owner that locked through it is the description's own.
func (f *fileHandle) releaseFileLocks() {
	f.lockMu.Lock()
	owner, has := f.flockOwner, f.hasFlock
	owners := f.posixOwners
	f.hasFlock, f.posixOwners = false, nil
	f.lockMu.Unlock()
	if has {
		f.unlockAll(owner, true)
	}
	for _, o := range owners {
		if f.fsys.locks.holds(o, f.ino) {
			f.unlockAll(o, false)
			f.fsys.locks.held(o, f.ino, false)
		}
	}
}

// unlockTimeout bounds the release of a closed file's locks; past it the
// session's end releases them.
const unlockTimeout = 30 * time.Second

// unlockAll releases owner's locks of one kind on the file.
func (f *fileHandle) unlockAll(owner uint64, flock bool) {
	l := &metapb.FileLock{Session: f.fsys.opts.Session, Owner: owner, Flock: flock, Type: metapb.LockType_LOCK_UNLOCK, End: metapb.LockToEOF}
	if local, _ := f.node.lockOwned(l, false); local {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), unlockTimeout)
	defer cancel()
	_, err := f.fsys.meta.Lock(ctx, &metapb.LockRequest{Ino: f.ino, Lock: l})
	if err != nil {
		f.fsys.log.Warn("release of a closed file's locks failed; they go when the session ends", "ino", f.ino, "err", err)
	}
}

// rawFS passes between the kernel and the node API what the latter does not
// carry: the lock owner of FLUSH requests, the kernel's requests to clear
// set-user-ID (killpriv.go), and negative entries with a timeout.
type rawFS struct {
	fuse.RawFileSystem
	locks *lockTable
	kill  *reqNotes[bool] // requests to clear set-user-ID (killpriv.go)
}

// Lookup answers a missing name the node gave an entry timeout (one the
// directory's lease says is missing: Node.Lookup) with a negative entry,
// which the kernel caches that long.
func (r *rawFS) Lookup(cancel <-chan struct{}, h *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	st := r.RawFileSystem.Lookup(cancel, h, name, out)
	if st == fuse.ENOENT && out.EntryTimeout() > 0 {
		out.NodeId, out.Generation = 0, 0
		return fuse.OK
	}
	return st
}

// Flush hands the request's lock owner to fileHandle.Flush when it holds
// record locks.
func (r *rawFS) Flush(cancel <-chan struct{}, in *fuse.FlushIn) fuse.Status {
	if r.locks.holds(in.LockOwner, 0) {
		defer r.locks.flushing.note(cancel, in.LockOwner)()
	}
	return r.RawFileSystem.Flush(cancel, in)
}

// Locks of owned files. While the mount owns a file (own.go) no other
// session can reach it, so none holds or asks for a lock on it: the mount
// decides the file's locks itself, from those its own processes hold (kept
// in the node), and sends each change to meta behind, in order with its
// other calls; the recall of the directory's lease sends them before any
// other mount can look. A lock that must wait for another process's, and a
// change the mount cannot send behind, end this for the file: its lock
// calls go to meta from then on, after those sent behind.

// lockOwned decides l (normal) on the file if the mount owns it, and sends
// it behind; local is false when the caller must call meta itself (and
// from then on for good).
func (n *Node) lockOwned(l *metapb.FileLock, wait bool) (local bool, e syscall.Errno) {
	early := n.fsys.opts.Early
	if early == nil {
		return false, 0
	}
	n.lockMu.Lock()
	defer n.lockMu.Unlock()
	if n.locksShared {
		return false, 0
	}
	dir, id, owned := n.ownerLease()
	if !owned {
		n.locksShared = true
		return false, 0
	}
	if l.Type != metapb.LockType_LOCK_UNLOCK && metapb.ConflictingLock(n.locks, l) != nil {
		if !wait {
			return true, syscall.EAGAIN
		}
		n.locksShared = true // meta makes it wait, after the calls sent behind
		return false, 0
	}
	if !dir.sendUnderLease(id, func() bool {
		return early.LockBehind(&metapb.LockRequest{Ino: n.ino, Lock: l}, n.fsys.lostChange("lock", n))
	}) {
		n.locksShared = true
		return false, 0
	}
	n.locks = metapb.SetLock(n.locks, l)
	return true, 0
}

// testOwned answers F_GETLK for l (normal) on a file whose locks the mount
// decides itself: the lock in its way, and true; false if meta must.
func (n *Node) testOwned(l *metapb.FileLock) (*metapb.FileLock, bool) {
	n.lockMu.Lock()
	defer n.lockMu.Unlock()
	if n.locksShared || n.fsys.opts.Early == nil || !n.owns() {
		return nil, false
	}
	return metapb.ConflictingLock(n.locks, l), true
}
