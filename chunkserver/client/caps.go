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
	write bool // the token may write: capabilities allow writing
	mu    sync.RWMutex
	m     map[uint64][]byte
}

// NewCaps returns an empty set for a token that may write if write.
func NewCaps(write bool) *Caps { return &Caps{write: write, m: make(map[uint64][]byte)} }

// Add records the capability for chunk.
func (c *Caps) Add(chunk uint64, capability []byte) {
	c.mu.Lock()
	c.m[chunk] = capability
	c.mu.Unlock()
}

func (c *Caps) get(chunk uint64) ([]byte, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	b, ok := c.m[chunk]
	return b, ok
}

// chunkOp reports whether op names a chunk (and so needs an authorization
// on a token's connection).
func chunkOp(op proto.Op) bool {
	switch op {
	case proto.OpRenewLease, proto.OpReleaseLease, proto.OpAuthorize:
		return false
	}
	return true
}

// authorize sends, before reqs, the capabilities of the chunks they name
// that this connection has not authorized yet. A chunk without a known
// capability is left to chunkd to refuse.
func (c *Client) authorize(ctx context.Context, reqs []proto.Request) error {
	var auth []proto.Request
	c.authMu.Lock()
	for i := range reqs {
		ch := reqs[i].Chunk
		if !chunkOp(reqs[i].Op) || c.authorized[ch] {
			continue
		}
		if capability, ok := c.caps.get(ch); ok {
			auth = append(auth, proto.AuthorizeRequest(ch, capability, c.caps.write))
			c.authorized[ch] = true // at most one authorization in flight per chunk
		}
	}
	c.authMu.Unlock()
	for len(auth) > 0 {
		n := min(len(auth), c.limits.MaxBatch)
		reps, err := c.send(ctx, auth[:n])
		if err == nil {
			for i, r := range reps {
				if r.Status != proto.StatusOK {
					err = fmt.Errorf("chunkserver client: authorize chunk %d: %w", auth[i].Chunk, r.Status.Err(proto.OpAuthorize))
					break
				}
			}
		}
		if err != nil {
			c.authMu.Lock()
			for _, r := range auth {
				delete(c.authorized, r.Chunk)
			}
			c.authMu.Unlock()
			return err
		}
		auth = auth[n:]
	}
	return nil
}
