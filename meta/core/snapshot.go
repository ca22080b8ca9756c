package core

import (
	"context"
	"syscall"

	"google.golang.org/protobuf/proto"

	"github.com/rdmafs/rdmafs/meta/keys"
	"github.com/rdmafs/rdmafs/meta/kv"
	"github.com/rdmafs/rdmafs/meta/metaerr"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// A snapshot copies metadata only: the copy's stripes reference the source's
// chunk versions. Both stripe records are marked shared, and each chunk
// version they hold gets a reference count (keys.Shared: references beyond
// the first). A shared stripe is never granted in place, so the first write
// to either side after the snapshot writes fresh chunks (copy-on-write per
// stripe), and dropping a shared version decrements its count instead of
// deleting the chunk until the last reference goes.

// DefaultTreeBatch is how many inodes one Snapshot or RemoveTree call
// handles when the request does not say; MaxTreeBatch bounds what it may ask
// (a transaction per call; etcd bounds a transaction's size). A scan within
// a transaction walks the writes it made so far, so batches of a few hundred
// are faster than larger ones (docs/performance.md).
const (
	DefaultTreeBatch = 128
	MaxTreeBatch     = 10000
)

func treeBatch(n uint32) int {
	switch {
	case n == 0:
		return DefaultTreeBatch
	case n > MaxTreeBatch:
		return MaxTreeBatch
	}
	return int(n)
}

// addRef counts one more reference to version of chunk.
func addRef(t kv.Txn, chunk, version uint64) error {
	n, err := extraRefs(t, chunk, version)
	if err != nil {
		return err
	}
	return t.Put(keys.Shared(chunk, version), keys.EncodeUint64(n+1))
}

// extraRefs returns the references to version of chunk beyond the first.
func extraRefs(r kv.Reader, chunk, version uint64) (uint64, error) {
	v, ok, err := r.Get(keys.Shared(chunk, version))
	if err != nil || !ok {
		return 0, err
	}
	return keys.DecodeUint64(v)
}

// stillShared reports whether a stripe marked shared still shares a chunk
// version with another stripe: the other side may have rewritten or dropped
// its copy since (the mark is cleared when this side next writes).
func stillShared(r kv.Reader, st *metapb.StripeRecord) (bool, error) {
	if !st.Shared {
		return false, nil
	}
	for _, sh := range st.Shards {
		n, err := extraRefs(r, sh.ChunkId, st.Version)
		if err != nil || n > 0 {
			return n > 0, err
		}
	}
	return false, nil
}

// dropVersion queues the chunks of a committed stripe version for
// collection. When the stripe is shared, a chunk that other stripes still
// reference loses one reference instead.
func dropVersion(t kv.Txn, shards []*metapb.Shard, version uint64, shared bool) error {
	if !shared {
		return queueGC(t, shards, version)
	}
	for _, sh := range shards {
		n, err := extraRefs(t, sh.ChunkId, version)
		if err != nil {
			return err
		}
		switch {
		case n > 1:
			err = t.Put(keys.Shared(sh.ChunkId, version), keys.EncodeUint64(n-1))
		case n == 1:
			err = t.Delete(keys.Shared(sh.ChunkId, version))
		default:
			err = queueGC(t, []*metapb.Shard{sh}, version)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// Snapshot implements metapb.MetaServer (see metapb.SnapshotRequest).
func (s *Service) Snapshot(ctx context.Context, req *metapb.SnapshotRequest) (*metapb.SnapshotReply, error) {
	c := caller(req.Caller)
	if !isRoot(c) {
		return nil, metaerr.New(syscall.EPERM, "snapshot: needs root (a snapshot keeps owners and modes)")
	}
	if err := checkName(req.Name); err != nil {
		return nil, err
	}
	if req.Progress {
		return s.snapshotProgress(ctx, req)
	}
	if err := s.awaitDir(ctx, 0, req.DstParent); err != nil {
		return nil, err
	}
	ready, err := s.snapshotReady(ctx, req)
	if err != nil {
		return nil, err
	}
	var out *metapb.SnapshotReply
	var made int64
	_, err = updateOnce(s, ctx, &out, func(t kv.Txn) error {
		sn := snapshotTxn{t: t, s: s, now: s.now().UnixNano(), budget: treeBatch(req.Batch), ready: ready}
		var err error
		out, err = sn.run(c, req)
		made = sn.made
		return err
	})
	if err != nil {
		return nil, err
	}
	s.inodes.Add(made)
	return out, nil
}

// snapshotReadyDirs is how many source directories one Snapshot call gets
// ready to copy.
const snapshotReadyDirs = 64

// snapshotReady waits until the source directories the next batch of req
// copies show every create answered before now (their leases and reserved
// names given back) and returns them.
func (s *Service) snapshotReady(ctx context.Context, req *metapb.SnapshotRequest) (map[uint64]bool, error) {
	var dirs []uint64
	if err := s.view(ctx, func(r kv.Reader) error {
		dirs = []uint64{req.Src}
		d, ok, err := getDentry(r, req.DstParent, req.Name)
		if err != nil || !ok {
			return err
		}
		dirs = dirs[:0]
		prefix := keys.SnapTaskPrefix(d.Ino)
		return r.Scan(prefix, kv.PrefixEnd(prefix), snapshotReadyDirs, func(_, v []byte) error {
			task := &metapb.SnapshotTask{}
			if err := proto.Unmarshal(v, task); err != nil {
				return err
			}
			dirs = append(dirs, task.SrcDir)
			return nil
		})
	}); err != nil {
		return nil, err
	}
	ready := make(map[uint64]bool, len(dirs))
	for _, dir := range dirs {
		if err := s.awaitDir(ctx, 0, dir); err != nil {
			return nil, err
		}
		ready[dir] = true
	}
	return ready, nil
}

// snapshotProgress reports the snapshot at req's destination.
func (s *Service) snapshotProgress(ctx context.Context, req *metapb.SnapshotRequest) (*metapb.SnapshotReply, error) {
	var out *metapb.SnapshotReply
	err := s.view(ctx, func(r kv.Reader) error {
		d, ok, err := getDentry(r, req.DstParent, req.Name)
		if err != nil {
			return err
		}
		if !ok {
			return metaerr.New(syscall.ENOENT, "no snapshot %q in directory %d", req.Name, req.DstParent)
		}
		job := &metapb.SnapshotJob{}
		if found, err := getMsg(r, keys.Snapshot(d.Ino), job); err != nil {
			return err
		} else if !found {
			// A file's snapshot is made in one call and leaves no record.
			out = &metapb.SnapshotReply{Dst: d.Ino, Done: true}
			return nil
		}
		out = proto.Clone(job.Totals).(*metapb.SnapshotReply)
		out.Dst = d.Ino
		return nil
	})
	return out, err
}

// snapshotTxn is one call's batch of a snapshot, inside its transaction.
type snapshotTxn struct {
	t      kv.Txn
	s      *Service
	now    int64
	budget int             // entries left to copy in this batch
	ready  map[uint64]bool // source directories this batch may copy from
	made   int64           // inodes made
	job    *metapb.SnapshotJob
	dst    uint64 // the job's root (key of its records)
}

// run starts or resumes the snapshot req asks for and copies one batch.
func (sn *snapshotTxn) run(c *metapb.Caller, req *metapb.SnapshotRequest) (*metapb.SnapshotReply, error) {
	t := sn.t
	p, err := getDir(t, req.DstParent)
	if err != nil {
		return nil, err
	}
	if p.Attr.Nlink == 0 {
		return nil, metaerr.New(syscall.ENOENT, "directory %d has been removed", req.DstParent)
	}
	if err := checkAccess(c, p.Attr, mayWrite|mayExec); err != nil {
		return nil, err
	}
	if d, ok, err := getDentry(t, req.DstParent, req.Name); err != nil {
		return nil, err
	} else if ok {
		// A resumption: the entry must be this snapshot's root.
		sn.job = &metapb.SnapshotJob{}
		found, err := getMsg(t, keys.Snapshot(d.Ino), sn.job)
		if err != nil {
			return nil, err
		}
		if !found || sn.job.Src != req.Src || sn.job.Totals.Done {
			return nil, metaerr.New(syscall.EEXIST, "%q exists in directory %d", req.Name, req.DstParent)
		}
		sn.dst = d.Ino
	} else if done, err := sn.start(p, req); err != nil || done != nil {
		return done, err
	}
	if err := sn.copyTasks(); err != nil {
		return nil, err
	}
	out := proto.Clone(sn.job.Totals).(*metapb.SnapshotReply)
	out.Dst = sn.dst
	if out.Done {
		return out, sn.finish()
	}
	return out, putMsg(t, keys.Snapshot(sn.dst), sn.job)
}

// start makes the copy's root in p. A file is copied whole at once and
// reported done; a directory becomes a job with its first task.
func (sn *snapshotTxn) start(p *metapb.InodeRecord, req *metapb.SnapshotRequest) (*metapb.SnapshotReply, error) {
	t := sn.t
	src, err := getInode(t, req.Src)
	if err != nil {
		return nil, err
	}
	if !isDir(src.Attr) {
		if src.Attr.Nlink == 0 {
			return nil, metaerr.New(syscall.ENOENT, "inode %d has been unlinked", req.Src)
		}
		totals := &metapb.SnapshotReply{Done: true}
		cp, err := sn.cloneFile(src, p.Attr.Ino, totals)
		if err != nil {
			return nil, err
		}
		if err := sn.link(p, req.Name, cp, true); err != nil {
			return nil, err
		}
		totals.Dst = cp.Attr.Ino
		return totals, nil
	}
	if src.Attr.Nlink == 0 {
		return nil, metaerr.New(syscall.ENOENT, "directory %d has been removed", req.Src)
	}
	if err := checkNotUnder(t, req.DstParent, req.Src); err != nil {
		return nil, metaerr.New(syscall.EINVAL, "cannot snapshot directory %d into itself", req.Src)
	}
	root, err := sn.cloneDir(src, p)
	if err != nil {
		return nil, err
	}
	if err := sn.link(p, req.Name, root, true); err != nil {
		return nil, err
	}
	sn.dst = root.Attr.Ino
	sn.job = &metapb.SnapshotJob{Src: req.Src, Totals: &metapb.SnapshotReply{Dirs: 1},
		StartedNs: sn.now, DstParent: req.DstParent, Name: req.Name}
	return nil, sn.addTask(src.Attr.Ino, root.Attr.Ino)
}

func (sn *snapshotTxn) addTask(srcDir, dstDir uint64) error {
	seq := sn.job.NextTask
	sn.job.NextTask++
	return putMsg(sn.t, keys.SnapTask(sn.dst, seq), &metapb.SnapshotTask{SrcDir: srcDir, DstDir: dstDir})
}

// copyTasks copies entries of the job's tasks, oldest first, until the
// batch's budget is spent or no task is left (the job is then done).
func (sn *snapshotTxn) copyTasks() error {
	t := sn.t
	prefix := keys.SnapTaskPrefix(sn.dst)
	for sn.budget > 0 {
		var key []byte
		task := &metapb.SnapshotTask{}
		if err := t.Scan(prefix, kv.PrefixEnd(prefix), 1, func(k, v []byte) error {
			key = append([]byte(nil), k...)
			return proto.Unmarshal(v, task)
		}); err != nil {
			return err
		}
		if key == nil {
			sn.job.Totals.Done = true
			return nil
		}
		if !sn.ready[task.SrcDir] {
			return nil // the next call gets it ready
		}
		finished, err := sn.copyDir(task)
		if err != nil {
			return err
		}
		if finished {
			err = t.Delete(key)
		} else {
			err = putMsg(t, key, task)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// copyDir copies up to the budget of task's entries and reports whether
// none is left.
func (sn *snapshotTxn) copyDir(task *metapb.SnapshotTask) (bool, error) {
	t := sn.t
	dst, err := getInode(t, task.DstDir)
	if metaerr.Errno(err) == syscall.ENOENT || err == nil && !isDir(dst.Attr) {
		// The copy's directory was removed meanwhile: nothing to copy into.
		return true, nil
	}
	if err != nil {
		return false, err
	}
	type entry struct {
		name string
		d    *metapb.DentryRecord
	}
	var entries []entry
	prefix := keys.DentryPrefix(task.SrcDir)
	start := prefix
	if task.Started {
		start = append(keys.Dentry(task.SrcDir, task.After), 0)
	}
	if err := t.Scan(start, kv.PrefixEnd(prefix), sn.budget+1, func(k, v []byte) error {
		_, name, err := keys.ParseDentry(k)
		if err != nil {
			return err
		}
		d := &metapb.DentryRecord{}
		if err := proto.Unmarshal(v, d); err != nil {
			return err
		}
		entries = append(entries, entry{name, d})
		return nil
	}); err != nil {
		return false, err
	}
	finished := len(entries) <= sn.budget
	if !finished {
		entries = entries[:sn.budget]
	}
	for _, e := range entries {
		if err := sn.copyEntry(dst, e.name, e.d); err != nil {
			return false, err
		}
		task.After, task.Started = e.name, true
		sn.budget--
	}
	return finished, sn.s.putInode(t, dst)
}

// copyEntry copies the source entry name → d into directory dst.
func (sn *snapshotTxn) copyEntry(dst *metapb.InodeRecord, name string, d *metapb.DentryRecord) error {
	t := sn.t
	if _, ok, err := getDentry(t, dst.Attr.Ino, name); err != nil || ok {
		return err // copied by an earlier attempt of this batch's task
	}
	src, err := getInode(t, d.Ino)
	if metaerr.Errno(err) == syscall.ENOENT {
		return nil // removed meanwhile
	}
	if err != nil {
		return err
	}
	totals := sn.job.Totals
	if isDir(src.Attr) {
		cp, err := sn.cloneDir(src, dst)
		if err != nil {
			return err
		}
		totals.Dirs++
		if err := sn.link(dst, name, cp, false); err != nil {
			return err
		}
		return sn.addTask(src.Attr.Ino, cp.Attr.Ino)
	}
	if src.Attr.Nlink > 1 {
		v, ok, err := t.Get(keys.SnapLink(sn.dst, src.Attr.Ino))
		if err != nil {
			return err
		}
		if ok {
			ino, err := keys.DecodeUint64(v)
			if err != nil {
				return err
			}
			cp, err := getInode(t, ino)
			if err != nil {
				return err
			}
			cp.Attr.Nlink++
			return sn.link(dst, name, cp, false)
		}
	}
	cp, err := sn.cloneFile(src, dst.Attr.Ino, totals)
	if err != nil {
		return err
	}
	totals.Files++
	if src.Attr.Nlink > 1 {
		if err := t.Put(keys.SnapLink(sn.dst, src.Attr.Ino), keys.EncodeUint64(cp.Attr.Ino)); err != nil {
			return err
		}
	}
	return sn.link(dst, name, cp, false)
}

// link adds the entry name → child to directory p and stores both. With
// touch p's times change as a create's would; a directory of the copy keeps
// its source's.
func (sn *snapshotTxn) link(p *metapb.InodeRecord, name string, child *metapb.InodeRecord, touch bool) error {
	if _, err := addEntry(sn.t, p, name, child.Attr.Ino, fileType(child.Attr.Mode)); err != nil {
		return err
	}
	if isDir(child.Attr) {
		p.Attr.Nlink++
	}
	if touch {
		p.Attr.MtimeNs, p.Attr.CtimeNs = sn.now, sn.now
	}
	if err := sn.s.putInode(sn.t, child); err != nil {
		return err
	}
	return sn.s.putInode(sn.t, p)
}

// newCopy returns a copy of src under a new inode number in directory
// parent, with one link and its extended attributes copied.
func (sn *snapshotTxn) newCopy(src *metapb.InodeRecord, parent uint64) (*metapb.InodeRecord, error) {
	ino, err := nextID(sn.t, counterIno, 1)
	if err != nil {
		return nil, err
	}
	cp := proto.Clone(src).(*metapb.InodeRecord)
	cp.Attr.Ino = ino
	cp.Attr.Nlink = 1
	cp.Attr.CtimeNs = sn.now
	cp.Parent = parent
	sn.made++
	prefix := keys.XattrPrefix(src.Attr.Ino)
	type xattr struct {
		name  string
		value []byte
	}
	var xs []xattr
	if err := sn.t.Scan(prefix, kv.PrefixEnd(prefix), 0, func(k, v []byte) error {
		_, name, err := keys.ParseXattr(k)
		xs = append(xs, xattr{name, append([]byte(nil), v...)})
		return err
	}); err != nil {
		return nil, err
	}
	for _, x := range xs {
		if err := sn.t.Put(keys.Xattr(ino, x.name), x.value); err != nil {
			return nil, err
		}
	}
	return cp, nil
}

// cloneDir makes an empty copy of directory src in p.
func (sn *snapshotTxn) cloneDir(src, p *metapb.InodeRecord) (*metapb.InodeRecord, error) {
	if p.Attr.Nlink >= LinkMax {
		return nil, metaerr.New(syscall.EMLINK, "directory %d has too many subdirectories", p.Attr.Ino)
	}
	cp, err := sn.newCopy(src, p.Attr.Ino)
	if err != nil {
		return nil, err
	}
	cp.Attr.Nlink = 2
	cp.NextCookie = FirstCookie
	return cp, nil
}

// cloneFile copies a file, symlink or special file into directory parent:
// its stripes reference the same chunk versions, both sides marked shared.
func (sn *snapshotTxn) cloneFile(src *metapb.InodeRecord, parent uint64, totals *metapb.SnapshotReply) (*metapb.InodeRecord, error) {
	t := sn.t
	cp, err := sn.newCopy(src, parent)
	if err != nil {
		return nil, err
	}
	// Stripes never committed are holes in the copy.
	items, _, err := fileStripes(t, src.Attr.Ino, 0, ^uint64(0))
	if err != nil {
		return nil, err
	}
	for _, it := range items {
		st := it.st
		if len(st.Shards) > 0 {
			if !st.Shared {
				st.Shared = true
				if err := putMsg(t, keys.Stripe(src.Attr.Ino, it.key.stripe), st); err != nil {
					return nil, err
				}
			}
			for _, sh := range st.Shards {
				if sh.ServerId == "" {
					continue
				}
				if err := addRef(t, sh.ChunkId, st.Version); err != nil {
					return nil, err
				}
			}
			totals.SharedStripes++
			totals.Bytes += st.Length
		}
		if err := putMsg(t, keys.Stripe(cp.Attr.Ino, it.key.stripe), st); err != nil {
			return nil, err
		}
	}
	return cp, nil
}

// finish drops the working records of a completed tree snapshot and keeps
// its job, done, as the record of what the directory is a snapshot of (it
// goes with the directory).
func (sn *snapshotTxn) finish() error {
	if err := deletePrefix(sn.t, keys.SnapLinkPrefix(sn.dst)); err != nil {
		return err
	}
	return putMsg(sn.t, keys.Snapshot(sn.dst), sn.job)
}
