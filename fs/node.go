package fs

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/rdmafs/rdmafs/internal/stripe"
	"github.com/rdmafs/rdmafs/meta/client"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// RootIno is the inode number of the root directory.
const RootIno = 1

// Data is the file I/O engine: it moves file bytes between the kernel and the
// chunkservers and commits them to the metadata service.
type Data interface {
	// Open is called when ino is opened: what the engine caches of the file's
	// committed state must be reread, so that the open sees every change
	// committed before it (close-to-open consistency).
	Open(ctx context.Context, ino uint64) error
	// Created is called instead of Open when this mount has just created
	// ino, empty, with layout l: the engine need not look its state up.
	Created(ino uint64, l *metapb.Layout)
	// Read reads into p from offset off of inode ino; a short count means end
	// of file.
	Read(ctx context.Context, ino uint64, p []byte, off int64) (int, error)
	// Write writes p at offset off of inode ino (buffered until Flush).
	Write(ctx context.Context, ino uint64, p []byte, off int64) (int, error)
	// Flush makes what was written to ino durable and committed, with the new
	// size and mtime, as close and fsync require.
	Flush(ctx context.Context, ino uint64) error
	// Sync is Flush for fsync: the commits it makes are durable at meta,
	// with everything answered before them, when it returns.
	Sync(ctx context.Context, ino uint64) error
	// Truncate drops buffered data of ino past size before the size changes.
	Truncate(ctx context.Context, ino uint64, size uint64) error
	// Truncated is called once the metadata service has answered the size
	// change Truncate prepared for (applied or refused).
	Truncated(ino uint64)
	// Size reports the size of ino as this mount sees it while it holds
	// writes not yet committed (false: the metadata service's is current).
	Size(ino uint64) (int64, bool)
	// WriteErrors returns how many writes of ino failed for good (their
	// data dropped) and the latest failure; a file description reports each
	// failure that happened while it was open once, at close or fsync, even
	// if another one's close or fsync met it first (as Linux's errseq).
	WriteErrors(ino uint64) (uint64, error)
	// Forget is called when the kernel no longer knows the regular file
	// ino: nothing has it open. The engine may drop what it keeps of it
	// once what was written is committed.
	Forget(ino uint64)
	// ObserveCommits registers the functions called before each commit of
	// a file's written data is sent to meta (begin) and after it returned
	// (end, with meta's reply, nil if it failed). It is called once, before
	// the file system serves.
	ObserveCommits(begin func(ino uint64), end func(ino uint64, r *metapb.CommitStripesReply))
}

// Options configure the file system.
type Options struct {
	// Meta is the metadata service.
	Meta metapb.MetaClient
	// Session is the client session opens are recorded in.
	Session uint64
	// Root is the inode shown as the mount's root (default RootIno): the
	// subdirectory of a mount token, which meta names at session start.
	Root uint64
	// Data moves file bytes.
	Data Data
	// AttrTimeout and EntryTimeout are how long the kernel caches attributes
	// and names (default 1s each).
	AttrTimeout, EntryTimeout time.Duration
	// Logger receives errors that do not reach an application (default: none).
	Logger *slog.Logger
	// DropBehind is how many bytes a file handle writes in sequence before
	// the kernel's copy of what it writes is dropped from the page cache as
	// each write completes (0: never). A streaming writer then reuses the
	// same few pages instead of filling memory with data it will not read,
	// as RWF_DONTCACHE does for local files.
	DropBehind int64
	// Early, when set, lets the mount answer creates and unlinks before
	// the metadata service has applied them (early.go); nil: every
	// namespace change waits for meta.
	Early Early
	// MetricsAddr is the address the mount serves its metrics on, the
	// value of MetricsXattr ("": metrics off).
	MetricsAddr string
}

// FS is a mounted rdmafs.
type FS struct {
	opts    Options
	meta    metapb.MetaClient
	callers *callers
	log     *slog.Logger

	dropping  atomic.Int32   // page cache invalidations in flight (drop-behind)
	earlyLost atomic.Uint64  // changes answered early that meta refused (early.go)
	releases  releaser       // closed files' opens, on their way to meta
	locks     lockTable      // the file locks this mount's processes hold
	kill      reqNotes[bool] // requests to clear set-user-ID (killpriv.go)
	stats     Stats
	leases    leaseTable  // the directory leases the mount holds (lease.go)
	owned     ownTable    // the files whose attributes the mount knows (own.go)
	stamps    cacheStamps // the state the caches of each file show (cachestamp.go)

	// Read replies, so that a read costs no allocation.
	inPlace      sync.Pool // of *inPlaceResult
	dataResults  sync.Pool // of *dataResult
	readContexts sync.Pool // of *readContext
}

