package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmafs/rdmafs/chunkserver/proto"
	"github.com/rdmafs/rdmafs/rdma"
)

// Pool keeps one connection per chunkserver, for the FUSE client's engine and
// for repair, and dials again when one fails. It is safe for concurrent use.
// Dials to one address are serialized so that concurrent users share one
// connection instead of replacing each other's. Finding a live connection, which
// every read and write does, takes no exclusive lock.
//
// Pool also keeps its user's view of each chunkserver's health: one that
// refused, reset or timed out is suspect at once: Get fails fast for it (no
// dial, no wait) and new grants exclude it until a background prober, which
// redials it with backoff, reaches it again. Reads and writes so route
// around it without waiting for the metadata service's heartbeat timeout.
// One that answered "no space" is full for a while: a writer short of
// chunkservers then reports ENOSPC instead of waiting for them.
type Pool struct {
	dev  rdma.Device
	pd   rdma.ProtectionDomain
	opts Options // the secret and timeouts; MinTimeout bounds a dial
	now  func() time.Time
	log  *slog.Logger
	mu   sync.RWMutex
	m    map[string]*Peer

	closed chan struct{} // closed by closeAll: probers stop
	kickMu sync.Mutex
	kick   chan struct{} // closed and replaced by kickProbes
}

// NewPool returns a pool that dials through dev with queue pairs in pd and
// the given options; now is the clock of suspicion backoffs (nil: time.Now)
// and log receives a line when a chunkserver turns suspect and when it is
// back (nil: slog.Default()).
func NewPool(dev rdma.Device, pd rdma.ProtectionDomain, opts Options, now func() time.Time, log *slog.Logger) *Pool {
	if now == nil {
		now = time.Now
	}
	if log == nil {
		log = slog.Default()
	}
	if opts.MaxTimeout <= 0 {
		opts.MaxTimeout = defaultMaxTimeout
	}
	if opts.MinTimeout <= 0 || opts.MinTimeout > opts.MaxTimeout {
		opts.MinTimeout = min(defaultMinTimeout, opts.MaxTimeout)
	}
	return &Pool{dev: dev, pd: pd, opts: opts, now: now, log: log, m: map[string]*Peer{},
		closed: make(chan struct{}), kick: make(chan struct{})}
}

// Peer is a Pool's state of one chunkserver: pass it back to Failed or
// Succeeded with the outcome of an operation on the connection Get returned.
type Peer struct {
	addr string
	mu   sync.Mutex             // serializes dialing; guards id and failures
	c    atomic.Pointer[Client] // the current connection, or nil
	// suspectUntil is when the prober dials a suspect next, 0 when it is not
	// suspect; fullUntil is until when it counts as full (Unix nanoseconds).
	suspectUntil atomic.Int64
	fullUntil    atomic.Int64
	probing      atomic.Bool // a prober goroutine runs for this suspect
	id           string      // the chunkserver's id, once known
	failures     int         // consecutive failures, for the backoff
}

// Suspicion backoff: the first failure makes a chunkserver suspect for
// minBackoff, each further one in a row doubles it up to maxBackoff.
const (
	minBackoff = 500 * time.Millisecond
	maxBackoff = 10 * time.Second
	// fullHold is how long a chunkserver that answered "no space" gets no
	// new shards from this pool's user: its heartbeats tell meta within that time.
	fullHold = 5 * time.Second
)

// ErrSuspect is returned (wrapped) by Get for a chunkserver suspect after a
// failure, before its background prober has reached it again.
var ErrSuspect = errors.New("chunkserver suspect after a failure, not retried yet")

// live reports whether cl is a connection that has not failed or closed.
// Client.Err takes no lock while the connection is up.
func live(cl *Client) bool { return cl != nil && cl.Err() == nil }

