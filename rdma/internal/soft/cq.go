// Package soft holds the parts of a software RDMA provider that do not depend on
// the wire: completion queues, the key table of memory regions and windows with the
// remote-access checks, and protection domains. The tcp and shm transports share it.
package soft

import (
	"context"
	"sync"

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
	notify chan struct{}
	closed bool
}

// NewCQ returns a completion queue with room for depth entries before it grows.
func NewCQ(depth int) *CQ {
	if depth < 16 {
		depth = 16
	}
	return &CQ{ring: make([]rdma.WorkCompletion, depth), notify: make(chan struct{}, 1)}
}

// Push appends a completion and wakes a waiter.
func (q *CQ) Push(wc rdma.WorkCompletion) {
	q.mu.Lock()
	if q.n == len(q.ring) {
		q.grow()
	}
	q.ring[(q.head+q.n)%len(q.ring)] = wc
	q.n++
	q.mu.Unlock()
	select {
	case q.notify <- struct{}{}:
	default:
	}
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
		select {
		case <-q.notify:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Close implements rdma.CompletionQueue. Waiters return rdma.ErrClosed.
func (q *CQ) Close() error {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	select {
	case q.notify <- struct{}{}:
	default:
	}
	return nil
}
