package fs

import (
	"context"
	"sync"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/rdmafs/rdmafs/meta/metapb"
)

// fileHandle is an open regular file. Its bytes move through the Data engine;
// the open is recorded in the client's session so that an unlinked file stays
// readable until released.
type fileHandle struct {
	fsys  *FS
	node  *Node
	ino   uint64
	flags uint32

	// Drop-behind of a sequential writer (see Options.DropBehind): the last
	// write, whose pages are dropped once the next one follows it, and the
	// bytes of the run of writes in sequence that it ends.
	seqMu            sync.Mutex
	lastOff, lastLen int64
	seqBytes         int64

	// failuresSeen is the count of the file's write failures this handle
	// has reported (Data.WriteErrors), under lockMu.
	failuresSeen uint64

	// The flock held through this open file, and the owners of record locks
	// taken through it, released at its last close.
	lockMu      sync.Mutex
	flockOwner  uint64
	hasFlock    bool
	posixOwners []uint64
}

var (
	_ gofs.FileReader    = (*fileHandle)(nil)
	_ gofs.FileWriter    = (*fileHandle)(nil)
	_ gofs.FileFlusher   = (*fileHandle)(nil)
	_ gofs.FileFsyncer   = (*fileHandle)(nil)
	_ gofs.FileReleaser  = (*fileHandle)(nil)
	_ gofs.FileAllocater = (*fileHandle)(nil)
)

// Open implements gofs.NodeOpener: the service checks the access mode and
// records the open in the session.
func (n *Node) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	killSuid, _ := n.fsys.kill.of(ctx) // the request's own context only
	ctx, done := killable(ctx)
	defer done()
	d := n.fsys.opts.Data
	trunc := flags&syscall.O_TRUNC != 0 && d != nil
	if trunc {
		// The kernel passes O_TRUNC with the open (ATOMIC_O_TRUNC) and
		// meta truncates in the open's transaction: commits of this
		// mount's writes in flight land before it, its dirty data goes.
		if err := d.Truncate(ctx, n.ino, 0); err != nil {
			return nil, 0, dataErrno(err)
		}
	}
	n.beginChange() // O_TRUNC changes the size and times
	r, err := n.fsys.meta.Open(ctx, &metapb.OpenRequest{Caller: n.fsys.callers.of(ctx), Ino: n.ino, SessionId: n.fsys.opts.Session, Flags: flags})
	n.endChange(r.GetAttr())
	if trunc {
		d.Truncated(n.ino)
	}
	if err != nil {
		return nil, 0, errno(err)
	}
	// Close-to-open: a file unchanged since its last open here keeps the kernel's
	// page cache; otherwise the kernel drops its pages (no KEEP_CACHE) and its
	// cached attributes, so reads see the size and bytes committed elsewhere.
	n.mu.Lock()
	unchanged := n.opened && r.Attr.MtimeNs == n.openMtime && r.Attr.Size == n.openSize
	n.opened, n.openMtime, n.openSize = true, r.Attr.MtimeNs, r.Attr.Size
	n.mu.Unlock()
	var fuseFlags uint32
	if unchanged {
		fuseFlags = fuse.FOPEN_KEEP_CACHE
	} else {
		n.NotifyContent(-1, 0) // attributes only: takes no page locks
	}
	if d != nil {
		if err := d.Open(ctx, n.ino); err != nil {
			return nil, 0, errno(err)
		}
	}
	if !unchanged {
		n.fsys.stamps.set(n.ino, r.Attr) // the engine and the kernel start over
	} else if !n.fsys.stamps.shows(n.ino, r.Attr) {
		// The kernel keeps pages that may show another state with the
		// same mtime and size (a rewrite that put the mtime back).
		n.fsys.stamps.set(n.ino, nil)
	}
	h := n.fsys.newHandle(n, n.ino, flags)
	if killSuid { // an O_TRUNC open by a caller without CAP_FSETID
		if e := n.killSuidgid(ctx, h); e != 0 {
			return nil, 0, e
		}
	}
	return h, fuseFlags | directOpenFlags(flags), 0
}

