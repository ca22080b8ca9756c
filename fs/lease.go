package fs

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/rdmafs/rdmafs/meta/client"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// Directory leases (meta/core/lease.go). A lookup of a missing name asks
// meta for the directory's lease too; a grant lists every name in it. While
// the mount holds the lease no other session reads or changes the
// directory's entries without recalling it first, so the mount answers a
// lookup of a name not in the list with ENOENT and a create of one at once
// (sent behind, as an early create), without asking meta. Every change this
// mount makes in the directory keeps the list up to date. A close of a file
// created under the lease does not wait for its create: another mount can
// reach the file only through the directory, which recalls the lease, and
// the recall sends every call queued behind before the lease goes back.
//
// Likewise a close of such a file small enough to keep its data in metadata
// does not wait for that data: the flush runs in the background
// (flushBehind), and a recall of the lease waits for it before it sends the
// calls behind. Its errors, which only meta's (no chunkserver is involved),
// reach no application (as a write-back error on a local file system no one
// fsyncs): they are logged and counted with EarlyLost.
//
// The kernel may cache a name the lease says is missing (a negative entry),
// and the entries of names in the directory, for as long as the mount may
// use the lease without hearing from meta again (leaseTTL): a lookup of a
// name a build or an application probes for, the lookup before each create,
// and the lookup before each unlink then cost no request. When the lease
// goes, the mount invalidates the entries it gave under it before it hands
// the lease back (waiting a bounded time: the kernel takes the directory's
// lock to do it, which a request in the directory may hold).
//
// A goroutine keeps a Recalls call at meta: it returns the recalls, and at
// least every half second an empty answer. A lease is used only while such
// an answer arrived within the lease's freshness (two thirds of meta's
// LeaseSilence, which each answer gives: RecallsReply.silence_ms) and of the
// epoch of the grant: meta takes back the leases of a holder silent for
// longer, and a restarted meta has another epoch.

// defaultLeaseFresh is how long after a Recalls answer a mount uses its
// leases when meta does not say (an older server, whose LeaseSilence was
// 1.5s).
const defaultLeaseFresh = time.Second

// leaseFreshFor returns how long after a Recalls answer the mount may use
// its leases when meta keeps those of a silent holder for silence: two
// thirds of it, leaving meta's answer time to arrive.
func leaseFreshFor(silence time.Duration) time.Duration {
	if silence <= 0 {
		return defaultLeaseFresh
	}
	return silence * 2 / 3
}

// maxLeasedDirs bounds the directories the mount holds leases on.
const maxLeasedDirs = 256

// maxLeaseNames bounds the names the mount keeps for one leased directory;
// past it, it gives the lease back.
const maxLeaseNames = 1 << 18

// leaseBackoff is how long after a refusal or a recall the mount does not
// ask for a directory's lease again.
const leaseBackoff = time.Second

// maxNegative bounds the negative entries the kernel may still hold that
// the mount gave under one lease (those of about the last two lease
// freshness periods: negativeNames); past it, missing names are answered
// uncached.
// A program that probes every name before it creates it (fio does, three
// times over) makes thousands a second.
const maxNegative = 16384

// maxNegativeTotal bounds the live negative entries of all of a mount's
// leases together.
const maxNegativeTotal = 1 << 16

// minLeaseTTL is the shortest entry worth giving under a lease.
const minLeaseTTL = 10 * time.Millisecond

// invalidateWait bounds how long the Recalls loop waits for the
// invalidation of the entries of leases it gives back; a lease whose
// invalidation takes longer goes back with a later call, once it is done or
// its entries have expired anyway.
const invalidateWait = 300 * time.Millisecond

// maxLongEntries bounds the names of one lease the kernel may hold for
// longer than the entry timeout; past it, names get the entry timeout.
const maxLongEntries = 1 << 16

