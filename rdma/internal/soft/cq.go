// Package soft holds the parts of a software RDMA provider that do not depend on
// the wire: completion queues, the key table of memory regions and windows with the
// remote-access checks, and protection domains. The tcp and shm transports share it.
package soft

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/rdmafs/rdmafs/rdma"
)

// CQ is a software completion queue: a ring of work completions that grows rather
// than overflow (a verbs CQ would move its queue pairs to error instead; growing
// keeps a misconfigured depth from losing completions).
type CQ struct {
	mu     sync.Mutex
	ring   []rdma.WorkCompletion
	head   int
	n      int
	wake   *waker
	closed bool
	// unnotified is set by Add: completions are queued that no waiter has
	// been told of yet.
	unnotified atomic.Bool
	handler    atomic.Pointer[func() bool]
}

// NewCQ returns a completion queue with room for depth entries before it grows.
func NewCQ(depth int) *CQ {
	if depth < 16 {
		depth = 16
	}
	q := &CQ{ring: make([]rdma.WorkCompletion, depth)}
	q.wake = newWaker(q.ready)
	return q
}

// Push appends a completion and wakes a waiter.
func (q *CQ) Push(wc rdma.WorkCompletion) {
	q.append(wc)
	q.wake.wake()
}

func (q *CQ) append(wc rdma.WorkCompletion) {
	q.mu.Lock()
	if q.n == len(q.ring) {
		q.grow()
	}
	q.ring[(q.head+q.n)%len(q.ring)] = wc
	q.n++
	q.mu.Unlock()
}

// Add appends a completion without waking a waiter: the caller promises to
// call Notify soon (before it blocks). A transport's engine uses it to wake
// the application only once it has nothing more to do itself, so the woken
// goroutine can take over its thread.
func (q *CQ) Add(wc rdma.WorkCompletion) {
	q.append(wc)
	q.unnotified.Store(true)
}

// SetEventHandler makes Notify call fn, on the goroutine of the transport's
// engine that produced the completions, instead of waking a Wait: fn polls
// the queue and dispatches what it finds, saving a goroutine switch per
// completion. fn must not block; it runs while the engine reads nothing. It
// returns false when it could not poll (another goroutine is polling): Notify
// then wakes a Wait as it would without a handler. Completions produced
// elsewhere (by the application's own calls, or at teardown) always wake Wait,
// so a poller must keep waiting. nil removes the handler. It is the software
// transports' form of a completion channel whose events are handled in place;
// other transports do not offer it, and callers find it with a type assertion.
func (q *CQ) SetEventHandler(fn func() bool) {
	if fn == nil {
		q.handler.Store(nil)
		return
	}
	q.handler.Store(&fn)
}

// Notify tells of the completions added by Add since the last Notify: it calls
// the event handler if there is one, and wakes a waiter otherwise.
func (q *CQ) Notify() {
	if !q.unnotified.Swap(false) {
		return
	}
	if h := q.handler.Load(); h != nil && (*h)() {
		return
	}
	q.wake.wake()
}

func (q *CQ) grow() {
	ring := make([]rdma.WorkCompletion, 2*len(q.ring))
	for i := 0; i < q.n; i++ {
		ring[i] = q.ring[(q.head+i)%len(q.ring)]
	}
	q.ring, q.head = ring, 0
}

// Poll implements rdma.CompletionQueue.
func (q *CQ) Poll(wcs []rdma.WorkCompletion) int {
	q.mu.Lock()
	n := 0
	for n < len(wcs) && q.n > 0 {
		wcs[n] = q.ring[q.head]
		q.head = (q.head + 1) % len(q.ring)
		q.n--
		n++
	}
	q.mu.Unlock()
	return n
}

// Len returns the number of completions waiting.
func (q *CQ) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.n
}

// Wait implements rdma.CompletionQueue.
func (q *CQ) Wait(ctx context.Context) error {
	for {
		q.mu.Lock()
		n, closed := q.n, q.closed
		q.mu.Unlock()
		if n > 0 {
			return nil
		}
		if closed {
			return rdma.ErrClosed
		}
		if err := q.wake.wait(ctx); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			q.mu.Lock()
			closed := q.closed
			q.mu.Unlock()
			if closed {
				return rdma.ErrClosed
			}
			return err
		}
	}
}

// ready reports whether a Wait may return: completions are queued or the queue
// is closed.
func (q *CQ) ready() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.n > 0 || q.closed
}

// Close implements rdma.CompletionQueue. Waiters return rdma.ErrClosed.
func (q *CQ) Close() error {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return nil
	}
	q.closed = true
	q.mu.Unlock()
	q.wake.close()
	return nil
}
