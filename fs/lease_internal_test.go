package fs

import (
	"fmt"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestLeaseTTL: the kernel may cache an entry given under a lease only
// until the mount would stop using the lease without hearing from meta (two
// thirds of meta's LeaseSilence after the last Recalls answer), and not at
// all when that is too near; meta takes the lease back only later. A name
// in a leased directory gets the longer of that and the entry timeout, and
// marks the lease as one whose loss invalidates the directory's entries.
func TestLeaseTTL(t *testing.T) {
	if got := leaseFreshFor(3 * time.Second); got != 2*time.Second {
		t.Errorf("LeaseSilence 3s: leases used for %v after an answer", got)
	}
	if got := leaseFreshFor(0); got != time.Second {
		t.Errorf("no LeaseSilence (an older meta): leases used for %v after an answer", got)
	}
	fsys := &FS{opts: Options{EntryTimeout: time.Second}}
	fsys.leases.fresh = 3 * time.Second
	now := time.Now()
	for _, c := range []struct {
		heard time.Time
		want  time.Duration
	}{
		{now, 3 * time.Second},
		{now.Add(-300 * time.Millisecond), 2700 * time.Millisecond},
		{now.Add(-2995 * time.Millisecond), 0},
		{now.Add(-4 * time.Second), 0},
		{time.Time{}, 0},
	} {
		fsys.leases.heard = c.heard
		if got, longest := fsys.leaseTTL(now); got != c.want || longest != 3*time.Second {
			t.Errorf("heard %v ago: entries for %v (longest %v), want %v", now.Sub(c.heard), got, longest, c.want)
		}
	}
	// A file's name: the entry timeout without the lease, the lease's time
	// with it, recorded for the invalidation; a directory's: the entry
	// timeout, always.
	fsys.leases.epoch, fsys.leases.heard = 1, time.Now()
	n := &Node{fsys: fsys}
	fsys.leases.byID = map[uint64]*Node{7: n}
	if got := n.entryTimeout("f", syscall.S_IFREG); got != time.Second {
		t.Errorf("no lease: entry for %v", got)
	}
	n.lease = &dirLease{id: 7, epoch: 1}
	if got := n.entryTimeout("f", syscall.S_IFREG); got <= 2*time.Second || got > 3*time.Second || len(n.lease.long) != 1 || !n.lease.until.After(time.Now().Add(2*time.Second)) {
		t.Errorf("leased: entry for %v, long entries %v, until %v", got, n.lease.long, n.lease.until)
	}
	if got := n.entryTimeout("d", syscall.S_IFDIR); got != time.Second || len(n.lease.long) != 1 {
		t.Errorf("leased, a directory: entry for %v, long entries %v", got, n.lease.long)
	}
	if !n.forgetLong("f") || n.forgetLong("f") || len(n.lease.long) != 0 {
		t.Errorf("forgetLong: long entries %v", n.lease.long)
	}
	delete(fsys.leases.byID, 7) // recalled: the Recalls loop took it out
	if got := n.entryTimeout("g", syscall.S_IFREG); got != time.Second {
		t.Errorf("recalled lease: entry for %v", got)
	}
	fsys.leases.byID[7] = n
	fsys.leases.fresh = 500 * time.Millisecond // an older meta's: no longer than the entry timeout
	n.lease = &dirLease{id: 7, epoch: 1}
	if got := n.entryTimeout("f", syscall.S_IFREG); got != time.Second || len(n.lease.long) != 0 {
		t.Errorf("leased with short freshness: entry for %v, long entries %v", got, n.lease.long)
	}
}

// TestNegativeNames: a lease keeps the names it gave the kernel as missing
// for about two entry timeouts, so that a long-held lease does not fill up
// with names long expired in the kernel and go on giving negative entries;
// at most maxNegative live ones per lease and maxNegativeTotal in the mount.
func TestNegativeNames(t *testing.T) {
	const timeout = time.Second
	var total atomic.Int64
	g := negativeNames{total: &total}
	t0 := time.Unix(1000, 0)
	for i := range maxNegative {
		if !g.add(fmt.Sprint(i), t0, timeout) {
			t.Fatalf("name %d refused", i)
		}
	}
	if g.add("one more", t0.Add(timeout/2), timeout) {
		t.Fatalf("%d names live: one more taken", maxNegative)
	}
	// One entry timeout on, the first names may still be live in the
	// kernel (given half a timeout ago, say): still full.
	if g.add("one more", t0.Add(timeout), timeout) {
		t.Fatalf("one timeout on: one more taken while %d may be live", maxNegative)
	}
	// Two on, every name given before the last rotation has expired.
	t2 := t0.Add(2 * timeout)
	if !g.add("one more", t2, timeout) {
		t.Fatal("two timeouts on: refused, though every earlier name has expired")
	}
	if got := total.Load(); got != 1 {
		t.Fatalf("mount's count %d, want 1", got)
	}
	g.add("made", t2, timeout)
	g.remove("made") // created through the mount: no longer missing
	g.remove("never given")
	if got := total.Load(); got != 1 {
		t.Fatalf("mount's count %d after a removal, want 1", got)
	}
	// A name given again moves to the recent ones, counted once.
	t3 := t2.Add(timeout)
	g.add("one more", t3, timeout)
	if got := total.Load(); got != 1 {
		t.Fatalf("mount's count %d after a name given again, want 1", got)
	}
	g.add("b", t3, timeout)
	// Long after the last name, all have expired.
	g.add("c", t3.Add(3*timeout), timeout)
	if got := total.Load(); got != 1 {
		t.Fatalf("mount's count %d three timeouts after the last names, want 1", got)
	}
	if got := g.drop(); len(got) != 1 || got[0] != "c" || total.Load() != 0 {
		t.Fatalf("drop returned %q, mount's count %d; want [c], 0", got, total.Load())
	}
	// The mount-wide bound.
	total.Store(maxNegativeTotal)
	h := negativeNames{total: &total}
	if h.add("x", t0, timeout) {
		t.Fatalf("%d negative entries in the mount: one more taken", maxNegativeTotal)
	}
}