// dirLease is a directory lease this mount holds (under its Node's mu).
type dirLease struct {
	id, epoch uint64
	names     map[string]struct{}
	parent    *metapb.Attr   // the directory's attributes at the grant
	layout    *metapb.Layout // a new file's layout
	// attr is the directory's attributes as the changes through this
	// mount left them (it answers getattr); nil while a change's outcome
	// is not known.
	attr *metapb.Attr
	// negative holds the names the kernel may cache as missing.
	negative negativeNames
	// long holds the names of files the kernel got an entry of for longer
	// than the entry timeout (Node.entryTimeout), and until the time by
	// which every entry given under the lease, long or negative, expires.
	long  map[string]struct{}
	until time.Time
}

// added records that name was added to the directory through this mount.
// The kernel then holds the name as an entry, no longer as missing.
func (l *dirLease) added(name string) {
	l.names[name] = struct{}{}
	l.negative.remove(name)
}

// negativeNames are the names a lease gave the kernel as missing that the
// kernel may still hold: those given since since (recent), and those given
// in the longest entry time before that (older). Names given earlier still
// have expired in the kernel and are forgotten, so that a long-held lease
// keeps giving negative entries and its loss invalidates only live ones.
type negativeNames struct {
	recent, older map[string]struct{}
	since         time.Time
	total         *atomic.Int64 // the mount's count of them all (leaseTable.negatives)
}

// add records name, given at now with an entry timeout of at most timeout,
// and reports whether it could: false when maxNegative are live, or
// maxNegativeTotal in the mount.
func (g *negativeNames) add(name string, now time.Time, timeout time.Duration) bool {
	total := g.total
	if age := now.Sub(g.since); age >= timeout {
		expired := len(g.older)
		g.older = g.recent
		if age >= 2*timeout {
			expired += len(g.older) // given before the last rotation but one
			g.older = nil
		}
		g.recent, g.since = nil, now
		total.Add(-int64(expired))
	}
	if _, ok := g.recent[name]; ok {
		return true
	}
	if len(g.recent)+len(g.older) >= maxNegative {
		return false
	}
	if total.Add(1) > maxNegativeTotal {
		total.Add(-1)
		return false
	}
	if g.recent == nil {
		g.recent = map[string]struct{}{}
	}
	g.recent[name] = struct{}{}
	if _, ok := g.older[name]; ok {
		delete(g.older, name)
		total.Add(-1)
	}
	return true
}

// remove forgets name: the kernel holds it as an entry now.
func (g *negativeNames) remove(name string) {
	n := len(g.recent) + len(g.older)
	delete(g.recent, name)
	delete(g.older, name)
	if d := n - len(g.recent) - len(g.older); d > 0 {
		g.total.Add(-int64(d))
	}
}

// drop forgets every name and returns those the kernel may still hold as
// missing.
func (g *negativeNames) drop() []string {
	out := make([]string, 0, len(g.recent)+len(g.older))
	for name := range g.recent {
		out = append(out, name)
	}
	for name := range g.older {
		out = append(out, name)
	}
	g.total.Add(-int64(len(out)))
	g.recent, g.older = nil, nil
	return out
}

// leaseTable is the mount's side of the leases.
type leaseTable struct {
	mu        sync.Mutex
	epoch     uint64        // of the last Recalls answer
	heard     time.Time     // when it arrived
	fresh     time.Duration // how long after heard the leases are used (leaseFreshFor)
	byID      map[uint64]*Node
	recalled  map[uint64]bool // recalls of leases whose grant had not arrived
	release   []uint64        // ids to give back with the next Recalls call
	stop      context.CancelFunc
	done      chan struct{}
	flushes   sync.WaitGroup // flushes behind running
	negatives atomic.Int64   // live negative entries of all leases (negativeNames)
	// invalidating holds the invalidations of the entries of leases gone
	// that may still be running, by lease id.
	invalidating map[uint64]invalidation
	on           bool          // set before the mount serves, never changed
	ready        chan struct{} // closed at the first Recalls answer (or when there will be none)
	once         sync.Once
}

