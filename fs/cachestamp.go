package fs

import (
	"sync"

	"github.com/rdmafs/rdmafs/meta/metapb"
)

// Cache stamps. Taking a lock of a file another session may reach drops what
// the mount cached of it (the kernel's pages, the engine's stripe map), so
// that the lock holder reads what the last holder wrote (locks.go). A
// database takes a lock every transaction, so it read its pages back every
// transaction, from a file only it was writing. The stamp of a file is the
// state, as (ctime, mtime, size), that the mount's caches of it show: a lock
// whose reply shows the same state keeps them.
//
// A stamp is set when the caches start over from meta's state (an open that
// drops the kernel's pages, a lock that dropped them) and moves on with each
// commit of this mount made on top of it (its reply names the ctime it
// replaced). Any other change through the mount (a setattr, an fallocate, an
// O_DIRECT write, which bypasses the kernel's pages), a commit on top of
// another state, or an open that keeps pages of another state leaves it
// unknown, and the next lock drops the caches.

// stamp is a file's state as its attributes show it.
type stamp struct {
	ctime, mtime int64
	size         uint64
}

func stampOf(a *metapb.Attr) stamp {
	return stamp{ctime: a.CtimeNs, mtime: a.MtimeNs, size: a.Size}
}

// cacheStamps holds the files' stamps; safe for concurrent use.
type cacheStamps struct {
	mu sync.Mutex
	m  map[uint64]stamp
}

// set records that the mount's caches of ino start over from state a (nil:
// unknown).
func (c *cacheStamps) set(ino uint64, a *metapb.Attr) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if a == nil {
		delete(c.m, ino)
		return
	}
	if c.m == nil {
		c.m = make(map[uint64]stamp)
	}
	c.m[ino] = stampOf(a)
}

// committed moves ino's stamp on past a commit of this mount that replaced
// the state of ctime prevCtime with a, or makes it unknown when the caches
// did not show that state.
func (c *cacheStamps) committed(ino uint64, prevCtime int64, a *metapb.Attr) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.m[ino]
	if !ok {
		return
	}
	if a == nil || s.ctime != prevCtime {
		delete(c.m, ino)
		return
	}
	c.m[ino] = stampOf(a)
}

// shows reports whether the caches of ino show state a.
func (c *cacheStamps) shows(ino uint64, a *metapb.Attr) bool {
	if a == nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.m[ino]
	return ok && s == stampOf(a)
}
