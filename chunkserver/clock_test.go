package chunkserver_test

import (
	"sync"
	"time"

	"github.com/rdmafs/rdmafs/chunkserver"
)

// fakeClock is a clock the test moves by hand, for Config.Now, and the
// source of hand-driven reaper tickers, for Config.NewTicker.
type fakeClock struct {
	mu      sync.Mutex
	now     time.Time
	tickers map[*fakeTicker]struct{}
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC), tickers: make(map[*fakeTicker]struct{})}
}

// Now returns the clock's time.
func (k *fakeClock) Now() time.Time {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.now
}

// Advance moves the clock on by d. Nothing ticks: Reap does.
func (k *fakeClock) Advance(d time.Duration) {
	k.mu.Lock()
	k.now = k.now.Add(d)
	k.mu.Unlock()
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
	k.mu.Lock()
	now := k.now
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