// startLeases starts the Recalls loop.
func (fsys *FS) startLeases() {
	t := &fsys.leases
	t.on = true
	t.fresh = defaultLeaseFresh
	t.ready = make(chan struct{})
	t.byID = map[uint64]*Node{}
	t.recalled = map[uint64]bool{}
	ctx, cancel := context.WithCancel(context.Background())
	t.stop, t.done = cancel, make(chan struct{})
	go fsys.recallLoop(ctx)
}

// Close stops the mount's use of directory leases (at unmount; the end of
// the session gives them back at meta).
func (fsys *FS) Close() {
	t := &fsys.leases
	if t.stop == nil {
		return
	}
	t.stop()
	<-t.done
	t.flushes.Wait()
	t.mu.Lock()
	nodes := t.byID
	t.byID = map[uint64]*Node{}
	t.mu.Unlock()
	for _, n := range nodes {
		n.mu.Lock()
		n.lease = nil
		n.mu.Unlock()
	}
}

// LeasesReady returns a channel closed once the mount has heard from meta
// whether it may hold directory leases (its first Recalls answer): from
// then on lookups of missing names ask for them. Without early changes
// (Options.Early) it is closed at once.
func (fsys *FS) LeasesReady() <-chan struct{} {
	if t := &fsys.leases; t.on {
		return t.ready
	}
	closed := make(chan struct{})
	close(closed)
	return closed
}

// invalidation is the invalidation of a lease's entries in the kernel:
// done is closed when it has finished; the entries expire by until anyway.
type invalidation struct {
	done  chan struct{}
	until time.Time
}

// live reports whether leases of epoch may be used now (caller holds t.mu).
func (t *leaseTable) liveLocked(epoch uint64, now time.Time) bool {
	return epoch == t.epoch && now.Sub(t.heard) < t.fresh
}

// leaseUsable reports whether l, n's lease, may be used now: of the current
// epoch, heard of recently, and not recalled meanwhile (the Recalls loop
// takes a recalled lease out of byID before the node lets go of it).
func (fsys *FS) leaseUsable(n *Node, l *dirLease) bool {
	t := &fsys.leases
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.liveLocked(l.epoch, time.Now()) && t.byID[l.id] == n
}

// releasable splits ids, leases to give back, into those whose entries the
// kernel has dropped or whose entries have expired, and those to give back
// later. It waits up to invalidateWait for invalidations still running.
func (t *leaseTable) releasable(ids []uint64) (now, later []uint64) {
	deadline := time.NewTimer(invalidateWait)
	defer deadline.Stop()
	for _, id := range ids {
		t.mu.Lock()
		inv, ok := t.invalidating[id]
		t.mu.Unlock()
		if ok {
			select {
			case <-inv.done:
			case <-deadline.C:
				deadline.Reset(0)
			}
			select {
			case <-inv.done:
			default:
				if time.Now().Before(inv.until) {
					later = append(later, id)
					continue
				}
			}
			t.mu.Lock()
			delete(t.invalidating, id)
			t.mu.Unlock()
		}
		now = append(now, id)
	}
	return now, later
}

