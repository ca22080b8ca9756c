package soft

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// waker parks goroutines until a condition holds, through an eventfd watched by
// the Go runtime's network poller rather than through a channel.
//
// The difference is in which thread runs the woken goroutine. Waking through a
// channel makes the runtime wake an idle thread to run it (a futex wake-up and a
// context switch, costly on virtual machines) although the waker is about to
// park and its own thread could run it; in a transport that completes a request
// and then parks on its socket, that is one context switch per completion. A
// goroutine parked on a file descriptor is found by the thread that next looks
// for work, without waking another: normally the waker's, once it parks.
//
// The eventfd is never read. Every write to it is a new edge for the poller, and
// the parked goroutine checks the condition rather than the counter, so a wake
// costs one system call and the wait none beyond parking. (The counter cannot
// reach its maximum of 2^64-2 writes.)
type waker struct {
	cond    func() bool // what a waiter waits for
	f       *os.File
	raw     syscall.RawConn
	readFn  func(fd uintptr) bool
	writeFn func(fd uintptr) bool
	parked  atomic.Int32  // goroutines in wait
	one     [8]byte       // the eventfd increment (read-only)
	ch      chan struct{} // used when no eventfd could be made

	// waitMu admits one waiter to the poller at a time; the fields below
	// belong to it.
	waitMu  sync.Mutex
	ctx     context.Context
	armed   bool // readFn has parked: its next call is a wake-up
	hookCtx context.Context
	stop    func() bool
}

// newWaker returns a waker for cond, which must be safe to call from any
// goroutine and must turn true before the wake that follows the change.
func newWaker(cond func() bool) *waker {
	w := &waker{cond: cond, ch: make(chan struct{}, 1), one: [8]byte{1}}
	fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return w
	}
	f := os.NewFile(uintptr(fd), "cq-eventfd")
	raw, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return w
	}
	w.f, w.raw = f, raw
	w.readFn = w.poll
	w.writeFn = func(fd uintptr) bool {
		for {
			if _, err := unix.Write(int(fd), w.one[:]); err != unix.EINTR {
				return true
			}
		}
	}
	return w
}

// poll is the poller's callback: true ends the wait. Its first call in a wait
// comes after the poller has forgotten earlier edges, so a wake that came before
// it is seen in the condition; a later one is an edge that ends the park.
func (w *waker) poll(uintptr) bool {
	if w.armed {
		w.armed = false
		return true
	}
	if w.cond() || w.ctx.Err() != nil {
		return true
	}
	w.armed = true
	return false
}

// wait parks until cond holds, ctx ends or a wake comes (the caller rechecks).
func (w *waker) wait(ctx context.Context) error {
	w.parked.Add(1)
	defer w.parked.Add(-1)
	if w.f == nil {
		if w.cond() {
			return nil
		}
		select {
		case <-w.ch:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	w.waitMu.Lock()
	defer w.waitMu.Unlock()
	if ctx.Done() != nil {
		w.hook(ctx)
	}
	w.ctx, w.armed = ctx, false
	err := w.raw.Read(w.readFn)
	w.ctx = nil
	if err != nil {
		return fmt.Errorf("rdma: completion queue wait: %w", err)
	}
	return ctx.Err()
}

// hook makes the end of ctx wake the waiter. It is kept for the next wait with
// the same context, so a loop of waits registers it once. The caller holds
// waitMu.
func (w *waker) hook(ctx context.Context) {
	if w.hookCtx == ctx {
		return
	}
	if w.stop != nil {
		w.stop()
	}
	w.hookCtx = ctx
	w.stop = context.AfterFunc(ctx, w.wakeAlways)
}

// wake wakes the parked goroutines, if there are any.
func (w *waker) wake() {
	if w.parked.Load() == 0 {
		return
	}
	w.wakeAlways()
}

func (w *waker) wakeAlways() {
	if w.f == nil {
		select {
		case w.ch <- struct{}{}:
		default:
		}
		return
	}
	w.raw.Write(w.writeFn)
}

// close wakes the waiters for good (cond must hold from now on) and releases
// the eventfd.
func (w *waker) close() {
	w.wakeAlways()
	if w.f == nil {
		return
	}
	w.waitMu.Lock()
	if w.stop != nil {
		w.stop()
		w.stop, w.hookCtx = nil, nil
	}
	w.waitMu.Unlock()
	w.f.Close()
}
