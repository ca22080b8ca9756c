package etcdkv

import "sync"

// cache holds values this store read or wrote, for a store that is the only
// writer of its prefix (the elected meta server; Options.CacheEntries).
// Update transactions served from it stay safe whatever happens: every
// value read carries its mod revision, which the commit compares, so a
// stale entry only causes a conflict (and the cache is cleared). Views use
// it only at generation gen: while no commit of this store has happened
// since the view started, the cache and etcd at revision commitRev agree.
type cache struct {
	mu        sync.Mutex
	m         map[string]cacheEntry
	max       int
	commitRev int64 // revision of this store's last commit
}

type cacheEntry struct {
	v   []byte
	ok  bool
	mod int64 // mod revision (0: absent)
}

func newCache(max int) *cache {
	if max <= 0 {
		return nil
	}
	return &cache{m: map[string]cacheEntry{}, max: max}
}

// get returns the entry of key and the generation (commitRev) it belongs to.
func (c *cache) get(key string) (cacheEntry, int64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[key]
	return e, c.commitRev, ok
}

// generation returns the revision of the last commit.
func (c *cache) generation() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.commitRev
}

// fill caches a value read at snapshot revision snap, unless a commit of
// this store happened after snap (the value may be older than that commit).
func (c *cache) fill(key string, e cacheEntry, snap int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if snap < c.commitRev {
		return
	}
	if old, ok := c.m[key]; ok && old.mod > e.mod {
		return
	}
	c.evict()
	c.m[key] = e
}

// evict drops about an eighth of the entries when the cache is full;
// c.mu must be held.
func (c *cache) evict() {
	if len(c.m) < c.max {
		return
	}
	n := c.max / 8
	for k := range c.m {
		delete(c.m, k)
		if n--; n <= 0 {
			break
		}
	}
}

// committed records the writes of a commit at revision rev (full keys; nil
// value: deleted).
func (c *cache) committed(writes map[string][]byte, prefix string, rev int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.commitRev = max(c.commitRev, rev)
	for k, v := range writes {
		c.evict()
		if v == nil {
			c.m[prefix+k] = cacheEntry{}
		} else {
			c.m[prefix+k] = cacheEntry{v: v, ok: true, mod: rev}
		}
	}
}

// reset forgets everything including the generation (a new leadership
// term: others may have written since).
func (c *cache) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.m)
	c.commitRev = 0
}

// clear forgets everything (after a conflict or a commit of unknown outcome).
func (c *cache) clear() {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.m)
}
