package client

import (
	"context"
	"sync"

	"github.com/rdmafs/rdmafs/rdma"
)

// Pool keeps one connection per chunkd address for the FUSE client and repair:
// Get returns the live connection to an address and dials a new one when there
// is none or the last one failed (a failed connection stays failed, as queue
// pairs do). It is safe for concurrent use; concurrent Gets of an address share
// one dial.
type Pool struct {
	dev  rdma.Device
	pd   rdma.ProtectionDomain
	opts Options

	mu     sync.Mutex
	conns  map[string]*poolEntry
	closed bool
}

type poolEntry struct {
	c    *Client
	err  error
	done chan struct{} // closed when the dial finished
}

// NewPool returns a pool that dials through dev with queue pairs in pd.
func NewPool(dev rdma.Device, pd rdma.ProtectionDomain, opts Options) *Pool {
	return &Pool{dev: dev, pd: pd, opts: opts, conns: make(map[string]*poolEntry)}
}

// Get returns a live connection to addr.
func (p *Pool) Get(ctx context.Context, addr string) (*Client, error) {
	for {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return nil, ErrClosed
		}
		e := p.conns[addr]
		if e == nil {
			e = &poolEntry{done: make(chan struct{})}
			p.conns[addr] = e
			p.mu.Unlock()
			e.c, e.err = Dial(ctx, p.dev, p.pd, addr, p.opts)
			close(e.done)
			p.mu.Lock()
			if e.err != nil || p.closed {
				if p.conns[addr] == e {
					delete(p.conns, addr)
				}
				closed := p.closed
				p.mu.Unlock()
				if e.err == nil && closed {
					e.c.Close()
					return nil, ErrClosed
				}
				return nil, e.err
			}
			p.mu.Unlock()
			return e.c, nil
		}
		p.mu.Unlock()
		select {
		case <-e.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if e.err == nil && e.c.Err() == nil {
			return e.c, nil
		}
		// Failed dial or dead connection: drop it (once) and dial again.
		p.mu.Lock()
		if p.conns[addr] == e {
			delete(p.conns, addr)
			if e.c != nil {
				go e.c.Close()
			}
		}
		p.mu.Unlock()
		if e.err != nil {
			return nil, e.err
		}
	}
}

// Close closes every connection of the pool.
func (p *Pool) Close() error {
	p.mu.Lock()
	p.closed = true
	conns := p.conns
	p.conns = map[string]*poolEntry{}
	p.mu.Unlock()
	for _, e := range conns {
		<-e.done
		if e.c != nil {
			e.c.Close()
		}
	}
	return nil
}
