package fileio

import (
	"context"
	"fmt"
	"sync"

	chunkclient "github.com/rdmafs/rdmafs/chunkserver/client"
	"github.com/rdmafs/rdmafs/rdma"
)

// conns keeps one connection per chunkserver and dials again when one fails.
// Dials to one address are serialized so that concurrent users share one
// connection instead of replacing each other's.
type conns struct {
	dev    rdma.Device
	pd     rdma.ProtectionDomain
	secret []byte
	mu     sync.Mutex
	m      map[string]*peer
}

type peer struct {
	mu sync.Mutex
	c  *chunkclient.Client
}

func (c *conns) get(ctx context.Context, addr string) (*chunkclient.Client, error) {
	c.mu.Lock()
	p := c.m[addr]
	if p == nil {
		p = &peer{}
		c.m[addr] = p
	}
	c.mu.Unlock()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.c != nil && p.c.Err() == nil {
		return p.c, nil
	}
	if p.c != nil {
		p.c.Close()
		p.c = nil
	}
	cl, err := chunkclient.Dial(ctx, c.dev, c.pd, addr, chunkclient.Options{Secret: c.secret})
	if err != nil {
		return nil, fmt.Errorf("fileio: connect to chunkserver %s: %w", addr, err)
	}
	p.c = cl
	return cl, nil
}

func (c *conns) closeAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for addr, p := range c.m {
		p.mu.Lock()
		if p.c != nil {
			p.c.Close()
		}
		p.mu.Unlock()
		delete(c.m, addr)
	}
}