// recallLoop keeps a Recalls call at meta and hands back recalled leases.
func (fsys *FS) recallLoop(ctx context.Context) {
	t := &fsys.leases
	defer close(t.done)
	early := fsys.opts.Early
	for ctx.Err() == nil {
		t.mu.Lock()
		epoch, release := t.epoch, t.release
		t.release = nil
		t.mu.Unlock()
		if len(release) > 0 {
			// The kernel drops what it cached under them first.
			var later []uint64
			release, later = t.releasable(release)
			if len(later) > 0 {
				t.mu.Lock()
				t.release = append(t.release, later...)
				t.mu.Unlock()
			}
		}
		if len(release) > 0 {
			// What was answered under the leases goes to meta before they
			// do (meta fences a lease's files until then: lease.go there).
			// The wait is short, so that the Recalls calls go on (a holder
			// silent for meta's LeaseSilence loses its leases); leases whose
			// calls are not all sent yet go back with a later call.
			wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			err := early.WaitBehind(wctx)
			cancel()
			if err != nil {
				t.mu.Lock()
				t.release = append(release, t.release...)
				t.mu.Unlock()
				release = nil
			}
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		reply, err := early.Recalls(cctx, epoch, release)
		cancel()
		if errors.Is(err, client.ErrNoLeases) {
			fsys.log.Info("the meta server grants no directory leases: the mount answers lookups of missing names through it")
			t.once.Do(func() { close(t.ready) })
			return
		}
		if err != nil {
			t.mu.Lock()
			t.heard = time.Time{} // unheard: no lease is used until meta answers again
			t.release = append(release, t.release...)
			t.mu.Unlock()
			sleepCtx(ctx, 100*time.Millisecond)
			continue
		}
		now := time.Now()
		newEpoch, recall := reply.Epoch, reply.Recall
		var dropped []*Node
		t.mu.Lock()
		if newEpoch != t.epoch {
			// Another run of meta: every lease held is void.
			for _, n := range t.byID {
				dropped = append(dropped, n)
			}
			t.byID = map[uint64]*Node{}
			t.recalled = map[uint64]bool{}
			t.release = nil
			t.epoch = newEpoch
		}
		t.heard = now
		t.fresh = leaseFreshFor(time.Duration(reply.SilenceMs) * time.Millisecond)
		t.once.Do(func() { close(t.ready) })
		for _, id := range recall {
			if n := t.byID[id]; n != nil {
				delete(t.byID, id)
				dropped = append(dropped, n)
			} else if len(t.recalled) < maxLeasedDirs*4 {
				t.recalled[id] = true // its grant is on its way: not to be used
			}
		}
		t.mu.Unlock()
		for _, n := range dropped {
			n.forgetLease(now)
		}
		if len(recall) == 0 {
			continue
		}
		// What the mount answered in those directories goes to meta
		// before the leases do: the data of files closed there here, the
		// calls behind before the next Recalls call gives them back.
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		for _, n := range dropped {
			n.settleFlushes(wctx)
		}
		cancel()
		t.mu.Lock()
		t.release = append(t.release, recall...)
		t.mu.Unlock()
	}
}

// sleepCtx waits d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) {
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
	case <-ctx.Done():
	}
}

// forgetLease drops the node's lease (recalled, or void) and starts the
// backoff before it asks again.
func (n *Node) forgetLease(now time.Time) {
	n.mu.Lock()
	l := n.lease
	n.lease = nil
	n.leaseAskAfter = now.Add(leaseBackoff)
	n.mu.Unlock()
	n.invalidateEntries(l)
}

// invalidateEntries has the kernel drop the entries it was given under l, a
// lease the node no longer holds, in the background: a request in the
// directory may hold the directory's lock the kernel needs for it. Those
// are the negative entries it may still hold and the entries of files it
// got for longer than the entry timeout. The lease goes back to meta once
// that is done, or once they have expired (leaseTable.releasable).
func (n *Node) invalidateEntries(l *dirLease) {
	if l == nil {
		return
	}
	names := l.negative.drop()
	n.mu.Lock()
	for name := range l.long {
		names = append(names, name)
	}
	l.long = nil
	until := l.until
	n.mu.Unlock()
	if len(names) == 0 {
		return
	}
	t := &n.fsys.leases
	inv := invalidation{done: make(chan struct{}), until: until}
	t.mu.Lock()
	if t.invalidating == nil {
		t.invalidating = map[uint64]invalidation{}
	}
	t.invalidating[l.id] = inv
	t.mu.Unlock()
	go func() {
		defer close(inv.done)
		for _, name := range names {
			n.NotifyEntry(name) // ENOENT: the kernel has it no more (or another entry)
		}
	}()
}

// forgetLong forgets name's entry among those the kernel got for longer
// than the entry timeout under the directory's lease, and reports whether
// it was: a rename by this mount moves that entry, with its time, out of
// the lease's reach, so the caller has the kernel drop it.
func (n *Node) forgetLong(name string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	l := n.lease
	if l == nil {
		return false
	}
	_, long := l.long[name]
	delete(l.long, name)
	return long
}