// New returns the file system and its root node.
func New(opts Options) (*FS, *Node) {
	if opts.AttrTimeout == 0 {
		opts.AttrTimeout = time.Second
	}
	if opts.EntryTimeout == 0 {
		opts.EntryTimeout = time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	f := &FS{opts: opts, meta: opts.Meta, callers: newCallers(opts.Session), log: opts.Logger}
	f.releases = releaser{meta: opts.Meta, session: opts.Session, early: opts.Early, log: opts.Logger}
	if opts.Data != nil {
		opts.Data.ObserveCommits(f.beginCommit, f.endCommit)
	}
	if opts.Early != nil {
		f.startLeases()
	}
	root := opts.Root
	if root == 0 {
		root = RootIno
	}
	return f, &Node{fsys: f, ino: root}
}

// Node is an inode of the file system.
type Node struct {
	gofs.Inode
	fsys *FS
	ino  uint64

	mu        sync.Mutex
	opened    bool  // opened before in this mount
	openMtime int64 // mtime and size at the last open
	openSize  uint64
	// noCapsUntil is when the cached answer "no security.capability"
	// expires; see Getxattr. xattrGen counts changes of extended
	// attributes through this mount, so that an answer fetched while one
	// was being made is not cached.
	noCapsUntil time.Time
	xattrGen    uint64
	// dirAttr is a directory's attributes as a change made through this
	// mount left them (create, unlink), valid until dirAttrUntil: the
	// kernel drops its copy after such a change and asks again at once
	// (for the permission check of the next one), and this answers it.
	dirAttr      *metapb.Attr
	dirAttrUntil time.Time
	dirGen       uint64 // counts changes through this mount, so that a reply overtaken by one is not kept
	// reserved are the names of this directory meta holds for the mount,
	// with when the hold stops being usable (early.go).
	reserved map[string]reservedName
	// lastAttr is a directory's attributes as meta last reported them to
	// this mount: an unlink answered early (early.go) derives what the
	// kernel's next getattr gets from them.
	lastAttr *metapb.Attr
	// lease is the directory's lease, if the mount holds it, and
	// leaseAskAfter when a lookup may ask for it again (lease.go).
	lease         *dirLease
	leaseAskAfter time.Time
	// createdIn and createdLease are, for a file created under a
	// directory lease, the directory and the lease (lease.go).
	createdIn     *Node
	createdLease  uint64
	createdInline uint64 // its layout's inline size
	// flushing counts the flushes behind of a directory's files closed
	// under its lease, by inode (lease.go).
	flushing map[uint64]int
	// owned is what the mount knows of the attributes of a file it
	// created under a lease (own.go).
	owned ownState
	// lockMu serializes the lock changes of an owned file the mount
	// decides itself; locks are its processes' locks on it, and
	// locksShared says meta decides them (locks.go).
	lockMu      sync.Mutex
	locks       []*metapb.FileLock
	locksShared bool
}

// dirChange notes a change to the directory through this mount: it forgets
// the attributes kept, and returns the change's number for noteDirAttr.
func (n *Node) dirChange() uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.dirChangeLocked()
}

// dirChangeLocked is dirChange with n.mu held. The directory's attributes
// under its lease are unknown until the change's outcome is.
func (n *Node) dirChangeLocked() uint64 {
	n.dirGen++
	n.dirAttr = nil
	if n.lease != nil {
		n.lease.attr = nil
	}
	return n.dirGen
}

// noteDirAttr keeps a directory's attributes returned by change gen, unless
// another change began since (its outcome may be older than the other's).
func (n *Node) noteDirAttr(gen uint64, a *metapb.Attr) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if a == nil || a.Ino != n.ino || n.dirGen != gen {
		return
	}
	n.dirAttr, n.dirAttrUntil, n.lastAttr = a, time.Now().Add(n.fsys.opts.AttrTimeout), a
}

// noteRepliedDirAttr is noteDirAttr for the attributes meta returned to
// change gen: under the lease, they are also the directory's current ones.
func (n *Node) noteRepliedDirAttr(gen uint64, a *metapb.Attr) {
	n.noteDirAttr(gen, a)
	if a != nil && a.Ino == n.ino {
		n.mu.Lock()
		n.leaseAttrLocked(gen, a)
		n.mu.Unlock()
	}
}

// leaseAttrLocked keeps a as the directory's current attributes under its
// lease, unless a change began since change gen (caller holds n.mu).
func (n *Node) leaseAttrLocked(gen uint64, a *metapb.Attr) {
	if n.lease != nil && n.dirGen == gen {
		n.lease.attr = a
	}
}

// changes returns the count of changes to the directory begun through this
// mount, for noteFetchedDirAttr.
func (n *Node) changes() uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.dirGen
}

// noteFetchedDirAttr keeps a directory's attributes meta returned to a call
// sent when gen changes had begun: as the base of early changes, and under
// the lease as its current attributes, unless a change began since (the
// reply may predate it). Calls sent behind in the directory reach meta
// before such a call (meta/client/behind.go), so the reply shows them.
func (n *Node) noteFetchedDirAttr(gen uint64, a *metapb.Attr) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.lastAttr = a
	n.leaseAttrLocked(gen, a)
}

// cachedDirAttr returns the attributes noteDirAttr recorded, once: they
// answer the kernel's one getattr after the change, and a later one asks
// the service.
func (n *Node) cachedDirAttr() *metapb.Attr {
	n.mu.Lock()
	defer n.mu.Unlock()
	a := n.dirAttr
	n.dirAttr = nil
	if a == nil || time.Now().After(n.dirAttrUntil) {
		return nil
	}
	return a
}

// capsXattr is the extended attribute holding file capabilities. The kernel
// asks for it before every write(2), to know whether the write must remove it.
const capsXattr = "security.capability"

var (
	_ gofs.NodeLookuper       = (*Node)(nil)
	_ gofs.NodeGetattrer      = (*Node)(nil)
	_ gofs.NodeSetattrer      = (*Node)(nil)
	_ gofs.NodeCreater        = (*Node)(nil)
	_ gofs.NodeMknoder        = (*Node)(nil)
	_ gofs.NodeMkdirer        = (*Node)(nil)
	_ gofs.NodeSymlinker      = (*Node)(nil)
	_ gofs.NodeReadlinker     = (*Node)(nil)
	_ gofs.NodeLinker         = (*Node)(nil)
	_ gofs.NodeUnlinker       = (*Node)(nil)
	_ gofs.NodeRmdirer        = (*Node)(nil)
	_ gofs.NodeRenamer        = (*Node)(nil)
	_ gofs.NodeOpendirHandler = (*Node)(nil)
	_ gofs.NodeGetxattrer     = (*Node)(nil)
	_ gofs.NodeSetxattrer     = (*Node)(nil)
	_ gofs.NodeListxattrer    = (*Node)(nil)
	_ gofs.NodeRemovexattrer  = (*Node)(nil)
	_ gofs.NodeStatfser       = (*Node)(nil)
	_ gofs.NodeOpener         = (*Node)(nil)
)