// directOpenFlags returns the FUSE open flags of an open with flags: an
// O_DIRECT open for writing is a direct-I/O file for the kernel
// (FOPEN_DIRECT_IO; it would otherwise put the inode in its page-cache
// mode), whose direct writes within the file's size run in parallel
// (FOPEN_PARALLEL_DIRECT_WRITES) instead of one at a time under the inode's
// lock: the engine orders writes to one file itself. Read-only opens keep
// the kernel's usual O_DIRECT path.
func directOpenFlags(flags uint32) uint32 {
	if flags&syscall.O_DIRECT == 0 || flags&syscall.O_ACCMODE == syscall.O_RDONLY {
		return 0
	}
	return fuse.FOPEN_DIRECT_IO | fuse.FOPEN_PARALLEL_DIRECT_WRITES
}

// newHandle returns the handle of an open of ino through node; one open
// for writing reports the write failures that happen from now on.
func (fsys *FS) newHandle(node *Node, ino uint64, flags uint32) *fileHandle {
	f := &fileHandle{fsys: fsys, node: node, ino: ino, flags: flags}
	if d := fsys.opts.Data; d != nil && flags&syscall.O_ACCMODE != syscall.O_RDONLY {
		f.failuresSeen, _ = d.WriteErrors(ino)
	}
	return f
}

// writeFailure returns err, the outcome of a flush through this handle, or,
// when that succeeded, the latest write failure of the file this handle has
// not reported yet (another handle's flush met it first).
func (f *fileHandle) writeFailure(err error) error {
	d := f.fsys.opts.Data
	if d == nil || f.flags&syscall.O_ACCMODE == syscall.O_RDONLY {
		return err
	}
	n, last := d.WriteErrors(f.ino)
	f.lockMu.Lock()
	seen := f.failuresSeen
	f.failuresSeen = n
	f.lockMu.Unlock()
	if err == nil && n != seen && last != nil {
		return last
	}
	return err
}

func (f *fileHandle) data() (Data, syscall.Errno) {
	if f.fsys.opts.Data == nil {
		return nil, syscall.EIO
	}
	return f.fsys.opts.Data, 0
}

// Read implements gofs.FileReader.
func (f *fileHandle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	rctx := f.fsys.readContextOf(ctx)
	defer f.fsys.releaseReadContext(rctx)
	ctx = rctx
	d, e := f.data()
	if e != 0 {
		return nil, e
	}
	if ip, ok := d.(inPlaceReader); ok {
		b, rel, err := ip.ReadInPlace(ctx, f.ino, dest, off)
		if err != nil {
			return nil, dataErrno(err)
		}
		if rel == nil {
			return f.fsys.dataResult(b), 0
		}
		r, _ := f.fsys.inPlace.Get().(*inPlaceResult)
		if r == nil {
			r = &inPlaceResult{pool: &f.fsys.inPlace}
		}
		r.data[0], r.rel = b, rel
		return r, 0
	}
	n, err := d.Read(ctx, f.ino, dest, off)
	if err != nil {
		return nil, dataErrno(err)
	}
	return f.fsys.dataResult(dest[:n]), 0
}

// dataResult returns a read reply of b, bytes in go-fuse's own reply buffer,
// from the FS's pool: fuse.ReadResultData would allocate one per read.
func (fsys *FS) dataResult(b []byte) *dataResult {
	r, _ := fsys.dataResults.Get().(*dataResult)
	if r == nil {
		r = &dataResult{pool: &fsys.dataResults}
	}
	r.b = b
	return r
}

// dataResult is a read reply of bytes in go-fuse's reply buffer. go-fuse
// takes them with Bytes and calls Done once, before or after writing them;
// Done returns the result to its pool.
type dataResult struct {
	b    []byte
	pool *sync.Pool
}

// Bytes implements fuse.ReadResult.
func (r *dataResult) Bytes(buf []byte) ([]byte, fuse.Status) { return r.b, fuse.OK }

// Size implements fuse.ReadResult.
func (r *dataResult) Size() int { return len(r.b) }

// Done implements fuse.ReadResult.
func (r *dataResult) Done() {
	r.b = nil
	r.pool.Put(r)
}

