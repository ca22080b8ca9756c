package fs

import (
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/prometheus/client_golang/prometheus"
)

// FUSE request names, the op label of the mount's request metrics.
var fuseOps = [...]string{
	opLookup: "lookup", opForget: "forget", opGetAttr: "getattr", opSetAttr: "setattr",
	opMknod: "mknod", opMkdir: "mkdir", opUnlink: "unlink", opRmdir: "rmdir",
	opRename: "rename", opLink: "link", opSymlink: "symlink", opReadlink: "readlink",
	opAccess: "access", opGetXAttr: "getxattr", opListXAttr: "listxattr", opSetXAttr: "setxattr",
	opRemoveXAttr: "removexattr", opCreate: "create", opTmpfile: "tmpfile", opOpen: "open",
	opRead: "read", opLseek: "lseek", opGetLk: "getlk", opSetLk: "setlk", opSetLkw: "setlkw",
	opRelease: "release", opWrite: "write", opCopyFileRange: "copy_file_range", opIoctl: "ioctl",
	opFlush: "flush", opFsync: "fsync", opFallocate: "fallocate", opOpenDir: "opendir",
	opReadDir: "readdir", opReadDirPlus: "readdirplus", opReleaseDir: "releasedir",
	opFsyncDir: "fsyncdir", opStatFs: "statfs", opStatx: "statx",
}

const (
	opLookup = iota
	opForget
	opGetAttr
	opSetAttr
	opMknod
	opMkdir
	opUnlink
	opRmdir
	opRename
	opLink
	opSymlink
	opReadlink
	opAccess
	opGetXAttr
	opListXAttr
	opSetXAttr
	opRemoveXAttr
	opCreate
	opTmpfile
	opOpen
	opRead
	opLseek
	opGetLk
	opSetLk
	opSetLkw
	opRelease
	opWrite
	opCopyFileRange
	opIoctl
	opFlush
	opFsync
	opFallocate
	opOpenDir
	opReadDir
	opReadDirPlus
	opReleaseDir
	opFsyncDir
	opStatFs
	opStatx
	numOps
)

// opMetrics are the mount's request metrics: per FUSE operation its
// latency (a histogram, whose count is the operations served) and its
// failures, and the bytes applications read and wrote. Each operation's
// series are resolved once, so that recording one allocates nothing.
type opMetrics struct {
	latency  [numOps]prometheus.Observer
	failures [numOps]prometheus.Counter
	read     prometheus.Counter
	written  prometheus.Counter
}

// newOpMetrics registers the request metrics with reg.
func newOpMetrics(reg prometheus.Registerer) *opMetrics {
	latency := prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "rdmafs", Subsystem: "client", Name: "fuse_request_duration_seconds",
		Help:    "Time the mount took to answer a FUSE request, by operation (its count is the requests served).",
		Buckets: prometheus.ExponentialBuckets(10e-6, 2, 20)}, []string{"op"})
	failures := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "rdmafs", Subsystem: "client", Name: "fuse_request_failures_total",
		Help: "FUSE requests that failed, by operation: answered with an error other than ENOENT or ENODATA (a missing name or attribute is an answer)."}, []string{"op"})
	m := &opMetrics{
		read: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "rdmafs", Subsystem: "client", Name: "read_bytes_total",
			Help: "Bytes returned to applications' reads."}),
		written: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "rdmafs", Subsystem: "client", Name: "written_bytes_total",
			Help: "Bytes applications wrote (accepted by write requests)."}),
	}
	for op, name := range fuseOps {
		m.latency[op] = latency.WithLabelValues(name)
		m.failures[op] = failures.WithLabelValues(name)
	}
	reg.MustRegister(latency, failures, m.read, m.written)
	return m
}

// done records an operation that began at start and ended with st.
func (m *opMetrics) done(op int, start time.Time, st fuse.Status) {
	m.latency[op].Observe(time.Since(start).Seconds())
	if st != fuse.OK && st != fuse.ENOENT && st != fuse.ENODATA {
		m.failures[op].Inc()
	}
}