// errno converts an error into the errno for the kernel. A cancelled
// operation is EINTR, never EIO.
func errno(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	if errors.Is(err, context.Canceled) {
		return syscall.EINTR
	}
	return client.Errno(err)
}

// dataErrno is errno for reads, writes, flushes and fsyncs: an application
// gets from them only what a local disk would give it. Errors of the
// machinery behind (a connection refused or reset, a timeout, a protocol
// status) are EIO.
func dataErrno(err error) syscall.Errno {
	switch e := errno(err); e {
	case 0, syscall.EIO, syscall.ENOSPC, syscall.EDQUOT, syscall.EINTR, syscall.EFBIG, syscall.EINVAL, syscall.EBADF:
		return e
	default:
		return syscall.EIO
	}
}

// killable detaches an operation from the kernel's interrupts, except when
// the calling process is being killed. A signal to the calling thread (Go
// delivers them for preemption all the time) makes the kernel send
// FUSE_INTERRUPT, which cancels the request's context; applications do not
// expect EINTR from file operations on a local disk, so an operation goes on
// regardless, bounded by the data engine's and the meta client's timeouts.
// But a process with a fatal signal pending (SIGKILL, or any signal whose
// action is to terminate) cannot exit until its request is answered, so the
// returned context is cancelled, and the operation gives up, once the caller
// is found dying (a local disk's waits are killable the same way). The
// caller is checked when the kernel interrupts the request (noticed once
// the operation has lasted interruptWatch) and, because
// some requests are never interrupted (the parts of an asynchronous direct
// I/O), whenever the operation has lasted longWait. done must be called
// when the operation ends.
func killable(ctx context.Context) (context.Context, func()) {
	fc, ok := ctx.(*fuse.Context)
	if !ok {
		// Not a request's own context: one killable already (an operation
		// calling another), or a caller's outside FUSE. Keep it as it is.
		return ctx, func() {}
	}
	kctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	// The request's context is go-fuse's, on which context.AfterFunc
	// would start a goroutine per operation: one timer starts the watch
	// only for an operation still running after interruptWatch (most end
	// sooner). It then checks the caller at the kernel's interrupt, or
	// once the operation has lasted longWait.
	watch := time.AfterFunc(interruptWatch, func() {
		long := time.NewTimer(longWait - interruptWatch)
		defer long.Stop()
		select {
		case <-ctx.Done():
		case <-long.C:
		case <-kctx.Done():
			return
		}
		watchDying(kctx, cancel, fc.Pid)
	})
	return kctx, func() {
		watch.Stop()
		cancel()
	}
}

// interruptWatch is how long an operation runs before it watches for the
// kernel's interrupt: a killed caller's request notices it that much later
// at most.
const interruptWatch = 20 * time.Millisecond

// longWait is how long an operation runs before it checks, from then on
// every dyingPoll, whether its caller is being killed.
const longWait = time.Second

// dyingPoll is how often an interrupted request checks whether its caller
// is being killed: the kernel interrupts a request once, and the fatal
// signal may come later.
const dyingPoll = 100 * time.Millisecond