// inPlaceReader is a Data that can answer a read with bytes where they
// already are in its own memory (fileio.Engine does for stripes it read
// ahead), saving a copy into the reply buffer.
type inPlaceReader interface {
	// ReadInPlace reads like Read but returns the bytes: p[:n] with a nil
	// release, or memory of its own that stays valid until release.Release.
	ReadInPlace(ctx context.Context, ino uint64, p []byte, off int64) ([]byte, interface{ Release() }, error)
}

// inPlaceResult is a read reply whose bytes go to the kernel straight from
// where the Data keeps them: go-fuse writes a result that has Slices with
// writev and calls Done once after the write, which releases the bytes and
// returns the result to its pool. (A result without Slices gets Done before
// the write when splicing is off, too early for memory that Done releases.)
type inPlaceResult struct {
	data [1][]byte
	rel  interface{ Release() }
	pool *sync.Pool
}

// Bytes implements fuse.ReadResult.
func (r *inPlaceResult) Bytes(buf []byte) ([]byte, fuse.Status) { return r.data[0], fuse.OK }

// Size implements fuse.ReadResult.
func (r *inPlaceResult) Size() int { return len(r.data[0]) }

// Done implements fuse.ReadResult.
func (r *inPlaceResult) Done() {
	r.rel.Release()
	r.data[0], r.rel = nil, nil
	r.pool.Put(r)
}

// Slices makes go-fuse write the bytes with writev, without copying them,
// and keep them until Done.
func (r *inPlaceResult) Slices() ([][]byte, fuse.Status) { return r.data[:], fuse.OK }

// Write implements gofs.FileWriter.
func (f *fileHandle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	killSuid, _ := f.fsys.kill.of(ctx) // the request's own context only
	ctx, done := killable(ctx)         // a write may wait for flushes, up to the write timeout
	defer done()
	d, e := f.data()
	if e != 0 {
		return 0, e
	}
	if e := f.dropPrivs(ctx, killSuid); e != 0 {
		return 0, e
	}
	if f.flags&syscall.O_DIRECT != 0 {
		// Not through the kernel's pages (FOPEN_DIRECT_IO): they may hold
		// what a read cached before the write reached the engine, so the
		// next lock rereads the file (cachestamp.go).
		f.fsys.stamps.set(f.ino, nil)
	}
	n, err := d.Write(ctx, f.ino, data, off)
	if err != nil {
		return uint32(n), dataErrno(err)
	}
	f.dropBehind(off, int64(n))
	return uint32(n), 0
}

// maxDropping bounds the page cache invalidations in flight per mount; one
// that would exceed it is skipped (the pages merely stay cached).
const maxDropping = 4

// dropBehind notes a completed write of n bytes at off and, once the handle
// has written DropBehind bytes in sequence, asks the kernel to drop the pages
// of the write before this one (the first DropBehind bytes stay cached). The
// request goes from another goroutine: the kernel holds the pages of the write
// being answered locked until the answer.
func (f *fileHandle) dropBehind(off, n int64) {
	limit := f.fsys.opts.DropBehind
	if limit <= 0 || f.node == nil || f.flags&syscall.O_DIRECT != 0 {
		return
	}
	f.seqMu.Lock()
	inSeq := f.lastLen > 0 && off == f.lastOff+f.lastLen
	if !inSeq {
		f.seqBytes = 0
	}
	before := f.seqBytes // bytes of the run before this write
	dropOff, dropLen := f.lastOff, f.lastLen
	f.lastOff, f.lastLen, f.seqBytes = off, n, f.seqBytes+n
	f.seqMu.Unlock()
	// The write before this one is dropped if this one follows it and it
	// began at least limit bytes into the run.
	if !inSeq || before-dropLen < limit {
		return
	}
	fsys := f.fsys
	if fsys.dropping.Add(1) > maxDropping {
		fsys.dropping.Add(-1)
		return
	}
	go func() {
		defer fsys.dropping.Add(-1)
		f.node.NotifyContent(dropOff, dropLen)
	}()
}

