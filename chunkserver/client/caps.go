package client

import (
	"context"
	"fmt"
	"sync"

	"github.com/rdmafs/rdmafs/chunkserver/proto"
)

// Caps holds the chunk capabilities meta gave a mount token's mount (one
// per chunk, shared by all its connections). A connection made with a token
// authorizes each chunk with chunkd (OpAuthorize) before its first request
// on it. Safe for concurrent use.
type Caps struct {
	mu sync.RWMutex
	m  map[uint64]capability
}

type capability struct {
	b     []byte
	write bool
}

// NewCaps returns an empty set.
func NewCaps() *Caps { return &Caps{m: make(map[uint64]capability)} }

// Add records the capability for chunk (allowing writes if write); a
// capability to write is not replaced by one to read.
func (c *Caps) Add(chunk uint64, b []byte, write bool) {
	c.mu.Lock()
	if old, ok := c.m[chunk]; !ok || write || !old.write {
		c.m[chunk] = capability{b: b, write: write}
	}
	c.mu.Unlock()
}

func (c *Caps) get(chunk uint64) (capability, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	cp, ok := c.m[chunk]
	return cp, ok
}

// chunkOp reports whether op names a chunk (and so needs an authorization
// on a token's connection).
func chunkOp(op proto.Op) bool {
	switch op {
	case proto.OpRenewLease, proto.OpReleaseLease, proto.OpAuthorize, proto.OpSlab:
		return false
	}
	return true
}

// authorizations returns the OpAuthorize requests for the chunks reqs name
// that this connection has not authorized yet, or only for reading when a
// capability to write is known. A chunk without a known capability is left
// to chunkd to refuse.
func (c *Client) authorizations(reqs []proto.Request) []proto.Request {
	var auth []proto.Request
	c.authMu.Lock()
	defer c.authMu.Unlock()
	for i := range reqs {
		ch := reqs[i].Chunk
		if !chunkOp(reqs[i].Op) {
			continue
		}
		cp, ok := c.caps.get(ch)
		if w, done := c.authorized[ch]; !ok || (done && (w || !cp.write)) {
			continue
		}
		auth = append(auth, proto.AuthorizeRequest(ch, cp.b, cp.write))
	}
	return auth
}

// authorized records the outcome of authorizations: a chunk counts as
// authorized once chunkd said so (concurrent callers may both send one:
// harmless).
func (c *Client) recordAuthorized(auth []proto.Request, reps []proto.Reply) error {
	c.authMu.Lock()
	defer c.authMu.Unlock()
	for i, r := range reps {
		if r.Status != proto.StatusOK {
			return fmt.Errorf("chunkserver client: authorize chunk %d: %w", auth[i].Chunk, r.Status.Err(proto.OpAuthorize))
		}
		_, write := auth[i].Capability()
		c.authorized[auth[i].Chunk] = c.authorized[auth[i].Chunk] || write
	}
	return nil
}

// doAuthorized is Do on a token's connection: the authorizations the batch
// needs go first, in the same message when they fit (chunkd serves a
// message's requests in order), else in messages of their own before it.
func (c *Client) doAuthorized(ctx context.Context, reqs []proto.Request) ([]proto.Reply, error) {
	auth := c.authorizations(reqs)
	if len(auth) == 0 {
		return c.send(ctx, reqs)
	}
	if len(auth)+len(reqs) <= c.limits.MaxBatch {
		reps, err := c.send(ctx, append(auth, reqs...))
		if err != nil {
			return nil, err
		}
		if err := c.recordAuthorized(auth, reps[:len(auth)]); err != nil {
			return nil, err
		}
		return reps[len(auth):], nil
	}
	for len(auth) > 0 {
		n := min(len(auth), c.limits.MaxBatch)
		reps, err := c.send(ctx, auth[:n])
		if err != nil {
			return nil, err
		}
		if err := c.recordAuthorized(auth[:n], reps); err != nil {
			return nil, err
		}
		auth = auth[n:]
	}
	return c.send(ctx, reqs)
}