// watchDying cancels ctx once the thread tid has a fatal signal pending or
// is gone, checking until ctx ends.
func watchDying(ctx context.Context, cancel context.CancelFunc, tid uint32) {
	t := time.NewTicker(dyingPoll)
	defer t.Stop()
	for {
		if dying(tid) {
			cancel()
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// dying reports whether thread tid is exiting: gone, a zombie, or with
// SIGKILL pending (the kernel turns every fatal signal into a SIGKILL of
// all the process's threads when it is sent).
func dying(tid uint32) bool {
	b, err := os.ReadFile("/proc/" + strconv.FormatUint(uint64(tid), 10) + "/status")
	if err != nil {
		return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH)
	}
	return dyingStatus(string(b))
}

// dyingStatus is dying for the text of /proc/TID/status.
func dyingStatus(status string) bool {
	const sigkill = 1 << (9 - 1)
	for line := range strings.Lines(status) {
		key, val, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		val = strings.TrimSpace(val)
		switch key {
		case "State":
			if strings.HasPrefix(val, "Z") || strings.HasPrefix(val, "X") {
				return true
			}
		case "SigPnd", "ShdPnd":
			if mask, err := strconv.ParseUint(val, 16, 64); err == nil && mask&sigkill != 0 {
				return true
			}
		}
	}
	return false
}

// readContext is the context of a file read. It carries no cancellation: a
// read waits for chunkservers at most their stall timeout (then it rebuilds
// from the others), and making every read killable would cost a goroutine
// and allocations per read. A read that must wait longer — on the metadata
// service for a stripe map, or for buffer memory — asks Killable for a
// context its caller's death cancels. readContexts are pooled: a read
// allocates nothing.
type readContext struct {
	fc *fuse.Context
}

// Deadline implements context.Context: none.
func (r *readContext) Deadline() (time.Time, bool) { return time.Time{}, false }

// Done implements context.Context: never.
func (r *readContext) Done() <-chan struct{} { return nil }

// Err implements context.Context: never.
func (r *readContext) Err() error { return nil }

// Value implements context.Context with the request's values (its caller).
func (r *readContext) Value(key any) any {
	if r.fc == nil {
		return nil
	}
	return r.fc.Value(key)
}

// Killable returns a context that ends when the calling process is being
// killed (see killable), for a wait that may be long; done releases it.
func (r *readContext) Killable() (context.Context, func()) {
	if r.fc == nil {
		return context.Background(), func() {}
	}
	return killable(r.fc)
}

// readContextOf returns a pooled readContext for the request ctx; put it
// back with fsys.readContexts.Put once the read is over.
func (fsys *FS) readContextOf(ctx context.Context) *readContext {
	r, _ := fsys.readContexts.Get().(*readContext)
	if r == nil {
		r = &readContext{}
	}
	r.fc, _ = ctx.(*fuse.Context)
	return r
}

// releaseReadContext returns r to the pool.
func (fsys *FS) releaseReadContext(r *readContext) {
	r.fc = nil
	fsys.readContexts.Put(r)
}

// fillAttr converts the service's attributes into the kernel's.
func fillAttr(a *metapb.Attr, out *fuse.Attr) {
	out.Ino = a.Ino
	out.Size = a.Size
	out.Blocks = (a.Size + 511) / 512
	if a.StoredKnown {
		out.Blocks = (a.Stored + 511) / 512
	}
	out.Mode = a.Mode
	out.Nlink = a.Nlink
	out.Uid, out.Gid = a.Uid, a.Gid
	out.Rdev = a.Rdev
	out.Blksize = 4096
	if l := a.Layout; l != nil && l.Unit > 0 && l.Unit <= 1<<30 {
		out.Blksize = uint32(l.Unit)
	}
	out.Atime, out.Atimensec = uint64(a.AtimeNs/1e9), uint32(a.AtimeNs%1e9)
	out.Mtime, out.Mtimensec = uint64(a.MtimeNs/1e9), uint32(a.MtimeNs%1e9)
	out.Ctime, out.Ctimensec = uint64(a.CtimeNs/1e9), uint32(a.CtimeNs%1e9)
}

// fillAttr converts the service's attributes of a file into the kernel's,
// with the size this mount's uncommitted writes give the file: a process that
// wrote sees the file that long, before close as after.
func (fsys *FS) fillAttr(a *metapb.Attr, out *fuse.Attr) {
	size, dirty := fsys.dataSize(a.Ino)
	fsys.fillAttrSized(a, out, size, dirty)
}

// dataSize is Data.Size: the size of ino with this mount's uncommitted
// writes, if it holds some.
func (fsys *FS) dataSize(ino uint64) (int64, bool) {
	if fsys.opts.Data == nil {
		return 0, false
	}
	return fsys.opts.Data.Size(ino)
}

// fillAttrSized is fillAttr with the engine's size read already (dirty:
// the mount holds uncommitted writes that make the file size long).
func (fsys *FS) fillAttrSized(a *metapb.Attr, out *fuse.Attr, size int64, dirty bool) {
	fillAttr(a, out)
	if !dirty || a.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return
	}
	// Uncommitted writes past the committed size count as stored.
	out.Blocks += (max(uint64(size), a.Size) - a.Size + 511) / 512
	out.Size = uint64(size)
}

// uncommitted reports whether the mount holds writes of ino not yet
// committed.
func (fsys *FS) uncommitted(ino uint64) bool {
	if fsys.opts.Data == nil {
		return false
	}
	_, ok := fsys.opts.Data.Size(ino)
	return ok
}

// recheckAttr returns a, meta's attributes of a file fetched by a call sent
// while the mount held uncommitted writes of it (dirty), or fetched again
// if those writes' commit finished while the call was out (a close's flush
// behind, a background flush): a may predate the commit, and the size this
// mount kept is gone.
func (fsys *FS) recheckAttr(ctx context.Context, a *metapb.Attr, dirty bool) *metapb.Attr {
	if !dirty || fsys.uncommitted(a.Ino) {
		return a
	}
	if r, err := fsys.meta.GetAttr(ctx, &metapb.GetAttrRequest{Ino: a.Ino, LeaseSession: fsys.opts.Session}); err == nil {
		return r.Attr
	}
	return a
}

// syncMeta waits until the metadata operations this mount saw answered are
// durable (the meta client skips the call when none was made since the
// last).
func (fsys *FS) syncMeta(ctx context.Context) syscall.Errno {
	if _, err := fsys.meta.Sync(ctx, &metapb.SyncRequest{}); err != nil {
		return errno(err)
	}
	return 0
}

// entry fills out for a new or found entry and returns its inode, reusing the
// kernel's inode for a number it already knows.
func (n *Node) entry(ctx context.Context, name string, a *metapb.Attr, out *fuse.EntryOut) *gofs.Inode {
	n.fsys.fillAttr(a, &out.Attr)
	return n.filledEntry(ctx, name, a, out)
}

// filledEntry is entry with out.Attr filled already.
func (n *Node) filledEntry(ctx context.Context, name string, a *metapb.Attr, out *fuse.EntryOut) *gofs.Inode {
	out.SetEntryTimeout(n.entryTimeout(name, a.Mode))
	out.SetAttrTimeout(n.fsys.opts.AttrTimeout)
	child := &Node{fsys: n.fsys, ino: a.Ino}
	return n.NewInode(ctx, child, gofs.StableAttr{Mode: a.Mode & syscall.S_IFMT, Ino: a.Ino, Gen: a.Generation})
}

// Lookup implements gofs.NodeLookuper. With early creates on, a missing
// name is reserved for the mount (early.go).
func (n *Node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	early := n.fsys.opts.Early != nil
	if early {
		if missing, ttl := n.leaseMissing(name); missing {
			// With a timeout, rawFS makes it a negative entry the kernel
			// caches that long.
			n.fsys.stats.KeptAnswers.Add(1)
			out.SetEntryTimeout(ttl)
			return nil, syscall.ENOENT
		}
	}
	if _, o := n.ownedChild(name); o.attr != nil {
		n.fsys.stats.KeptAnswers.Add(1)
		n.fsys.fillAttrSized(o.attr, &out.Attr, o.size, o.dirty)
		return n.filledEntry(ctx, name, o.attr, out), 0
	}
	n.fsys.stats.MetaAnswers.Add(1)
	ctx, done := killable(ctx)
	defer done()
	lease := early && n.wantLease()
	var known uint64 // the inode the kernel knows at name, if any
	var child *Node
	var gen uint64
	fetch := false
	if ch := n.GetChild(name); ch != nil {
		known = ch.StableAttr().Ino
		if child, _ = ch.Operations().(*Node); child != nil {
			gen, fetch = child.fetchGen()
		}
	}
	dirty := known != 0 && n.fsys.uncommitted(known)
	sent := time.Now()
	r, err := n.fsys.meta.Lookup(ctx, &metapb.LookupRequest{Caller: n.fsys.callers.of(ctx), Parent: n.ino, Name: name,
		Reserve: early, Lease: lease})
	if err != nil {
		return nil, errno(err)
	}
	if r.Reserved {
		n.noteReserved(name, sent, r)
		if r.Lease != nil {
			n.installLease(r.Lease, r)
		} else if lease {
			n.mu.Lock()
			n.leaseAskAfter = time.Now().Add(leaseBackoff)
			n.mu.Unlock()
		}
		return nil, syscall.ENOENT
	}
	if r.Attr == nil {
		return nil, syscall.EIO
	}
	if r.Attr.Ino == known {
		r.Attr = n.fsys.recheckAttr(ctx, r.Attr, dirty)
		if fetch {
			child.noteFetched(gen, r.Attr)
		}
	}
	return n.entry(ctx, name, r.Attr, out), 0
}

// Getattr implements gofs.NodeGetattrer.
func (n *Node) Getattr(ctx context.Context, _ gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	if a := n.cachedDirAttr(); a != nil {
		n.fsys.stats.KeptAnswers.Add(1)
		n.fsys.fillAttr(a, &out.Attr)
		out.SetTimeout(n.fsys.opts.AttrTimeout)
		return 0
	}
	if a := n.leaseAttr(); a != nil {
		n.fsys.stats.KeptAnswers.Add(1)
		n.fsys.fillAttr(a, &out.Attr)
		out.SetTimeout(n.fsys.opts.AttrTimeout)
		return 0
	}
	if o := n.ownedAttr(); o.attr != nil {
		n.fsys.stats.KeptAnswers.Add(1)
		n.fsys.fillAttrSized(o.attr, &out.Attr, o.size, o.dirty)
		out.SetTimeout(n.fsys.opts.AttrTimeout)
		return 0
	}
	n.fsys.stats.MetaAnswers.Add(1)
	ctx, done := killable(ctx)
	defer done()
	dirty := n.fsys.uncommitted(n.ino)
	gen := n.changes()
	ownGen, fetch := n.fetchGen()
	r, err := n.fsys.meta.GetAttr(ctx, &metapb.GetAttrRequest{Ino: n.ino, LeaseSession: n.fsys.opts.Session})
	if err != nil {
		return errno(err)
	}
	r.Attr = n.fsys.recheckAttr(ctx, r.Attr, dirty)
	if r.Attr.Mode&syscall.S_IFMT == syscall.S_IFDIR {
		n.noteFetchedDirAttr(gen, r.Attr)
	} else if fetch {
		n.noteFetched(ownGen, r.Attr)
	}
	n.fsys.fillAttr(r.Attr, &out.Attr)
	out.SetTimeout(n.fsys.opts.AttrTimeout)
	return 0
}

// Setattr implements gofs.NodeSetattrer.
func (n *Node) Setattr(ctx context.Context, fh gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if a := n.chownOwned(ctx, in); a != nil {
		n.fsys.fillAttr(a, &out.Attr)
		out.SetTimeout(n.fsys.opts.AttrTimeout)
		return 0
	}
	ctx, done := killable(ctx)
	defer done()
	n.dirChange() // a change the kept attributes do not show
	req := &metapb.SetAttrRequest{Caller: n.fsys.callers.of(ctx), Ino: n.ino}
	if m, ok := in.GetMode(); ok {
		req.SetMode, req.Mode = true, m&0o7777
	} else if in.Valid&fuse.FATTR_KILL_SUIDGID != 0 {
		// A truncate by a caller without CAP_FSETID (killpriv.go).
		var cur fuse.AttrOut
		if e := n.Getattr(ctx, fh, &cur); e != 0 {
			return e
		}
		if mode := killedMode(cur.Mode); mode != cur.Mode {
			req.SetMode, req.Mode = true, mode&0o7777
		}
	}
	if u, ok := in.GetUID(); ok {
		req.SetUid, req.Uid = true, u
	}
	if g, ok := in.GetGID(); ok {
		req.SetGid, req.Gid = true, g
	}
	if req.SetMode || req.SetUid || req.SetGid {
		// New files would take the directory's old group and mode bits.
		n.dropReserved()
		n.dropLease()
	}
	if in.Valid&fuse.FATTR_ATIME_NOW != 0 {
		req.SetAtime, req.AtimeNow = true, true
	} else if t, ok := in.GetATime(); ok {
		req.SetAtime, req.AtimeNs = true, t.UnixNano()
	}
	if in.Valid&fuse.FATTR_MTIME_NOW != 0 {
		req.SetMtime, req.MtimeNow = true, true
	} else if t, ok := in.GetMTime(); ok {
		req.SetMtime, req.MtimeNs = true, t.UnixNano()
	}
	if t, ok := in.GetCTime(); ok {
		req.SetCtime, req.CtimeNs = true, t.UnixNano()
	}
	if d := n.fsys.opts.Data; d != nil && (req.SetMtime || req.SetMode || req.SetUid || req.SetGid) {
		// The commit of data written before this call sets mtime and
		// clears set-user-ID: it goes first, so that what the application
		// set afterwards (futimens, fchmod, as tar and cp -a do) stays.
		if _, dirty := d.Size(n.ino); dirty {
			if err := d.Flush(ctx, n.ino); err != nil {
				return dataErrno(err)
			}
		}
	}
	if size, ok := in.GetSize(); ok {
		req.SetSize, req.Size = true, size
		if _, open := fh.(*fileHandle); open {
			req.SessionId = n.fsys.opts.Session // ftruncate: the open descriptor grants it
		}
		if d := n.fsys.opts.Data; d != nil {
			if err := d.Truncate(ctx, n.ino, size); err != nil {
				return errno(err)
			}
		}
	}
	n.beginChange()
	r, err := n.fsys.meta.SetAttr(ctx, req)
	n.endChange(r.GetAttr())
	n.fsys.stamps.set(n.ino, nil) // changed, by a call that names no state it replaced
	if d := n.fsys.opts.Data; d != nil && req.SetSize {
		d.Truncated(n.ino)
	}
	if err != nil {
		return errno(err)
	}
	n.fsys.fillAttr(r.Attr, &out.Attr)
	out.SetTimeout(n.fsys.opts.AttrTimeout)
	return 0
}

// Create implements gofs.NodeCreater: the file is created and opened in one
// transaction. The kernel has applied the umask to mode already.
func (n *Node) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	if ino, fh, ok := n.createEarly(ctx, name, flags, mode, out); ok {
		return ino, fh, directOpenFlags(flags), 0
	}
	ctx, done := killable(ctx)
	defer done()
	gen, lease := n.dirChange(), n.leaseID()
	r, err := n.fsys.meta.Create(ctx, &metapb.CreateRequest{
		Caller: n.fsys.callers.of(ctx), Parent: n.ino, Name: name, Mode: mode & 0o7777,
		Exclusive: flags&syscall.O_EXCL != 0, SessionId: n.fsys.opts.Session, OpenFlags: flags,
	})
	if err != nil {
		return nil, nil, 0, errno(err)
	}
	n.leaseNote(lease, name, true)
	n.noteRepliedDirAttr(gen, r.Parent)
	if r.Created {
		ino, fh := n.newFile(ctx, name, r.Attr, flags, out)
		return ino, fh, directOpenFlags(flags), 0
	}
	ino := n.entry(ctx, name, r.Attr, out)
	child, _ := ino.Operations().(*Node)
	if d := n.fsys.opts.Data; d != nil {
		if err := d.Open(ctx, r.Attr.Ino); err != nil {
			return nil, nil, 0, errno(err)
		}
	}
	return ino, n.fsys.newHandle(child, r.Attr.Ino, flags), directOpenFlags(flags), 0
}

