package client

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"github.com/rdmafs/rdmafs/meta/metapb"
)

// Calls behind: a mount answers some namespace changes before meta has
// applied them (a create of a name meta reserved for it, an unlink) and sends
// them in the background. Every later call that could observe one of them
// waits for it first, so the mount's calls take effect at meta in the order
// the kernel saw them: a call on an inode, or on a directory, waits for the
// background calls issued before it on that inode or directory; a lookup
// waits for those on its name; Sync waits for all.

// BehindTimeout is how long a call sent behind keeps trying the meta
// servers (the same request id throughout, so a retry after a restart is
// applied once). A call still failing then is reported lost.
const BehindTimeout = 10 * time.Minute

// maxBehind bounds the calls in the background; more wait to be sent.
const maxBehind = 1024

// pkey names what a call touches: an inode (name "") or a name in a
// directory.
type pkey struct {
	ino  uint64
	name string
}

// bgCall is a call in the background; done is closed when it has returned.
type bgCall struct {
	keys []pkey
	done chan struct{}
}

// behind is the grpc.ClientConnInterface of a Client: it orders calls after
// the background calls they depend on.
type behind struct {
	inner   grpc.ClientConnInterface
	slots   chan struct{} // maxBehind
	n       atomic.Int64  // background calls not returned
	mu      sync.Mutex
	pending map[pkey][]*bgCall
}

func newBehind(inner grpc.ClientConnInterface) *behind {
	return &behind{inner: inner, slots: make(chan struct{}, maxBehind), pending: map[pkey][]*bgCall{}}
}

// Invoke implements grpc.ClientConnInterface.
func (b *behind) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	if b.n.Load() > 0 {
		if err := b.waitFor(ctx, waitKeys(args)); err != nil {
			return err
		}
	}
	return b.inner.Invoke(ctx, method, args, reply, opts...)
}

// NewStream implements grpc.ClientConnInterface.
func (b *behind) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	return b.inner.NewStream(ctx, desc, method, opts...)
}

// waitKeys returns what a call must wait for: nil for all (Sync).
func waitKeys(args any) []pkey {
	switch r := args.(type) {
	case *metapb.SyncRequest:
		return nil
	case *metapb.LookupRequest:
		return []pkey{{r.Parent, r.Name}}
	case *metapb.ReleaseRequest:
		keys := []pkey{{ino: r.Ino}}
		for _, ino := range r.More {
			keys = append(keys, pkey{ino: ino})
		}
		return keys
	}
	var keys []pkey
	if r, ok := args.(interface{ GetIno() uint64 }); ok && r.GetIno() != 0 {
		keys = append(keys, pkey{ino: r.GetIno()})
	}
	if r, ok := args.(interface{ GetParent() uint64 }); ok && r.GetParent() != 0 {
		keys = append(keys, pkey{ino: r.GetParent()})
	}
	if r, ok := args.(interface{ GetNewParent() uint64 }); ok && r.GetNewParent() != 0 {
		keys = append(keys, pkey{ino: r.GetNewParent()})
	}
	if keys == nil {
		keys = []pkey{} // touches no inode: waits for nothing
	}
	return keys
}

// waitFor waits until the background calls issued so far on keys (all of
// them for nil keys) have returned.
func (b *behind) waitFor(ctx context.Context, keys []pkey) error {
	for _, c := range b.issued(keys) {
		select {
		case <-c.done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// issued returns the background calls pending on keys (all for nil keys).
func (b *behind) issued(keys []pkey) []*bgCall {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []*bgCall
	if keys == nil {
		seen := map[*bgCall]bool{}
		for _, calls := range b.pending {
			for _, c := range calls {
				if !seen[c] {
					seen[c] = true
					out = append(out, c)
				}
			}
		}
		return out
	}
	for _, k := range keys {
		out = append(out, b.pending[k]...)
	}
	return out
}

// goCall makes the call method(args) into reply in the background, after
// the background calls issued before it on after, and calls done with its
// outcome. Until it returns, calls on keys wait for it. With maxBehind calls
// in the background already it does nothing and returns false.
func (b *behind) goCall(method string, args, reply any, keys, after []pkey, done func(error)) bool {
	select {
	case b.slots <- struct{}{}:
	default:
		return false
	}
	c := &bgCall{keys: keys, done: make(chan struct{})}
	b.n.Add(1)
	b.mu.Lock()
	var before []*bgCall
	for _, k := range after {
		before = append(before, b.pending[k]...)
	}
	for _, k := range keys {
		b.pending[k] = append(b.pending[k], c)
	}
	b.mu.Unlock()
	go func() {
		for _, p := range before {
			<-p.done
		}
		ctx, cancel := context.WithTimeout(context.Background(), BehindTimeout)
		err := b.inner.Invoke(ctx, method, args, reply)
		cancel()
		b.mu.Lock()
		for _, k := range c.keys {
			calls := b.pending[k]
			for i, p := range calls {
				if p == c {
					calls = append(calls[:i], calls[i+1:]...)
					break
				}
			}
			if len(calls) == 0 {
				delete(b.pending, k)
			} else {
				b.pending[k] = calls
			}
		}
		b.mu.Unlock()
		close(c.done)
		b.n.Add(-1)
		<-b.slots
		if done != nil {
			done(err)
		}
	}()
	return true
}

// CreateBehind sends req in the background and calls done with the
// outcome: a create of the session the caller answers before meta applies
// it, with an inode number from NextIno, of a name a lookup reserved. It
// returns false, sending nothing, when too many calls are in the background
// already (the caller then makes the call itself).
func (s *Session) CreateBehind(req *metapb.CreateRequest, done func(error)) bool {
	keys := []pkey{{ino: req.Parent}, {req.Parent, req.Name}, {ino: req.Ino}}
	return s.c.bg.goCall(metapb.Meta_Create_FullMethodName, req, &metapb.EntryReply{}, keys, keys[1:2], done)
}

// UnlinkBehind is CreateBehind for an unlink of the inode req.Ino (done gets
// ENOENT if the name was removed, or given to another inode, meanwhile).
func (s *Session) UnlinkBehind(req *metapb.UnlinkRequest, done func(error)) bool {
	keys := []pkey{{ino: req.Parent}, {req.Parent, req.Name}, {ino: req.Ino}}
	return s.c.bg.goCall(metapb.Meta_Unlink_FullMethodName, req, &metapb.DirReply{}, keys, keys[1:], done)
}

// WaitBehind waits until every call sent behind so far has returned.
func (c *Client) WaitBehind(ctx context.Context) error { return c.bg.waitFor(ctx, nil) }