// leaseTTL returns how long the kernel may cache an entry given under a
// lease: until the mount would stop using the lease unless it heard from
// meta again (0: not at all); and the longest it gives, the freshness.
func (fsys *FS) leaseTTL(now time.Time) (ttl, longest time.Duration) {
	t := &fsys.leases
	t.mu.Lock()
	left, longest := t.heard.Add(t.fresh).Sub(now), t.fresh
	t.mu.Unlock()
	if left < minLeaseTTL {
		return 0, longest
	}
	return left, longest
}

// entryTimeout returns how long the kernel may cache the entry of name in
// the directory, for an inode of mode: the entry timeout, or for a file
// longer, while the mount holds the directory's lease (whose loss then
// invalidates the entry). A directory's entry keeps the entry timeout: the
// invalidation of a directory's entry would also detach mounts below it.
func (n *Node) entryTimeout(name string, mode uint32) time.Duration {
	timeout := n.fsys.opts.EntryTimeout
	if mode&syscall.S_IFMT == syscall.S_IFDIR {
		return timeout
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	l := n.leaseLocked()
	if l == nil {
		return timeout
	}
	now := time.Now()
	ttl, _ := n.fsys.leaseTTL(now)
	if ttl <= timeout {
		return timeout
	}
	if _, ok := l.long[name]; !ok {
		if len(l.long) >= maxLongEntries {
			return timeout
		}
		if l.long == nil {
			l.long = map[string]struct{}{}
		}
		l.long[name] = struct{}{}
	}
	if end := now.Add(ttl); end.After(l.until) {
		l.until = end
	}
	return ttl
}

// wantLease reports whether a lookup in the directory should ask for its
// lease.
func (n *Node) wantLease() bool {
	if !n.fsys.leases.on {
		return false
	}
	now := time.Now()
	n.mu.Lock()
	ask := n.lease == nil && !now.Before(n.leaseAskAfter)
	n.mu.Unlock()
	if !ask {
		return false
	}
	t := &n.fsys.leases
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.liveLocked(t.epoch, now) && len(t.byID) < maxLeasedDirs
}

// installLease keeps a lease meta granted; one recalled before its grant
// arrived, or of another epoch, is given back instead.
func (n *Node) installLease(g *metapb.DirLease, r *metapb.EntryReply) {
	t := &n.fsys.leases
	now := time.Now()
	t.mu.Lock()
	if t.recalled[g.Id] || !t.liveLocked(g.Epoch, now) || t.byID[g.Id] != nil {
		delete(t.recalled, g.Id)
		if g.Epoch == t.epoch {
			t.release = append(t.release, g.Id)
		}
		t.mu.Unlock()
		return
	}
	t.byID[g.Id] = n
	t.mu.Unlock()
	names := make(map[string]struct{}, len(g.Names))
	for _, name := range g.Names {
		names[name] = struct{}{}
	}
	n.mu.Lock()
	old := n.lease
	n.lease = &dirLease{id: g.Id, epoch: g.Epoch, names: names, parent: r.Parent, layout: r.NewLayout, attr: r.Parent,
		negative: negativeNames{total: &t.negatives}}
	n.lastAttr = r.Parent
	n.mu.Unlock()
	if old != nil {
		n.invalidateEntries(old)
		n.fsys.giveBack(old.id)
	}
}

// giveBack returns lease id to meta with the next Recalls call.
func (fsys *FS) giveBack(id uint64) {
	t := &fsys.leases
	t.mu.Lock()
	delete(t.byID, id)
	t.release = append(t.release, id)
	t.mu.Unlock()
}

// dropLease gives the directory's lease back at once: its attributes or
// layout are changing (new files derive theirs from them), or a change
// answered under it failed and its list of names may be wrong.
func (n *Node) dropLease() {
	n.mu.Lock()
	l := n.lease
	n.lease = nil
	n.mu.Unlock()
	if l != nil {
		n.invalidateEntries(l)
		n.fsys.giveBack(l.id)
	}
}

// leaseLocked returns the directory's lease if it may be used now (caller
// holds n.mu).
func (n *Node) leaseLocked() *dirLease {
	if n.lease == nil || !n.fsys.leaseUsable(n, n.lease) {
		return nil
	}
	return n.lease
}

// leaseAttr returns the directory's attributes if the mount holds its lease
// and knows them.
func (n *Node) leaseAttr() *metapb.Attr {
	n.mu.Lock()
	defer n.mu.Unlock()
	if l := n.leaseLocked(); l != nil {
		return l.attr
	}
	return nil
}

// leased reports whether the mount holds the directory's lease and may
// use it now.
func (n *Node) leased() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.leaseLocked() != nil
}