// Flush implements gofs.FileFlusher: close(2) commits what was written, and
// the file's create if the mount answered it early, so that the next open
// anywhere sees it (close-to-open consistency).
func (f *fileHandle) Flush(ctx context.Context) syscall.Errno {
	if err := f.releaseLocks(ctx); err != nil {
		return dataErrno(f.writeFailure(err))
	}
	leased := f.node.createdUnderLease()
	if leased {
		// Nothing to wait for: the create, and the data of a file small
		// enough to be kept in metadata, may stay behind until the lease
		// is recalled (lease.go). Larger files wait for their chunkservers
		// here, so that their errors (ENOSPC) reach the application.
		if dirty, inline := f.uncommitted(); !dirty || inline && (f.node.carryInline() || f.node.flushBehind()) {
			return dataErrno(f.writeFailure(nil))
		}
	}
	ctx, done := killable(ctx)
	defer done()
	if early := f.fsys.opts.Early; early != nil && !leased {
		if err := early.WaitIno(ctx, f.ino); err != nil {
			return errno(err)
		}
	}
	if f.flags&syscall.O_ACCMODE == syscall.O_RDONLY || f.fsys.opts.Data == nil {
		return 0
	}
	return dataErrno(f.writeFailure(f.fsys.opts.Data.Flush(ctx, f.ino)))
}

// uncommitted reports whether the handle may have written data not yet
// committed, and whether that data fits in the layout's inline size of a
// file created under a lease (its flush commits it into metadata, with no
// chunkserver).
func (f *fileHandle) uncommitted() (dirty, inline bool) {
	if f.flags&syscall.O_ACCMODE == syscall.O_RDONLY || f.fsys.opts.Data == nil {
		return false, false
	}
	size, dirty := f.fsys.opts.Data.Size(f.ino)
	f.node.mu.Lock()
	limit := f.node.createdInline
	f.node.mu.Unlock()
	return dirty, size >= 0 && uint64(size) <= limit
}

// Fsync implements gofs.FileFsyncer: every shard durable and the version
// committed, and that commit and every metadata operation this mount saw
// answered before it durable in the metadata service, before it returns.
func (f *fileHandle) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	ctx, done := killable(ctx)
	defer done()
	if d := f.fsys.opts.Data; d != nil {
		if err := f.writeFailure(d.Sync(ctx, f.ino)); err != nil {
			return dataErrno(err)
		}
	}
	return f.fsys.syncMeta(ctx) // no call if the commit covered everything
}

// Release implements gofs.FileReleaser. The kernel does not wait for it
// (close has returned already): the release is queued and sent with the
// others that queue up meanwhile, one call for many files.
func (f *fileHandle) Release(ctx context.Context) syscall.Errno {
	f.releaseFileLocks()
	f.fsys.releases.add(f.ino)
	return 0
}

