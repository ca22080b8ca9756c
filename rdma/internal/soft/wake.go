package soft

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/rdmafs/rdmafs/rdma/internal/wake"
)

// waker parks the goroutines that wait on a completion queue until its
// condition holds. It parks them on a wake.Gate (an eventfd in the network
// poller), so that a transport completing a request does not make the runtime
// wake a second thread for the waiter; see package wake. Where no eventfd can
// be made it falls back to a channel.
type waker struct {
	cond   func() bool // what a waiter waits for
	gate   *wake.Gate  // nil: use ch
	ch     chan struct{}
	parked atomic.Int32 // goroutines in wait

	// waitMu admits one waiter to the gate at a time; the fields below
	// belong to it.
	waitMu  sync.Mutex
	ctx     context.Context
	readyFn func() bool
	hookCtx context.Context
	stop    func() bool
}

// newWaker returns a waker for cond, which must be safe to call from any
// goroutine and must turn true before the wake that follows the change.
func newWaker(cond func() bool) *waker {
	w := &waker{cond: cond, ch: make(chan struct{}, 1)}
	w.gate, _ = wake.New()
	w.readyFn = w.ready
	return w
}

func (w *waker) ready() bool { return w.cond() || w.ctx.Err() != nil }

// wait parks until cond holds or ctx ends.
func (w *waker) wait(ctx context.Context) error {
	w.parked.Add(1)
	defer w.parked.Add(-1)
	if w.gate == nil {
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
	w.ctx = ctx
	err := w.gate.Wait(w.readyFn)
	w.ctx = nil
	if err != nil {
		return err
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
	if w.gate == nil {
		select {
		case w.ch <- struct{}{}:
		default:
		}
		return
	}
	w.gate.Wake()
}

// close wakes the waiters for good (cond must hold from now on) and releases
// the eventfd.
func (w *waker) close() {
	w.wakeAlways()
	if w.gate == nil {
		return
	}
	w.waitMu.Lock()
	if w.stop != nil {
		w.stop()
		w.stop, w.hookCtx = nil, nil
	}
	w.waitMu.Unlock()
	w.gate.Close()
}