// leaseMissing reports whether the directory's lease says name is missing
// and for how long the kernel may cache that (0: not at all); the name is
// then among those invalidated when the lease goes.
func (n *Node) leaseMissing(name string) (bool, time.Duration) {
	n.mu.Lock()
	defer n.mu.Unlock()
	l := n.leaseLocked()
	if l == nil {
		return false, 0
	}
	if _, ok := l.names[name]; ok {
		return false, 0
	}
	now := time.Now()
	ttl, longest := n.fsys.leaseTTL(now)
	if ttl > 0 && !l.negative.add(name, now, longest) {
		ttl = 0
	}
	if end := now.Add(ttl); end.After(l.until) {
		l.until = end
	}
	return true, ttl
}

// leaseID returns the id of the directory's lease, or 0.
func (n *Node) leaseID() uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.lease == nil {
		return 0
	}
	return n.lease.id
}

// leaseNote records in the lease of id (if still held) that name was added
// to the directory or removed from it by a call that returned.
func (n *Node) leaseNote(id uint64, name string, added bool) {
	if id == 0 {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.lease == nil || n.lease.id != id {
		return
	}
	if added {
		n.lease.added(name)
	} else {
		delete(n.lease.names, name)
	}
}

// heldBy reports whether the lease of id is still held and usable: a file
// created under it needs no wait at close.
func (n *Node) heldBy(id uint64) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	l := n.leaseLocked()
	return l != nil && l.id == id
}

// createdUnderLease reports whether the file was created under a directory
// lease the mount still holds: its create needs no wait at close.
func (n *Node) createdUnderLease() bool {
	if n == nil {
		return false
	}
	dir, id, _ := n.ownerLease()
	return dir != nil && dir.heldBy(id)
}

// sendUnderLease calls send, which queues a call behind, if the lease of id
// is held and usable: one step for a recall, which sends the call before
// the lease goes. It reports whether send queued it.
func (n *Node) sendUnderLease(id uint64, send func() bool) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	l := n.leaseLocked()
	return l != nil && l.id == id && send()
}

// inlineCarrier is a data engine that can commit a small new file's data
// with its create (fileio.Engine.FlushCarried).
type inlineCarrier interface {
	FlushCarried(ino uint64, carry func(data []byte) bool) bool
}

// carryInline commits the data of a file closed under its directory's
// lease, small enough to be kept in metadata, with its create if that has
// not been sent yet: meta gets one call for both, applied at once, and the
// owned attributes become what meta will make of them. It reports whether
// nothing is left to flush.
func (n *Node) carryInline() bool {
	c, ok := n.fsys.opts.Data.(inlineCarrier)
	early := n.fsys.opts.Early
	if !ok || early == nil {
		return false
	}
	return c.FlushCarried(n.ino, func(data []byte) bool {
		now := time.Now().UnixNano()
		n.mu.Lock()
		defer n.mu.Unlock()
		if n.createdIn == nil || !early.CarryInline(n.ino, data, now) {
			return false
		}
		if o := &n.owned; o.attr != nil && o.busy == 0 && !o.off {
			a := proto.CloneOf(o.attr)
			a.Size, a.Stored, a.MtimeNs, a.CtimeNs = uint64(len(data)), uint64(len(data)), now, now
			o.attr = a
			o.gen++
		}
		return true
	})
}

