package chunkserver

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/rdmafs/rdmafs/chunkserver/chunk"
	"github.com/rdmafs/rdmafs/chunkserver/mempool"
	"github.com/rdmafs/rdmafs/chunkserver/store"
)

// errNoMemory is returned when registered memory cannot be found even after
// evicting every unleased resident version.
var errNoMemory = errors.New("chunkserver: registered memory exhausted")

// resident is a chunk version held in registered memory. While refs > 0 (leases
// and requests using it) it is pinned: never evicted, never freed. A version that
// is deleted or evicted while pinned stays readable by its holders and is freed by
// the last release.
type resident struct {
	key   chunk.Key
	info  chunk.Info
	buf   mempool.Buf
	refs  int
	elem  *list.Element // in the LRU while refs == 0 and not gone
	ready chan struct{} // closed when loading finished
	err   error         // loading failed
	gone  bool          // no longer in the map
}

// cache holds resident chunk versions in the pool, evicting the least recently used
// unpinned ones when memory is needed.
type cache struct {
	pool    *mempool.Pool
	store   *store.Store
	metrics *Metrics
	// onCorrupt, when set, is told of a version that failed its checksum.
	onCorrupt func(chunk.Key) bool

	mu       sync.Mutex
	m        map[chunk.Key]*resident
	lru      list.List // front = most recently used
	resBytes int64
}

func newCache(pool *mempool.Pool, st *store.Store, m *Metrics) *cache {
	return &cache{pool: pool, store: st, metrics: m, m: make(map[chunk.Key]*resident)}
}

// alloc reserves n bytes of registered memory, evicting unpinned resident versions
// as needed.
func (c *cache) alloc(n int) (mempool.Buf, error) {
	for {
		if b, ok := c.pool.Alloc(n); ok {
			return b, nil
		}
		c.mu.Lock()
		e := c.lru.Back()
		if e == nil {
			c.mu.Unlock()
			return mempool.Buf{}, fmt.Errorf("%w: %d bytes wanted, %d of %d in use", errNoMemory, n, c.pool.InUse(), c.pool.Size())
		}
		r := e.Value.(*resident)
		c.removeLocked(r)
		c.mu.Unlock()
		c.metrics.Evictions.Inc()
	}
}

// removeLocked takes r out of the map and LRU and frees it if unpinned.
func (c *cache) removeLocked(r *resident) {
	if r.gone {
		return
	}
	r.gone = true
	delete(c.m, r.key)
	if r.elem != nil {
		c.lru.Remove(r.elem)
		r.elem = nil
	}
	if r.refs == 0 {
		c.freeLocked(r)
	}
}

func (c *cache) freeLocked(r *resident) {
	if r.buf.Size != 0 {
		c.pool.Free(r.buf)
		c.resBytes -= int64(r.buf.Size)
		c.metrics.ResidentBytes.Set(float64(c.resBytes))
		r.buf = mempool.Buf{}
	}
}

// acquire returns key's resident copy, loading it from the store (checksum
// verified) if needed, pinned until release.
func (c *cache) acquire(ctx context.Context, key chunk.Key) (*resident, error) {
	c.mu.Lock()
	r := c.m[key]
	if r != nil {
		r.refs++
		if r.elem != nil {
			c.lru.Remove(r.elem)
			r.elem = nil
		}
		c.mu.Unlock()
		select {
		case <-r.ready:
		case <-ctx.Done():
			c.release(r)
			return nil, ctx.Err()
		}
		if r.err != nil {
			err := r.err
			c.release(r)
			return nil, err
		}
		return r, nil
	}
	info, err := c.store.Stat(key)
	if err != nil {
		c.mu.Unlock()
		return nil, err
	}
	r = &resident{key: key, info: info, refs: 1, ready: make(chan struct{})}
	c.m[key] = r
	c.mu.Unlock()

	buf, err := c.alloc(int(info.Length))
	if err == nil {
		_, err = c.store.ReadInto(key, c.pool.Bytes(buf)[:info.Length])
		if err != nil {
			c.pool.Free(buf)
		}
	}
	if err != nil && errors.Is(err, store.ErrCorrupt) && c.onCorrupt != nil {
		c.onCorrupt(key)
	}
	c.mu.Lock()
	if err != nil {
		r.err = err
		close(r.ready)
		if !r.gone {
			r.gone = true
			delete(c.m, key)
		}
		r.refs--
		c.mu.Unlock()
		return nil, err
	}
	r.buf = buf
	c.resBytes += int64(buf.Size)
	c.metrics.ResidentBytes.Set(float64(c.resBytes))
	close(r.ready)
	c.mu.Unlock()
	c.metrics.BytesRead.Add(float64(info.Length))
	return r, nil
}

// release unpins r.
func (c *cache) release(r *resident) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r.refs--
	if r.refs > 0 {
		return
	}
	if r.gone {
		c.freeLocked(r)
		return
	}
	if r.err == nil {
		r.elem = c.lru.PushFront(r)
	}
}

// insert makes buf, which holds the just committed version info, its resident
// copy (unpinned). If the version is already resident, buf is freed.
func (c *cache) insert(info chunk.Info, buf mempool.Buf) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[info.Key]; ok {
		c.pool.Free(buf)
		return
	}
	r := &resident{key: info.Key, info: info, buf: buf, ready: make(chan struct{})}
	close(r.ready)
	r.elem = c.lru.PushFront(r)
	c.m[info.Key] = r
	c.resBytes += int64(buf.Size)
	c.metrics.ResidentBytes.Set(float64(c.resBytes))
}

// drop forgets key's resident copy (the version was deleted); holders of leases
// keep reading it until they release.
func (c *cache) drop(key chunk.Key) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r := c.m[key]; r != nil {
		// A version still loading is freed by its last holder like a pinned one.
		c.removeLocked(r)
	}
}

// residentBytes returns the bytes held by resident versions.
func (c *cache) residentBytes() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.resBytes
}
