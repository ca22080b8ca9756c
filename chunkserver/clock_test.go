package chunkserver_test

import (
	"sync"
	"time"

	"github.com/rdmafs/rdmafs/chunkserver"
	"github.com/rdmafs/rdmafs/internal/fakeclock"
)

// fakeClock is a clock the test moves by hand (Now and Advance, for
// Config.Now), and the source of hand-driven reaper tickers, for
// Config.NewTicker. Advance ticks nothing: Reap does.
type fakeClock struct {
	*fakeclock.Clock
	mu      sync.Mutex
	tickers map[*fakeTicker]struct{}
}

func newFakeClock() *fakeClock {
	return &fakeClock{Clock: fakeclock.New(time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)), tickers: make(map[*fakeTicker]struct{})}
}

// NewTicker returns a ticker that ticks only in Reap.
func (k *fakeClock) NewTicker(time.Duration) chunkserver.Ticker {
	t := &fakeTicker{k: k, c: make(chan time.Time), stopped: make(chan struct{})}
	k.mu.Lock()
	k.tickers[t] = struct{}{}
	k.mu.Unlock()
	return t
}

// Reap ticks every live ticker twice and returns when each was received (or
// its ticker stopped). The channels are unbuffered and a reaper takes its
// next tick only after it has handled the last one, so when Reap returns
// every connection's reaper has finished a whole pass that began after the
// call: everything expired by Now() is revoked.
func (k *fakeClock) Reap() {
	now := k.Now()
	k.mu.Lock()
	live := make([]*fakeTicker, 0, len(k.tickers))
	for t := range k.tickers {
		live = append(live, t)
	}
	k.mu.Unlock()
	for _, t := range live {
		for range 2 {
			select {
			case t.c <- now:
			case <-t.stopped:
			}
		}
	}
}

// fakeTicker is a chunkserver.Ticker that ticks in fakeClock.Reap.
type fakeTicker struct {
	k       *fakeClock
	c       chan time.Time
	stopped chan struct{}
	once    sync.Once
}

func (t *fakeTicker) C() <-chan time.Time { return t.c }

func (t *fakeTicker) Stop() {
	t.once.Do(func() {
		close(t.stopped)
		t.k.mu.Lock()
		delete(t.k.tickers, t)
		t.k.mu.Unlock()
	})
}