// behindFlusher is a data engine that can flush a file without a call of
// its own to meta, its commit sent with the next batch of calls behind
// (fileio.Engine.FlushBehind).
type behindFlusher interface {
	FlushBehind(ctx context.Context, ino uint64) error
}

// flushBehind starts the flush of a file closed under its directory's lease
// and reports whether it did (not if a rename or link just made the file
// reachable from elsewhere: the caller flushes it then); the directory's
// recall waits for it.
func (n *Node) flushBehind() bool {
	d := n.fsys.opts.Data
	n.mu.Lock()
	dir := n.createdIn
	if dir == nil {
		n.mu.Unlock()
		return false
	}
	dir.mu.Lock()
	if dir.flushing == nil {
		dir.flushing = map[uint64]int{}
	}
	dir.flushing[n.ino]++
	dir.mu.Unlock()
	n.mu.Unlock()
	t := &n.fsys.leases
	t.flushes.Add(1)
	go func() {
		defer t.flushes.Done()
		ctx, cancel := context.WithTimeout(context.Background(), flushBehindTimeout)
		var err error
		if b, ok := d.(behindFlusher); ok {
			err = b.FlushBehind(ctx, n.ino) // its commit rides the next batch
		} else {
			err = d.Flush(ctx, n.ino)
		}
		cancel()
		dir.mu.Lock()
		if dir.flushing[n.ino]--; dir.flushing[n.ino] <= 0 {
			delete(dir.flushing, n.ino)
		}
		dir.mu.Unlock()
		if err != nil && !removed(err) {
			n.fsys.earlyLost.Add(1)
			n.fsys.log.Error("the data of a file closed before it was written failed to write: the application was told it succeeded",
				"ino", n.ino, "dir", dir.ino, "err", err)
		}
	}()
	return true
}

// removed reports whether err, a flush's, says the file was removed
// meanwhile: nothing of it is lost.
func removed(err error) bool {
	var r interface{ Removed() bool }
	if errors.As(err, &r) && r.Removed() {
		return true
	}
	e := client.Errno(err)
	return e == syscall.ENOENT || e == syscall.ESTALE
}

// flushBehindTimeout bounds a flush behind, as the data engine's own retries.
const flushBehindTimeout = 10 * time.Minute

// settleFlushes waits for the flushes behind of files closed in the
// directory, or in the directory of the file (a rename or link that makes
// the file reachable from elsewhere).
func (n *Node) settleFlushes(ctx context.Context) {
	d := n.fsys.opts.Data
	if d == nil {
		return
	}
	n.mu.Lock()
	inos := make([]uint64, 0, len(n.flushing))
	for ino := range n.flushing {
		inos = append(inos, ino)
	}
	n.mu.Unlock()
	for _, ino := range inos {
		if err := d.Flush(ctx, ino); err != nil {
			n.fsys.log.Warn("flush of a file closed under a recalled lease", "ino", ino, "err", err)
		}
	}
}

// settle waits for the flush behind of the file, if one runs, and makes its
// later closes wait as any file's: a rename or a link makes it reachable
// from outside the leased directory.
func (n *Node) settle(ctx context.Context) {
	n.disown()
	n.mu.Lock()
	dir := n.createdIn
	n.createdIn, n.createdLease = nil, 0
	n.mu.Unlock()
	if dir == nil || n.fsys.opts.Data == nil {
		return
	}
	dir.mu.Lock()
	_, flushing := dir.flushing[n.ino]
	dir.mu.Unlock()
	if flushing {
		if err := n.fsys.opts.Data.Flush(ctx, n.ino); err != nil {
			n.fsys.log.Warn("flush of a file closed under a lease, before a rename or link", "ino", n.ino, "err", err)
		}
	}
}
