package fs

import (
	"context"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"google.golang.org/protobuf/proto"

	"github.com/rdmafs/rdmafs/meta/client"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// Early creates and unlinks. The kernel looks a name up before it creates
// it; the lookup asks meta to reserve a missing name for the mount's session
// (meta/core/reserve.go). A create that follows within half the reservation
// is answered at once — the inode number from the session's own range, the
// attributes as meta will make them — and sent to meta behind. An unlink of
// a file the kernel knows is answered at once too and sent behind, naming
// the inode it removes. Calls sent behind reach meta in order with every
// later call that depends on them (meta/client/behind.go); fsync and
// fsyncdir wait for them; they are retried across meta restarts with their
// request ids, so an answered change is lost only with the mount, or when
// meta refuses it (logged, and counted by EarlyLost).

// Early sends the namespace changes a mount answers before meta applies
// them (meta/client.Session is one).
type Early interface {
	// NextIno returns an inode number of the session's own, or false when
	// none is at hand.
	NextIno() (uint64, bool)
	// CreateBehind, UnlinkBehind, LockBehind and SetAttrBehind send req
	// in the background and call done with the outcome; false means they
	// did not (too many in flight).
	CreateBehind(req *metapb.CreateRequest, done func(error)) bool
	UnlinkBehind(req *metapb.UnlinkRequest, done func(error)) bool
	LockBehind(req *metapb.LockRequest, done func(error)) bool
	SetAttrBehind(req *metapb.SetAttrRequest, done func(error)) bool
	// CarryInline gives data, the whole content of ino, closed since its
	// CreateBehind, to that create if it is still queued and the last call
	// on ino: meta commits it with the create, with mtime and ctime timeNs.
	// It reports whether it did.
	CarryInline(ino uint64, data []byte, timeNs int64) bool
	// ReleaseBehind sends the release of the session's open of ino behind
	// (nothing if ino's create has not been sent yet: it then opens
	// nothing); false as CreateBehind.
	ReleaseBehind(ino uint64, done func(error)) bool
	// WaitBehind waits until every call sent behind so far has returned,
	// and WaitIno those on ino.
	WaitBehind(ctx context.Context) error
	WaitIno(ctx context.Context, ino uint64) error
	// Recalls gives back the directory leases release (of epoch) and
	// waits a moment for recalls of those held (lease.go); it returns
	// meta's answer (its epoch, the ids of the leases recalled, how long
	// it keeps a silent holder's leases), or an error wrapping
	// client.ErrNoLeases from a meta server that grants none.
	Recalls(ctx context.Context, epoch uint64, release []uint64) (*metapb.RecallsReply, error)
}

// maxReserved bounds the reservations a directory node remembers; past it
// expired ones are dropped, and new ones are not kept.
const maxReserved = 256

// reservedName is a name meta holds for the mount: usable until until, with
// the directory's attributes and the layout of a new file at the lookup.
type reservedName struct {
	until  time.Time
	parent *metapb.Attr
	layout *metapb.Layout
}

// noteReserved remembers that meta holds name for the mount: a lookup sent
// at sent was answered r. The mount uses it for half the time meta holds
// it, counted from before the lookup, so that its create reaches meta while
// the name is held.
func (n *Node) noteReserved(name string, sent time.Time, r *metapb.EntryReply) {
	if r.ReservedMs == 0 || r.Parent == nil || r.NewLayout == nil {
		return
	}
	until := sent.Add(time.Duration(r.ReservedMs) * time.Millisecond / 2)
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.reserved == nil {
		n.reserved = make(map[string]reservedName)
	}
	if len(n.reserved) >= maxReserved {
		now := time.Now()
		for k, v := range n.reserved {
			if !now.Before(v.until) {
				delete(n.reserved, k)
			}
		}
		if len(n.reserved) >= maxReserved {
			return
		}
	}
	n.reserved[name] = reservedName{until: until, parent: r.Parent, layout: r.NewLayout}
	n.lastAttr = r.Parent
}

// takeReserved returns and forgets the reservation of name, if it is still
// usable.
func (n *Node) takeReserved(name string) (reservedName, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	r, ok := n.reserved[name]
	if !ok {
		return r, false
	}
	delete(n.reserved, name)
	return r, time.Now().Before(r.until)
}

// dropReserved forgets the directory's reservations: its attributes are
// changing, and the creates they would answer derive a new file's from them.
func (n *Node) dropReserved() {
	n.mu.Lock()
	n.reserved = nil
	n.mu.Unlock()
}

// changedDirAttr returns a copy of a, the directory's attributes before a
// change this mount answers itself, as the change leaves them at now.
func changedDirAttr(a *metapb.Attr, now int64) *metapb.Attr {
	if a == nil {
		return nil
	}
	c := proto.CloneOf(a)
	c.MtimeNs, c.CtimeNs = now, now
	return c
}

// createEarly answers a create of a regular file at once, if the mount holds
// the directory's lease and the name is not in it, or meta holds the name
// for the mount, and an inode number is at hand; it sends it behind.
func (n *Node) createEarly(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, bool) {
	early := n.fsys.opts.Early
	if early == nil {
		return nil, nil, false
	}
	c := n.fsys.callers.of(ctx)
	now := time.Now().UnixNano()
	req := &metapb.CreateRequest{Caller: c, Parent: n.ino, Name: name, Mode: mode & 0o7777, Exclusive: true,
		SessionId: n.fsys.opts.Session, OpenFlags: flags, TimeNs: now}
	// Under the lease, the check of the name and the queuing of the create
	// are one step for a recall: it sends the create before the lease goes.
	var parent *metapb.Attr
	var layout *metapb.Layout
	var leaseID uint64
	n.mu.Lock()
	l := n.leaseLocked()
	tooMany := l != nil && len(l.names) >= maxLeaseNames
	if l != nil && !tooMany {
		if _, exists := l.names[name]; !exists { // else the synchronous create opens it
			if ino, ok := early.NextIno(); ok {
				req.Ino = ino
				if early.CreateBehind(req, n.fsys.lostEarly("create", n, name, ino)) {
					l.added(name)
					parent, layout, leaseID = l.parent, l.layout, l.id
					before := l.attr
					n.dirChangeLocked()
					l.attr = changedDirAttr(before, now)
				}
			}
		}
	}
	n.mu.Unlock()
	if tooMany {
		n.dropLease()
	}
	if leaseID == 0 {
		gen := n.dirChange()
		res, ok := n.takeReserved(name)
		if !ok {
			return nil, nil, false
		}
		if req.Ino, ok = early.NextIno(); !ok {
			return nil, nil, false
		}
		if !early.CreateBehind(req, n.fsys.lostEarly("create", n, name, req.Ino)) {
			return nil, nil, false
		}
		parent, layout = res.parent, res.layout
		n.noteDirAttr(gen, changedDirAttr(parent, now))
	}
	a := metapb.NewAttr(c, parent, req.Ino, syscall.S_IFREG|mode&0o7777, now)
	a.Layout = layout
	inode, fh := n.newFile(ctx, name, a, flags, out)
	if child, ok := inode.Operations().(*Node); ok && leaseID != 0 {
		child.mu.Lock()
		child.createdIn, child.createdLease, child.createdInline = n, leaseID, layout.GetInlineMax()
		child.mu.Unlock()
		child.own(a)
	}
	return inode, fh, true
}

// unlinkEarly answers an unlink of a file the kernel knows at once and sends
// it behind, naming the inode: if the name refers to another inode by then
// (another mount replaced it), meta removes nothing.
func (n *Node) unlinkEarly(ctx context.Context, name string) bool {
	early := n.fsys.opts.Early
	if early == nil {
		return false
	}
	ch := n.GetChild(name)
	if ch == nil || ch.StableAttr().Mode&syscall.S_IFMT == syscall.S_IFDIR {
		return false
	}
	child, ok := ch.Operations().(*Node)
	if !ok {
		return false
	}
	now := time.Now().UnixNano()
	req := &metapb.UnlinkRequest{Caller: n.fsys.callers.of(ctx), Parent: n.ino, Name: name, Ino: child.ino, TimeNs: now}
	child.disown() // its link count drops (before n.mu: a file's lock goes first)
	n.mu.Lock()
	parent := n.lastAttr
	var before *metapb.Attr
	if n.lease != nil {
		before = n.lease.attr
	}
	gen := n.dirChangeLocked()
	queued := early.UnlinkBehind(req, n.fsys.lostEarly("unlink", n, name, child.ino))
	if queued && n.lease != nil {
		delete(n.lease.names, name)
		n.lease.attr = changedDirAttr(before, now)
	}
	n.mu.Unlock()
	if !queued {
		return false
	}
	if before == nil { // else the lease's attributes answer
		n.noteDirAttr(gen, changedDirAttr(parent, now))
	}
	return true
}

// waitChild waits for the calls sent behind on the inode the kernel knows
// at name: the unlinks in a directory about to be removed or replaced,
// which the call removing it does not name.
func (n *Node) waitChild(ctx context.Context, name string) error {
	early := n.fsys.opts.Early
	if early == nil {
		return nil
	}
	ch := n.GetChild(name)
	if ch == nil {
		return nil
	}
	return early.WaitIno(ctx, ch.StableAttr().Ino)
}

// lostEarly returns the completion of a change answered early in dir: one
// that meta refused is logged and counted, since the application was told
// it happened, and the directory's lease goes back (its list of names is
// wrong). An unlink of a name that is gone (ENOENT) is no loss: the name is
// gone.
func (fsys *FS) lostEarly(op string, dir *Node, name string, ino uint64) func(error) {
	return func(err error) {
		if err == nil || (op == "unlink" && client.Errno(err) == syscall.ENOENT) {
			return
		}
		dir.dropLease()
		fsys.earlyLost.Add(1)
		fsys.log.Error("a "+op+" answered before meta applied it failed: the application was told it succeeded",
			"parent", dir.ino, "name", name, "ino", ino, "err", err)
	}
}

// EarlyLost returns the number of creates and unlinks answered before meta
// applied them that meta then refused.
func (fsys *FS) EarlyLost() uint64 { return fsys.earlyLost.Load() }
