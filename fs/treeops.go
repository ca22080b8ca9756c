package fs

import (
	"context"
	"encoding/json"
	"strings"
	"syscall"

	"github.com/rdmafs/rdmafs/meta/metapb"
)

// SnapshotXattr is the virtual extended attribute of `rdmafs snapshot`.
// Setting it on a directory to the JSON of a SnapshotSpec copies the inode
// src (a file or a directory tree of this file system) as the new entry
// name in the directory, sharing its data (meta's Snapshot, batch after
// batch until done; an interrupted snapshot resumes when set again). What
// this mount has written and not yet committed is committed first. Reading
// SnapshotXattr + "." + name on the directory reports that snapshot's
// progress (metapb.SnapshotReply as JSON). Neither is listed by listxattr.
const SnapshotXattr = "rdmafs.snapshot"

// RmrXattr is the virtual extended attribute of `rdmafs rmr`: setting it on
// a directory to a name removes that entry and, for a directory, everything
// below it on the meta server (meta's RemoveTree), with the permission
// checks of rm -r for the caller. The kernel's cached entries of the tree
// are dropped just after the reply (the request holds the directory's lock
// the invalidation needs), so a lookup at once may still find them for a
// few milliseconds; rdmafs rmr waits until they are gone.
const RmrXattr = "rdmafs.rmr"

// SnapshotSpec is the value of SnapshotXattr.
type SnapshotSpec struct {
	Src  uint64 `json:"src"`
	Name string `json:"name"`
}

// flusher is a data engine that can commit everything it holds.
type flusher interface {
	FlushAll(ctx context.Context) error
}

// setSnapshot makes the snapshot a write of SnapshotXattr on n asks for.
func (n *Node) setSnapshot(ctx context.Context, value []byte) syscall.Errno {
	var spec SnapshotSpec
	if err := json.Unmarshal(value, &spec); err != nil || spec.Src == 0 || spec.Name == "" {
		n.fsys.log.Info("setxattr "+SnapshotXattr, "ino", n.ino, "value", string(value), "err", err)
		return syscall.EINVAL
	}
	if f, ok := n.fsys.opts.Data.(flusher); ok {
		if err := f.FlushAll(ctx); err != nil {
			return errno(err)
		}
	}
	n.dirChange()
	// A negative entry the kernel may hold goes, once this request (which
	// holds the directory's lock the invalidation needs) has returned.
	defer func() { go n.NotifyEntry(spec.Name) }()
	req := &metapb.SnapshotRequest{Caller: n.fsys.callers.of(ctx), Src: spec.Src, DstParent: n.ino, Name: spec.Name}
	for {
		r, err := n.fsys.meta.Snapshot(ctx, req)
		if err != nil {
			n.fsys.log.Warn("snapshot failed", "src", spec.Src, "dir", n.ino, "name", spec.Name, "err", err)
			return errno(err)
		}
		if r.Done {
			return 0
		}
	}
}

// snapshotXattr answers a read of SnapshotXattr.NAME; ok is false for any
// other attribute.
func (n *Node) snapshotXattr(ctx context.Context, attr string, dest []byte) (size uint32, e syscall.Errno, ok bool) {
	name, found := strings.CutPrefix(attr, SnapshotXattr+".")
	if !found {
		return 0, 0, false
	}
	r, err := n.fsys.meta.Snapshot(ctx, &metapb.SnapshotRequest{Caller: n.fsys.callers.of(ctx), DstParent: n.ino, Name: name, Progress: true})
	size, e = jsonXattr(r, err, dest)
	return size, e, true
}

// setRmr removes the tree a write of RmrXattr on n names.
func (n *Node) setRmr(ctx context.Context, value []byte) syscall.Errno {
	name := string(value)
	n.dirChange()
	defer func() { go n.NotifyEntry(name) }() // after the reply: see setSnapshot
	req := &metapb.RemoveTreeRequest{Caller: n.fsys.callers.of(ctx), Parent: n.ino, Name: name}
	for {
		r, err := n.fsys.meta.RemoveTree(ctx, req)
		if err != nil {
			return errno(err)
		}
		if r.Done {
			return 0
		}
	}
}