// meteredFS is a RawFileSystem that records every request in m.
type meteredFS struct {
	fuse.RawFileSystem
	m *opMetrics
}

func (r *meteredFS) Lookup(cancel <-chan struct{}, h *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	t := time.Now()
	st := r.RawFileSystem.Lookup(cancel, h, name, out)
	r.m.done(opLookup, t, st)
	return st
}

func (r *meteredFS) Forget(nodeid, nlookup uint64) {
	t := time.Now()
	r.RawFileSystem.Forget(nodeid, nlookup)
	r.m.done(opForget, t, fuse.OK)
}

func (r *meteredFS) GetAttr(cancel <-chan struct{}, in *fuse.GetAttrIn, out *fuse.AttrOut) fuse.Status {
	t := time.Now()
	st := r.RawFileSystem.GetAttr(cancel, in, out)
	r.m.done(opGetAttr, t, st)
	return st
}

func (r *meteredFS) SetAttr(cancel <-chan struct{}, in *fuse.SetAttrIn, out *fuse.AttrOut) fuse.Status {
	t := time.Now()
	st := r.RawFileSystem.SetAttr(cancel, in, out)
	r.m.done(opSetAttr, t, st)
	return st
}

func (r *meteredFS) Mknod(cancel <-chan struct{}, in *fuse.MknodIn, name string, out *fuse.EntryOut) fuse.Status {
	t := time.Now()
	st := r.RawFileSystem.Mknod(cancel, in, name, out)
	r.m.done(opMknod, t, st)
	return st
}

func (r *meteredFS) Mkdir(cancel <-chan struct{}, in *fuse.MkdirIn, name string, out *fuse.EntryOut) fuse.Status {
	t := time.Now()
	st := r.RawFileSystem.Mkdir(cancel, in, name, out)
	r.m.done(opMkdir, t, st)
	return st
}

func (r *meteredFS) Unlink(cancel <-chan struct{}, h *fuse.InHeader, name string) fuse.Status {
	t := time.Now()
	st := r.RawFileSystem.Unlink(cancel, h, name)
	r.m.done(opUnlink, t, st)
	return st
}

func (r *meteredFS) Rmdir(cancel <-chan struct{}, h *fuse.InHeader, name string) fuse.Status {
	t := time.Now()
	st := r.RawFileSystem.Rmdir(cancel, h, name)
	r.m.done(opRmdir, t, st)
	return st
}

func (r *meteredFS) Rename(cancel <-chan struct{}, in *fuse.RenameIn, oldName, newName string) fuse.Status {
	t := time.Now()
	st := r.RawFileSystem.Rename(cancel, in, oldName, newName)
	r.m.done(opRename, t, st)
	return st
}

func (r *meteredFS) Link(cancel <-chan struct{}, in *fuse.LinkIn, name string, out *fuse.EntryOut) fuse.Status {
	t := time.Now()
	st := r.RawFileSystem.Link(cancel, in, name, out)
	r.m.done(opLink, t, st)
	return st
}

func (r *meteredFS) Symlink(cancel <-chan struct{}, h *fuse.InHeader, target, name string, out *fuse.EntryOut) fuse.Status {
	t := time.Now()
	st := r.RawFileSystem.Symlink(cancel, h, target, name, out)
	r.m.done(opSymlink, t, st)
	return st
}

func (r *meteredFS) Readlink(cancel <-chan struct{}, h *fuse.InHeader) ([]byte, fuse.Status) {
	t := time.Now()
	b, st := r.RawFileSystem.Readlink(cancel, h)
	r.m.done(opReadlink, t, st)
	return b, st
}

func (r *meteredFS) Access(cancel <-chan struct{}, in *fuse.AccessIn) fuse.Status {
	t := time.Now()
	st := r.RawFileSystem.Access(cancel, in)
	r.m.done(opAccess, t, st)
	return st
}