// newFile answers a create that made the new, empty file a (by meta, or
// by this mount early): its entry, and an open handle the data engine
// knows empty.
func (n *Node) newFile(ctx context.Context, name string, a *metapb.Attr, flags uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle) {
	ino := n.entry(ctx, name, a, out)
	child, _ := ino.Operations().(*Node)
	if child != nil {
		// A new file has no file capabilities: its first write needs no
		// lookup of them (see Getxattr).
		child.mu.Lock()
		child.noCapsUntil = time.Now().Add(n.fsys.opts.AttrTimeout)
		child.mu.Unlock()
	}
	if d := n.fsys.opts.Data; d != nil {
		d.Created(a.Ino, a.Layout)
	}
	return ino, n.fsys.newHandle(child, a.Ino, flags)
}

// Mknod implements gofs.NodeMknoder.
func (n *Node) Mknod(ctx context.Context, name string, mode uint32, dev uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	ctx, done := killable(ctx)
	defer done()
	n.dirChange() // a change the kept attributes do not show
	lease := n.leaseID()
	r, err := n.fsys.meta.Mknod(ctx, &metapb.MknodRequest{Caller: n.fsys.callers.of(ctx), Parent: n.ino, Name: name, Mode: mode, Rdev: dev})
	if err != nil {
		return nil, errno(err)
	}
	n.leaseNote(lease, name, true)
	return n.entry(ctx, name, r.Attr, out), 0
}