// peer returns the state of addr, creating it.
func (c *Pool) peer(addr string) *Peer {
	c.mu.RLock()
	p := c.m[addr]
	c.mu.RUnlock()
	if p != nil {
		return p
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if p = c.m[addr]; p == nil {
		p = &Peer{addr: addr}
		c.m[addr] = p
	}
	return p
}

// Get returns a live connection to the chunkserver id at addr, dialing one
// (bounded by the dial timeout) when there is none, and the chunkserver's
// state for failed and succeeded. A suspect chunkserver fails at once with
// ErrSuspect (its prober redials it), so no caller waits on a chunkserver
// that may still be gone.
func (c *Pool) Get(ctx context.Context, id, addr string) (*Client, *Peer, error) {
	if addr == "" {
		return nil, nil, fmt.Errorf("client: shard on chunkserver %q has no address (unknown or never placed): %w", id, ErrSuspect)
	}
	p := c.peer(addr)
	if cl := p.c.Load(); live(cl) {
		return cl, p, nil
	}
	if p.suspectUntil.Load() != 0 {
		return nil, p, fmt.Errorf("client: chunkserver %s: %w", addr, ErrSuspect)
	}
	cl, err := c.dial(ctx, p, id, false)
	return cl, p, err
}

// dial connects to p unless another caller has meanwhile; a failed dial
// makes p suspect. Unless probe is set, a p found suspect meanwhile fails
// at once: callers queued behind a dial that failed do not dial in turn.
func (c *Pool) dial(ctx context.Context, p *Peer, id string, probe bool) (*Client, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if id != "" {
		p.id = id
	}
	old := p.c.Load()
	if live(old) { // another caller dialed while this one waited
		return old, nil
	}
	if !probe && p.suspectUntil.Load() != 0 {
		return nil, fmt.Errorf("client: chunkserver %s: %w", p.addr, ErrSuspect)
	}
	if old != nil {
		old.Close()
		p.c.Store(nil)
	}
	dctx, cancel := context.WithTimeout(ctx, c.opts.MinTimeout)
	defer cancel()
	cl, err := Dial(dctx, c.dev, c.pd, p.addr, c.opts)
	if err != nil {
		err = fmt.Errorf("client: connect to chunkserver %s: %w", p.addr, err)
		c.suspectLocked(p, err)
		return nil, err
	}
	p.c.Store(cl)
	return cl, nil
}

// prober dials suspect p whenever its backoff has passed, or sooner when
// kicked, until a dial succeeds and ends the suspicion (or the mount closes).
// Suspects are probed in the background, not by the next caller, because
// new writes avoid them and might never call on one again.
func (c *Pool) prober(p *Peer) {
	for {
		until := p.suspectUntil.Load()
		if until == 0 {
			// Hand over: a failure after the check above found probing
			// still set and started no prober, so look once more.
			p.probing.Store(false)
			if p.suspectUntil.Load() == 0 || !p.probing.CompareAndSwap(false, true) {
				return
			}
			continue
		}
		c.kickMu.Lock()
		kick := c.kick
		c.kickMu.Unlock()
		t := time.NewTimer(time.Duration(until - c.now().UnixNano()))
		select {
		case <-t.C:
		case <-kick:
		case <-c.closed:
			t.Stop()
			p.probing.Store(false)
			return
		}
		t.Stop()
		if _, err := c.dial(context.Background(), p, "", true); err == nil {
			c.Succeeded(p) // the suspicion ends; the loop hands over
		}
	}
}

// KickProbes makes every suspect's prober dial now: a writer waiting for
// chunkservers finds the ones back without waiting out their backoffs.
func (c *Pool) KickProbes() {
	c.kickMu.Lock()
	defer c.kickMu.Unlock()
	close(c.kick)
	c.kick = make(chan struct{})
}

// Failed records the outcome of an operation on p that returned err: a
// failure of the chunkserver or the path to it (anything but a status it
// answered, or the caller's own cancellation) makes it suspect and closes
// its connection; "no space" marks it full.
func (c *Pool) Failed(ctx context.Context, p *Peer, err error) {
	switch {
	case err == nil || errors.Is(err, ErrSuspect):
	case proto.IsStatus(err, proto.StatusNoSpace):
		p.fullUntil.Store(c.now().Add(fullHold).UnixNano())
	case ctx.Err() != nil && !errors.Is(err, context.DeadlineExceeded):
		// The caller gave up, not the chunkserver.
	case peerFailure(err):
		p.mu.Lock()
		c.suspectLocked(p, err)
		p.mu.Unlock()
	}
}

// suspectLocked makes p suspect for its backoff and closes its connection.
// The caller holds p.mu.
func (c *Pool) suspectLocked(p *Peer, err error) {
	p.failures++
	backoff := min(minBackoff<<min(p.failures-1, 16), maxBackoff)
	p.suspectUntil.Store(c.now().Add(backoff).UnixNano())
	if cl := p.c.Swap(nil); cl != nil {
		go cl.Close() // closing waits for the transport; nobody needs to wait for it
	}
	if p.probing.CompareAndSwap(false, true) {
		go c.prober(p)
	}
	if p.failures == 1 {
		c.log.Warn("client: chunkserver suspect, routing around it", "address", p.addr, "id", p.id, "err", err)
	}
}

// Succeeded records a successful operation on p: it is healthy again.
func (c *Pool) Succeeded(p *Peer) {
	if p.fullUntil.Load() != 0 {
		p.fullUntil.Store(0)
	}
	if p.suspectUntil.Load() == 0 {
		return
	}
	p.mu.Lock()
	if p.failures > 0 {
		c.log.Info("client: chunkserver reachable again", "address", p.addr, "id", p.id)
	}
	p.failures = 0
	p.suspectUntil.Store(0)
	p.mu.Unlock()
}

// peerFailure reports whether err says the chunkserver or the network failed
// rather than the request: statuses chunkd answered are not, except I/O
// errors and shutting down.
func peerFailure(err error) bool {
	var se *proto.StatusError
	if errors.As(err, &se) {
		return se.Status == proto.StatusIOError || se.Status == proto.StatusShuttingDown
	}
	return true
}

// Avoid returns the ids of chunkservers new shards should not go to: the
// suspect ones this pool knows the id of. (Full ones are meta's to avoid:
// their heartbeats report their space, within the reserve they keep.)
func (c *Pool) Avoid() []string {
	c.mu.RLock()
	defer c.mu.RUnlock()
	var out []string
	for _, p := range c.m {
		// A suspect stays avoided until an operation or a probe succeeds,
		// not only during its backoff.
		if p.suspectUntil.Load() != 0 {
			p.mu.Lock()
			if p.id != "" {
				out = append(out, p.id)
			}
			p.mu.Unlock()
		}
	}
	return out
}

// AnyFull reports whether some chunkserver answered "no space" recently.
func (c *Pool) AnyFull() bool {
	now := c.now().UnixNano()
	c.mu.RLock()
	defer c.mu.RUnlock()
	for _, p := range c.m {
		if p.fullUntil.Load() > now {
			return true
		}
	}
	return false
}

// Close closes every connection and stops the probers; the pool must not be
// used afterwards.
func (c *Pool) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	select {
	case <-c.closed:
	default:
		close(c.closed)
	}
	for addr, p := range c.m {
		p.mu.Lock()
		if cl := p.c.Swap(nil); cl != nil {
			cl.Close()
		}
		p.mu.Unlock()
		delete(c.m, addr)
	}
	return nil
}