// Allocate implements gofs.FileAllocater (fallocate(2)). Chunks are written
// copy-on-write, so space cannot be reserved ahead; what is meaningful is done:
//   - mode 0 checks that the cluster has room for the range (ENOSPC if not)
//     and extends the file to cover it, reading as zeros;
//   - FALLOC_FL_KEEP_SIZE checks for room only;
//   - FALLOC_FL_PUNCH_HOLE|FALLOC_FL_KEEP_SIZE makes the range read as zeros.
//
// Other modes fail with EOPNOTSUPP, as on file systems that lack them.
func (f *fileHandle) Allocate(ctx context.Context, off uint64, size uint64, mode uint32) syscall.Errno {
	ctx, done := killable(ctx)
	defer done()
	d, e := f.data()
	if e != 0 {
		return e
	}
	if f.flags&syscall.O_ACCMODE == syscall.O_RDONLY {
		return syscall.EBADF
	}
	end := off + size
	if size == 0 || end < off || end > 1<<63-1 {
		return syscall.EINVAL
	}
	switch mode {
	case 0, unix.FALLOC_FL_KEEP_SIZE:
		// Flush first: the committed size is then the file's size.
		if err := d.Flush(ctx, f.ino); err != nil {
			return errno(err)
		}
		a, err := f.fsys.meta.GetAttr(ctx, &metapb.GetAttrRequest{Ino: f.ino, LeaseSession: f.fsys.opts.Session})
		if err != nil {
			return errno(err)
		}
		if end <= a.Attr.Size {
			return 0
		}
		st, err := f.fsys.meta.StatFS(ctx, &metapb.StatFSRequest{})
		if err != nil {
			return errno(err)
		}
		if (end-max(off, a.Attr.Size))/uint64(max(st.BlockSize, 1)) > st.BlocksAvail {
			return syscall.ENOSPC
		}
		if mode == unix.FALLOC_FL_KEEP_SIZE {
			return 0
		}
		if err := d.Truncate(ctx, f.ino, end); err != nil {
			return errno(err)
		}
		f.node.beginChange()
		r, err := f.fsys.meta.SetAttr(ctx, &metapb.SetAttrRequest{Caller: f.fsys.callers.of(ctx), Ino: f.ino,
			SetSize: true, Size: end, SessionId: f.fsys.opts.Session})
		f.node.endChange(r.GetAttr())
		f.fsys.stamps.set(f.ino, nil) // changed, by a call that names no state it replaced
		d.Truncated(f.ino)
		return errno(err)
	case unix.FALLOC_FL_PUNCH_HOLE | unix.FALLOC_FL_KEEP_SIZE:
		// Past the end of the file there is nothing to punch: flush, so that
		// the committed size is the file's size, and stop there.
		if err := d.Flush(ctx, f.ino); err != nil {
			return errno(err)
		}
		a, err := f.fsys.meta.GetAttr(ctx, &metapb.GetAttrRequest{Ino: f.ino, LeaseSession: f.fsys.opts.Session})
		if err != nil {
			return errno(err)
		}
		end = min(end, a.Attr.Size)
		if off >= end {
			return 0
		}
		zeros := make([]byte, min(end-off, 1<<20))
		for at := off; at < end; {
			n := min(end-at, uint64(len(zeros)))
			if _, err := d.Write(ctx, f.ino, zeros[:n], int64(at)); err != nil {
				return errno(err)
			}
			at += n
		}
		return 0
	default:
		return syscall.EOPNOTSUPP
	}
}

var _ gofs.FileLseeker = (*fileHandle)(nil)

// stripesPerCall is how many stripes one GetStripes call returns at most
// (meta's limit: core.MaxStripesPerCall).
const stripesPerCall = 1024

// Lseek implements gofs.FileLseeker for SEEK_DATA and SEEK_HOLE (the kernel
// answers the other whences itself). Holes are found at stripe granularity:
// a stripe never written, and the part of a stripe past its data, are holes.
// What this mount wrote is committed first, so that it counts as data.
func (f *fileHandle) Lseek(ctx context.Context, off uint64, whence uint32) (uint64, syscall.Errno) {
	ctx, done := killable(ctx)
	defer done()
	if whence != unix.SEEK_DATA && whence != unix.SEEK_HOLE {
		return 0, syscall.EINVAL
	}
	if d := f.fsys.opts.Data; d != nil {
		if err := d.Flush(ctx, f.ino); err != nil {
			return 0, dataErrno(err)
		}
	}
	first, pos := uint64(0), off
	var size, sb uint64
	for {
		r, err := f.fsys.meta.GetStripes(ctx, &metapb.GetStripesRequest{Ino: f.ino, First: first, Count: stripesPerCall})
		if err != nil {
			return 0, errno(err)
		}
		size = r.Size
		if l := r.Layout; l != nil {
			sb = uint64(l.Stripe().StripeSize())
		}
		if off >= size {
			return 0, syscall.ENXIO
		}
		if sb == 0 {
			break // no layout: all data
		}
		if first == 0 {
			first = off / sb
			if first > 0 {
				continue // start the scan at off's stripe
			}
		}
		for _, si := range r.Stripes {
			start, end := si.Stripe*sb, si.Stripe*sb+si.Length
			if end <= pos || si.Length == 0 {
				continue
			}
			if start > pos {
				if whence == unix.SEEK_HOLE {
					return pos, 0 // pos is in a hole
				}
				pos = start
			}
			if whence == unix.SEEK_DATA {
				return min(pos, size), 0
			}
			pos = end // data up to end: the hole may start there
		}
		if len(r.Stripes) < stripesPerCall {
			break
		}
		first = r.Stripes[len(r.Stripes)-1].Stripe + 1
	}
	if whence == unix.SEEK_DATA {
		if sb == 0 {
			return off, 0
		}
		return 0, syscall.ENXIO
	}
	return min(pos, size), 0
}
