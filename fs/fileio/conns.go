package fileio

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	chunkclient "github.com/rdmafs/rdmafs/chunkserver/client"
	"github.com/rdmafs/rdmafs/rdma"
)

// conns keeps one connection per chunkserver and dials again when one fails.
// Dials to one address are serialized so that concurrent users share one
// connection instead of replacing each other's. Finding a live connection, which
// every read and write does, takes no exclusive lock.
type conns struct {
	dev    rdma.Device
	pd     rdma.ProtectionDomain
	secret []byte
	mu     sync.RWMutex
	m      map[string]*peer
}

type peer struct {
	mu sync.Mutex                         // serializes dialing
	c  atomic.Pointer[chunkclient.Client] // the current connection, or nil
}

// live reports whether cl is a connection that has not failed or closed.
// Client.Err takes no lock while the connection is up.
func live(cl *chunkclient.Client) bool { return cl != nil && cl.Err() == nil }

func (c *conns) get(ctx context.Context, addr string) (*chunkclient.Client, error) {
	c.mu.RLock()
	p := c.m[addr]
	c.mu.RUnlock()
	if p != nil {
		if cl := p.c.Load(); live(cl) {
			return cl, nil
		}
	} else {
		c.mu.Lock()
		if p = c.m[addr]; p == nil {
			p = &peer{}
			c.m[addr] = p
		}
		c.mu.Unlock()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	old := p.c.Load()
	if live(old) { // another caller dialed while this one waited
		return old, nil
	}
	if old != nil {
		old.Close()
		p.c.Store(nil)
	}
	cl, err := chunkclient.Dial(ctx, c.dev, c.pd, addr, chunkclient.Options{Secret: c.secret})
	if err != nil {
		return nil, fmt.Errorf("fileio: connect to chunkserver %s: %w", addr, err)
	}
	p.c.Store(cl)
	return cl, nil
}

func (c *conns) closeAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for addr, p := range c.m {
		p.mu.Lock()
		if cl := p.c.Swap(nil); cl != nil {
			cl.Close()
		}
		p.mu.Unlock()
		delete(c.m, addr)
	}
}