func (r *meteredFS) GetXAttr(cancel <-chan struct{}, h *fuse.InHeader, attr string, dest []byte) (uint32, fuse.Status) {
	t := time.Now()
	n, st := r.RawFileSystem.GetXAttr(cancel, h, attr, dest)
	r.m.done(opGetXAttr, t, st)
	return n, st
}

func (r *meteredFS) ListXAttr(cancel <-chan struct{}, h *fuse.InHeader, dest []byte) (uint32, fuse.Status) {
	t := time.Now()
	n, st := r.RawFileSystem.ListXAttr(cancel, h, dest)
	r.m.done(opListXAttr, t, st)
	return n, st
}

func (r *meteredFS) SetXAttr(cancel <-chan struct{}, in *fuse.SetXAttrIn, attr string, data []byte) fuse.Status {
	t := time.Now()
	st := r.RawFileSystem.SetXAttr(cancel, in, attr, data)
	r.m.done(opSetXAttr, t, st)
	return st
}

func (r *meteredFS) RemoveXAttr(cancel <-chan struct{}, h *fuse.InHeader, attr string) fuse.Status {
	t := time.Now()
	st := r.RawFileSystem.RemoveXAttr(cancel, h, attr)
	r.m.done(opRemoveXAttr, t, st)
	return st
}

func (r *meteredFS) Create(cancel <-chan struct{}, in *fuse.CreateIn, name string, out *fuse.CreateOut) fuse.Status {
	t := time.Now()
	st := r.RawFileSystem.Create(cancel, in, name, out)
	r.m.done(opCreate, t, st)
	return st
}

func (r *meteredFS) Tmpfile(cancel <-chan struct{}, in *fuse.CreateIn, out *fuse.CreateOut) fuse.Status {
	t := time.Now()
	st := r.RawFileSystem.Tmpfile(cancel, in, out)
	r.m.done(opTmpfile, t, st)
	return st
}

func (r *meteredFS) Open(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	t := time.Now()
	st := r.RawFileSystem.Open(cancel, in, out)
	r.m.done(opOpen, t, st)
	return st
}

func (r *meteredFS) Read(cancel <-chan struct{}, in *fuse.ReadIn, buf []byte) (fuse.ReadResult, fuse.Status) {
	t := time.Now()
	res, st := r.RawFileSystem.Read(cancel, in, buf)
	r.m.done(opRead, t, st)
	if st == fuse.OK && res != nil {
		r.m.read.Add(float64(res.Size()))
	}
	return res, st
}

func (r *meteredFS) Lseek(cancel <-chan struct{}, in *fuse.LseekIn, out *fuse.LseekOut) fuse.Status {
	t := time.Now()
	st := r.RawFileSystem.Lseek(cancel, in, out)
	r.m.done(opLseek, t, st)
	return st
}

func (r *meteredFS) GetLk(cancel <-chan struct{}, in *fuse.LkIn, out *fuse.LkOut) fuse.Status {
	t := time.Now()
	st := r.RawFileSystem.GetLk(cancel, in, out)
	r.m.done(opGetLk, t, st)
	return st
}

func (r *meteredFS) SetLk(cancel <-chan struct{}, in *fuse.LkIn) fuse.Status {
	t := time.Now()
	st := r.RawFileSystem.SetLk(cancel, in)
	r.m.done(opSetLk, t, st)
	return st
}

func (r *meteredFS) SetLkw(cancel <-chan struct{}, in *fuse.LkIn) fuse.Status {
	t := time.Now()
	st := r.RawFileSystem.SetLkw(cancel, in)
	r.m.done(opSetLkw, t, st)
	return st
}

func (r *meteredFS) Release(cancel <-chan struct{}, in *fuse.ReleaseIn) {
	t := time.Now()
	r.RawFileSystem.Release(cancel, in)
	r.m.done(opRelease, t, fuse.OK)
}