// Mkdir implements gofs.NodeMkdirer.
func (n *Node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	ctx, done := killable(ctx)
	defer done()
	n.dirChange() // a change the kept attributes do not show
	lease := n.leaseID()
	r, err := n.fsys.meta.Mkdir(ctx, &metapb.MkdirRequest{Caller: n.fsys.callers.of(ctx), Parent: n.ino, Name: name, Mode: mode & 0o7777})
	if err != nil {
		return nil, errno(err)
	}
	n.leaseNote(lease, name, true)
	return n.entry(ctx, name, r.Attr, out), 0
}

// Symlink implements gofs.NodeSymlinker.
func (n *Node) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	ctx, done := killable(ctx)
	defer done()
	n.dirChange() // a change the kept attributes do not show
	lease := n.leaseID()
	r, err := n.fsys.meta.Symlink(ctx, &metapb.SymlinkRequest{Caller: n.fsys.callers.of(ctx), Parent: n.ino, Name: name, Target: target})
	if err != nil {
		return nil, errno(err)
	}
	n.leaseNote(lease, name, true)
	return n.entry(ctx, name, r.Attr, out), 0
}

// Readlink implements gofs.NodeReadlinker.
func (n *Node) Readlink(ctx context.Context) ([]byte, syscall.Errno) {
	ctx, done := killable(ctx)
	defer done()
	r, err := n.fsys.meta.Readlink(ctx, &metapb.ReadlinkRequest{Ino: n.ino})
	if err != nil {
		return nil, errno(err)
	}
	return []byte(r.Target), 0
}

