package fs

import (
	"context"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"google.golang.org/protobuf/proto"

	"github.com/rdmafs/rdmafs/meta/metapb"
)

// Attributes of files the mount owns. While the mount holds the lease of
// the directory it created a file in (lease.go), and the file has no other
// name, no other session can reach the file: every way to it passes through
// the directory, whose lookups and listings recall the lease. So the mount
// knows the file's attributes — as its create made them, then as meta
// answered each change the mount made (commits of its data, setattr, open
// with O_TRUNC) — and answers lookups and getattrs of the file itself: the
// stat and the unlink of a file this mount just wrote cost no call to meta.
//
// A change in flight makes the attributes unknown until it returns; when
// two overlap, meta may have applied them in either order, so they stay
// unknown until a getattr or lookup sent and answered with no change in
// flight fetches them again. A rename or a link of the file, or its unlink,
// ends the ownership.

// ownTable finds the owned files by inode, for the data engine's commits.
type ownTable struct {
	mu    sync.Mutex
	nodes map[uint64]*Node
}

func (t *ownTable) add(n *Node) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.nodes == nil {
		t.nodes = map[uint64]*Node{}
	}
	t.nodes[n.ino] = n
}

func (t *ownTable) remove(n *Node) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.nodes[n.ino] == n {
		delete(t.nodes, n.ino)
	}
}

func (t *ownTable) get(ino uint64) *Node {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.nodes[ino]
}

// ownState is a file's owned attributes (under its Node's mu).
type ownState struct {
	attr  *metapb.Attr // nil: not known
	busy  int          // changes in flight
	mixed bool         // two of them overlapped since busy was last 0
	gen   uint64       // counts changes begun and ended
	off   bool         // owned no more
}

// own makes the mount the owner of n, a file it just created under its
// directory's lease with attributes a.
func (n *Node) own(a *metapb.Attr) {
	n.mu.Lock()
	n.owned.attr = a
	n.mu.Unlock()
	n.fsys.owned.add(n)
}

// disown ends the ownership of n (renamed, linked or unlinked).
func (n *Node) disown() {
	n.mu.Lock()
	n.owned.off, n.owned.attr = true, nil
	n.mu.Unlock()
	n.fsys.owned.remove(n)
}

// owned is a file's owned attributes (nil: not known) with the size this
// mount's uncommitted writes give it (dirty: it holds some).
type owned struct {
	attr  *metapb.Attr
	size  int64
	dirty bool
}

// ownedAttr returns the file's attributes if the mount owns it and knows
// them, with the engine's size of the file. That size is read first: a
// commit that ends after it was read leaves the writes in the engine (it
// reports the end, endCommit, before it lets go of them), and one that
// ended before it has updated the attributes, or made them unknown. Read
// the other way round, attributes from before a commit could go with an
// engine that no longer holds its writes: the size from before them.
func (n *Node) ownedAttr() owned {
	size, dirty := n.fsys.dataSize(n.ino)
	n.mu.Lock()
	a := n.owned.attr
	if n.owned.busy > 0 {
		a = nil
	}
	n.mu.Unlock()
	if a == nil || !n.owns() {
		return owned{}
	}
	return owned{a, size, dirty}
}

// owns reports whether the mount owns the file: no other session has
// reached it.
func (n *Node) owns() bool {
	dir, id, owned := n.ownerLease()
	return owned && dir.heldBy(id)
}

// ownerLease returns the directory and the lease the file was created
// under, if it was, and whether the mount still owns it as far as the file
// knows (the lease may be gone: see owns).
func (n *Node) ownerLease() (dir *Node, id uint64, owned bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.createdIn, n.createdLease, n.createdIn != nil && !n.owned.off
}

// beginChange notes a change to an owned file's attributes sent to meta.
func (n *Node) beginChange() {
	n.mu.Lock()
	defer n.mu.Unlock()
	o := &n.owned
	o.busy++
	o.gen++
	o.mixed = o.mixed || o.busy > 1
	o.attr = nil
}

// endChange notes that a change begun with beginChange returned, with the
// attributes meta answered (nil: failed, or none in the reply).
func (n *Node) endChange(a *metapb.Attr) {
	n.mu.Lock()
	defer n.mu.Unlock()
	o := &n.owned
	o.busy--
	o.gen++
	if o.busy > 0 {
		return
	}
	if !o.mixed && !o.off && a != nil {
		o.attr = a
	}
	o.mixed = false
}

// fetchGen returns the count of changes to pass to noteFetched, and false
// when a change is in flight (a reply may then predate it).
func (n *Node) fetchGen() (uint64, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.owned.gen, n.owned.busy == 0
}