func (r *meteredFS) Write(cancel <-chan struct{}, in *fuse.WriteIn, data []byte) (uint32, fuse.Status) {
	t := time.Now()
	n, st := r.RawFileSystem.Write(cancel, in, data)
	r.m.done(opWrite, t, st)
	r.m.written.Add(float64(n))
	return n, st
}

func (r *meteredFS) Writev(cancel <-chan struct{}, in *fuse.WriteIn, data [][]byte) (uint32, fuse.Status) {
	t := time.Now()
	n, st := r.RawFileSystem.Writev(cancel, in, data)
	if st == fuse.ENOSYS {
		return n, st // go-fuse then calls Write, which records the request
	}
	r.m.done(opWrite, t, st)
	r.m.written.Add(float64(n))
	return n, st
}

func (r *meteredFS) CopyFileRange(cancel <-chan struct{}, in *fuse.CopyFileRangeIn) (uint32, fuse.Status) {
	t := time.Now()
	n, st := r.RawFileSystem.CopyFileRange(cancel, in)
	r.m.done(opCopyFileRange, t, st)
	return n, st
}

func (r *meteredFS) Ioctl(cancel <-chan struct{}, in *fuse.IoctlIn, inbuf []byte, out *fuse.IoctlOut, outbuf []byte) fuse.Status {
	t := time.Now()
	st := r.RawFileSystem.Ioctl(cancel, in, inbuf, out, outbuf)
	r.m.done(opIoctl, t, st)
	return st
}

func (r *meteredFS) Flush(cancel <-chan struct{}, in *fuse.FlushIn) fuse.Status {
	t := time.Now()
	st := r.RawFileSystem.Flush(cancel, in)
	r.m.done(opFlush, t, st)
	return st
}

func (r *meteredFS) Fsync(cancel <-chan struct{}, in *fuse.FsyncIn) fuse.Status {
	t := time.Now()
	st := r.RawFileSystem.Fsync(cancel, in)
	r.m.done(opFsync, t, st)
	return st
}

func (r *meteredFS) Fallocate(cancel <-chan struct{}, in *fuse.FallocateIn) fuse.Status {
	t := time.Now()
	st := r.RawFileSystem.Fallocate(cancel, in)
	r.m.done(opFallocate, t, st)
	return st
}

func (r *meteredFS) OpenDir(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	t := time.Now()
	st := r.RawFileSystem.OpenDir(cancel, in, out)
	r.m.done(opOpenDir, t, st)
	return st
}

func (r *meteredFS) ReadDir(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	t := time.Now()
	st := r.RawFileSystem.ReadDir(cancel, in, out)
	r.m.done(opReadDir, t, st)
	return st
}

func (r *meteredFS) ReadDirPlus(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	t := time.Now()
	st := r.RawFileSystem.ReadDirPlus(cancel, in, out)
	r.m.done(opReadDirPlus, t, st)
	return st
}

func (r *meteredFS) ReleaseDir(in *fuse.ReleaseIn) {
	t := time.Now()
	r.RawFileSystem.ReleaseDir(in)
	r.m.done(opReleaseDir, t, fuse.OK)
}

func (r *meteredFS) FsyncDir(cancel <-chan struct{}, in *fuse.FsyncIn) fuse.Status {
	t := time.Now()
	st := r.RawFileSystem.FsyncDir(cancel, in)
	r.m.done(opFsyncDir, t, st)
	return st
}

func (r *meteredFS) StatFs(cancel <-chan struct{}, h *fuse.InHeader, out *fuse.StatfsOut) fuse.Status {
	t := time.Now()
	st := r.RawFileSystem.StatFs(cancel, h, out)
	r.m.done(opStatFs, t, st)
	return st
}

func (r *meteredFS) Statx(cancel <-chan struct{}, in *fuse.StatxIn, out *fuse.StatxOut) fuse.Status {
	t := time.Now()
	st := r.RawFileSystem.Statx(cancel, in, out)
	r.m.done(opStatx, t, st)
	return st
}