// Link implements gofs.NodeLinker.
func (n *Node) Link(ctx context.Context, target gofs.InodeEmbedder, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	ctx, done := killable(ctx)
	defer done()
	n.dirChange() // a change the kept attributes do not show
	t, ok := target.(*Node)
	if !ok {
		return nil, syscall.EXDEV
	}
	t.settle(ctx)
	lease := n.leaseID()
	r, err := n.fsys.meta.Link(ctx, &metapb.LinkRequest{Caller: n.fsys.callers.of(ctx), Ino: t.ino, NewParent: n.ino, NewName: name})
	if err != nil {
		return nil, errno(err)
	}
	n.leaseNote(lease, name, true)
	return n.entry(ctx, name, r.Attr, out), 0
}

// Unlink implements gofs.NodeUnlinker.
func (n *Node) Unlink(ctx context.Context, name string) syscall.Errno {
	if n.unlinkEarly(ctx, name) {
		return 0
	}
	ctx, done := killable(ctx)
	defer done()
	gen, lease := n.dirChange(), n.leaseID()
	if ch := n.GetChild(name); ch != nil {
		if c, ok := ch.Operations().(*Node); ok {
			c.disown() // its link count drops
		}
	}
	r, err := n.fsys.meta.Unlink(ctx, &metapb.UnlinkRequest{Caller: n.fsys.callers.of(ctx), Parent: n.ino, Name: name})
	if err != nil {
		return errno(err)
	}
	n.leaseNote(lease, name, false)
	n.noteRepliedDirAttr(gen, r.Parent)
	return 0
}

// Rmdir implements gofs.NodeRmdirer.
func (n *Node) Rmdir(ctx context.Context, name string) syscall.Errno {
	ctx, done := killable(ctx)
	defer done()
	n.dirChange() // a change the kept attributes do not show
	if err := n.waitChild(ctx, name); err != nil {
		return errno(err)
	}
	lease := n.leaseID()
	_, err := n.fsys.meta.Rmdir(ctx, &metapb.RmdirRequest{Caller: n.fsys.callers.of(ctx), Parent: n.ino, Name: name})
	if err != nil {
		return errno(err)
	}
	n.leaseNote(lease, name, false)
	if ch := n.GetChild(name); ch != nil {
		if dir, ok := ch.Operations().(*Node); ok {
			dir.dropLease() // of a directory that is gone
		}
	}
	return 0
}

// Rename implements gofs.NodeRenamer, with renameat2 flags.
func (n *Node) Rename(ctx context.Context, name string, newParent gofs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	ctx, done := killable(ctx)
	defer done()
	n.dirChange() // a change the kept attributes do not show
	p, ok := newParent.(*Node)
	if !ok {
		return syscall.EXDEV
	}
	p.dirChange()
	if err := p.waitChild(ctx, newName); err != nil { // a directory it replaces
		return errno(err)
	}
	if ch := p.GetChild(newName); ch != nil {
		if c, ok := ch.Operations().(*Node); ok {
			c.disown() // replaced (its link count drops) or exchanged
		}
	}
	if ch := n.GetChild(name); ch != nil {
		if c, ok := ch.Operations().(*Node); ok {
			c.settle(ctx)
		}
	}
	from, to := n.leaseID(), p.leaseID()
	_, err := n.fsys.meta.Rename(ctx, &metapb.RenameRequest{Caller: n.fsys.callers.of(ctx), Parent: n.ino, Name: name, NewParent: p.ino, NewName: newName, Flags: flags})
	if err != nil {
		return errno(err)
	}
	// An exchange leaves both names in place.
	n.leaseNote(from, name, flags&unix.RENAME_EXCHANGE != 0)
	p.leaseNote(to, newName, true)
	// The kernel moves its entries, with their times: one given for longer
	// than the entry timeout under a lease would outlive the lease there.
	if moved, replaced := n.forgetLong(name), p.forgetLong(newName); moved || replaced {
		go func() {
			p.NotifyEntry(newName)
			n.NotifyEntry(name)
		}()
	}
	return 0
}

// LayoutXattr is the virtual extended attribute of a file's layout, or of
// the layout a directory gives new files, as stripe.Layout formats it
// ("4+2/1048576/inline=65536"); setting it on a directory (its owner or
// root) changes what new files below it get, as CephFS's ceph.dir.layout.
// It is not listed by listxattr.
const LayoutXattr = "rdmafs.layout"