// noteFetched keeps a, an owned file's attributes fetched from meta by a
// call sent when gen changes had begun and ended, if none has since.
func (n *Node) noteFetched(gen uint64, a *metapb.Attr) {
	n.mu.Lock()
	defer n.mu.Unlock()
	o := &n.owned
	if n.createdIn != nil && !o.off && o.busy == 0 && o.gen == gen && a != nil && a.Ino == n.ino {
		o.attr = a
	}
}

// ownedChild returns the node and attributes of name, a file the mount
// owns in the directory and knows the attributes of.
func (n *Node) ownedChild(name string) (*Node, owned) {
	ch := n.GetChild(name)
	if ch == nil {
		return nil, owned{}
	}
	c, ok := ch.Operations().(*Node)
	if !ok {
		return nil, owned{}
	}
	c.mu.Lock()
	in := c.createdIn
	c.mu.Unlock()
	if in != n {
		return nil, owned{}
	}
	o := c.ownedAttr()
	if o.attr == nil {
		return nil, owned{}
	}
	return c, o
}

// beginCommit and endCommit observe the data engine's commits
// (Data.ObserveCommits).
func (fsys *FS) beginCommit(ino uint64) {
	if n := fsys.owned.get(ino); n != nil {
		n.beginChange()
	}
}

func (fsys *FS) endCommit(ino uint64, r *metapb.CommitStripesReply) {
	fsys.stamps.committed(ino, r.GetPrevCtimeNs(), r.GetAttr())
	if n := fsys.owned.get(ino); n != nil {
		n.endChange(r.GetAttr())
	}
}

// OnForget implements gofs.NodeOnForgetter: the kernel no longer knows the
// inode, and no lookup reaches this node again.
func (n *Node) OnForget() {
	n.fsys.owned.remove(n)
	n.fsys.stamps.set(n.ino, nil)
	if d := n.fsys.opts.Data; d != nil && n.StableAttr().Mode&syscall.S_IFMT == syscall.S_IFREG {
		d.Forget(n.ino)
	}
}

// chownOwned answers a chown of an owned file to the owner and group it
// has (sqlite, run as root, gives its journal the database's owner every
// transaction) and sends it behind; nil if the caller must call meta. Such
// a chown changes only the ctime: the mount sets it, and meta sets the
// same. It is answered so only for root or the file's owner, on a file
// with no set-user-ID or set-group-ID bit (a chown clears those).
func (n *Node) chownOwned(ctx context.Context, in *fuse.SetAttrIn) *metapb.Attr {
	early := n.fsys.opts.Early
	// FATTR_KILL_SUIDGID comes with every chown under HANDLE_KILLPRIV_V2;
	// the file has neither bit (checked below), so it changes nothing.
	const allowed = fuse.FATTR_UID | fuse.FATTR_GID | fuse.FATTR_CTIME | fuse.FATTR_FH | fuse.FATTR_LOCKOWNER | fuse.FATTR_KILL_SUIDGID
	if early == nil || in.Valid&(fuse.FATTR_UID|fuse.FATTR_GID) == 0 || in.Valid&^allowed != 0 {
		return nil
	}
	dir, id, owned := n.ownerLease()
	if !owned {
		return nil
	}
	c := n.fsys.callers.of(ctx)
	n.mu.Lock()
	a := n.owned.attr
	ok := a != nil && n.owned.busy == 0 && (c.Uid == 0 || c.Uid == a.Uid) && a.Mode&(syscall.S_ISUID|syscall.S_ISGID) == 0
	if u, set := in.GetUID(); set && ok {
		ok = u == a.Uid
	}
	if g, set := in.GetGID(); set && ok {
		ok = g == a.Gid
	}
	n.mu.Unlock()
	if !ok {
		return nil
	}
	now := time.Now().UnixNano()
	req := &metapb.SetAttrRequest{Caller: c, Ino: n.ino, SetUid: true, Uid: a.Uid, SetGid: true, Gid: a.Gid, SetCtime: true, CtimeNs: now}
	if !dir.sendUnderLease(id, func() bool { return early.SetAttrBehind(req, n.fsys.lostChange("chown", n)) }) {
		return nil
	}
	after := proto.CloneOf(a)
	after.CtimeNs = now
	n.mu.Lock()
	if n.owned.attr == a {
		n.owned.attr = after
	} else {
		n.owned.attr = nil // changed meanwhile: asked again
	}
	n.mu.Unlock()
	return after
}

// lostChange returns the completion of a change of n's attributes sent
// behind: one meta refused was answered already (logged and counted), and
// n's attributes are not known any more.
func (fsys *FS) lostChange(op string, n *Node) func(error) {
	return func(err error) {
		if err == nil {
			return
		}
		n.disown()
		fsys.earlyLost.Add(1)
		fsys.log.Error("a "+op+" answered before meta applied it failed: the application was told it succeeded", "ino", n.ino, "err", err)
	}
}