// Getxattr implements gofs.NodeGetxattrer.
//
// The kernel asks for security.capability before every write(2) to the file
// (to know whether the write must drop it); a file without one is remembered
// for the attribute timeout, so that writes cost no metadata round trip.
// Setting or removing an extended attribute through this mount forgets it at
// once; one set through another mount shows within the attribute timeout, as
// other attributes do.
func (n *Node) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	ctx, done := killable(ctx)
	defer done()
	if size, e, ok := n.infoXattr(ctx, attr, dest); ok {
		return size, e
	}
	if size, e, ok := n.relayoutXattr(ctx, attr, dest); ok {
		return size, e
	}
	if size, e, ok := n.snapshotXattr(ctx, attr, dest); ok {
		return size, e
	}
	if size, e, ok := n.trashXattr(ctx, attr, dest); ok {
		return size, e
	}
	if size, e, ok := n.quotaXattr(ctx, attr, dest); ok {
		return size, e
	}
	if attr == MetricsXattr {
		return n.metricsXattr(dest)
	}
	if attr == LayoutXattr {
		r, err := n.fsys.meta.GetLayout(ctx, &metapb.GetLayoutRequest{Ino: n.ino})
		if err != nil {
			return 0, errno(err)
		}
		v := r.Layout.Stripe().String()
		if len(dest) < len(v) {
			return uint32(len(v)), syscall.ERANGE
		}
		return uint32(copy(dest, v)), 0
	}
	caps := attr == capsXattr
	var start time.Time
	var gen uint64
	if caps {
		start = time.Now()
		n.mu.Lock()
		cached, g := start.Before(n.noCapsUntil), n.xattrGen
		n.mu.Unlock()
		if cached {
			return 0, syscall.ENODATA
		}
		gen = g
	}
	r, err := n.fsys.meta.GetXattr(ctx, &metapb.GetXattrRequest{Caller: n.fsys.callers.of(ctx), Ino: n.ino, Name: attr})
	if err != nil {
		e := errno(err)
		if caps && e == syscall.ENODATA {
			n.mu.Lock()
			if n.xattrGen == gen {
				n.noCapsUntil = start.Add(n.fsys.opts.AttrTimeout)
			}
			n.mu.Unlock()
		}
		return 0, e
	}
	if len(dest) < len(r.Value) {
		return uint32(len(r.Value)), syscall.ERANGE
	}
	return uint32(copy(dest, r.Value)), 0
}

// Setxattr implements gofs.NodeSetxattrer.
func (n *Node) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	// New files take their layout and ACL-derived modes from the directory.
	n.dropReserved()
	n.dropLease()
	ctx, done := killable(ctx)
	defer done()
	switch attr {
	case RelayoutXattr:
		return n.setRelayout(ctx, data)
	case SnapshotXattr:
		return n.setSnapshot(ctx, data)
	case RmrXattr:
		return n.setRmr(ctx, data)
	case TrashXattr:
		return n.setTrash(ctx, data)
	case QuotaXattr:
		return n.setQuota(ctx, data)
	}
	if attr == LayoutXattr {
		l, err := stripe.ParseLayout(string(data))
		if err != nil {
			n.fsys.log.Info("setxattr "+LayoutXattr, "ino", n.ino, "err", err)
			return syscall.EINVAL
		}
		_, err = n.fsys.meta.SetLayout(ctx, &metapb.SetLayoutRequest{Caller: n.fsys.callers.of(ctx), Ino: n.ino, Layout: metapb.LayoutOf(l)})
		return errno(err)
	}
	n.dirChange() // a change the kept attributes do not show
	n.forgetNoCaps()
	defer n.forgetNoCaps()
	n.beginChange()
	_, err := n.fsys.meta.SetXattr(ctx, &metapb.SetXattrRequest{Caller: n.fsys.callers.of(ctx), Ino: n.ino, Name: attr, Value: data, Flags: flags})
	n.endChange(nil) // its ctime changed: fetched again
	return errno(err)
}

// Listxattr implements gofs.NodeListxattrer.
func (n *Node) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	ctx, done := killable(ctx)
	defer done()
	r, err := n.fsys.meta.ListXattr(ctx, &metapb.ListXattrRequest{Caller: n.fsys.callers.of(ctx), Ino: n.ino})
	if err != nil {
		return 0, errno(err)
	}
	size := 0
	for _, name := range r.Names {
		size += len(name) + 1
	}
	if len(dest) < size {
		return uint32(size), syscall.ERANGE
	}
	off := 0
	for _, name := range r.Names {
		off += copy(dest[off:], name)
		dest[off] = 0
		off++
	}
	return uint32(size), 0
}

// Removexattr implements gofs.NodeRemovexattrer.
func (n *Node) Removexattr(ctx context.Context, attr string) syscall.Errno {
	// New files take their layout and ACL-derived modes from the directory.
	n.dropReserved()
	n.dropLease()
	ctx, done := killable(ctx)
	defer done()
	if attr == LayoutXattr {
		return syscall.ENOTSUP // a directory's layout is set, not removed
	}
	n.dirChange() // a change the kept attributes do not show
	n.forgetNoCaps()
	defer n.forgetNoCaps()
	n.beginChange()
	c := n.fsys.callers.of(ctx)
	// The kernel lets no caller without CAP_SETFCAP remove capabilities
	// (cap_inode_removexattr): one that reaches us from another caller is
	// the kernel's own, dropping them as the caller writes or truncates.
	killPriv := attr == capsXattr && c.Uid != 0
	_, err := n.fsys.meta.RemoveXattr(ctx, &metapb.RemoveXattrRequest{Caller: c, Ino: n.ino, Name: attr, KillPriv: killPriv})
	n.endChange(nil) // its ctime changed: fetched again
	return errno(err)
}

// forgetNoCaps drops the cached absence of security.capability. Setxattr and
// Removexattr call it before and after their change, so that a Getxattr
// overlapping the change does not cache what it read.
func (n *Node) forgetNoCaps() {
	n.mu.Lock()
	n.noCapsUntil = time.Time{}
	n.xattrGen++
	n.mu.Unlock()
}

// Statfs implements gofs.NodeStatfser.
func (n *Node) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	ctx, done := killable(ctx)
	defer done()
	r, err := n.fsys.meta.StatFS(ctx, &metapb.StatFSRequest{Ino: n.ino})
	if err != nil {
		return errno(err)
	}
	out.Bsize = uint32(r.BlockSize)
	out.Frsize = uint32(r.BlockSize)
	out.Blocks, out.Bfree, out.Bavail = r.Blocks, r.BlocksFree, r.BlocksAvail
	out.Files, out.Ffree = r.Files, r.FilesFree
	out.NameLen = r.NameMax
	return 0
}
