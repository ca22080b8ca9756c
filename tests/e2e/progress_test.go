package e2e

import (
	"sync"
	"time"
)

// progress counts the operations a test's load goroutines have acknowledged,
// so that the test waits for the load itself (its first operations done, so
// many more after a fault) instead of sleeping and hoping it ran.
//
// Load goroutines call step after each operation whose result they have
// checked, and fail when they give up; the test calls wait and load from one
// goroutine. A zero progress is not usable: make one with newProgress.
type progress struct {
	mu     sync.Mutex
	n      int64
	at     int64         // the count the waiter wants
	hit    chan struct{} // closed when n reaches at; nil: no waiter
	failed chan struct{} // closed by fail
	once   sync.Once
}

// newProgress returns a progress at zero with no failure.
func newProgress() *progress { return &progress{failed: make(chan struct{})} }

// step counts one acknowledged operation. Safe from any goroutine.
func (p *progress) step() {
	p.mu.Lock()
	p.n++
	if p.hit != nil && p.n >= p.at {
		close(p.hit)
		p.hit = nil
	}
	p.mu.Unlock()
}

// fail records that a load goroutine gave up (after recording why where the
// test will see it): from then on a wait for a count not yet reached returns
// false at once instead of waiting out its time. Safe from any goroutine, any
// number of times.
func (p *progress) fail() { p.once.Do(func() { close(p.failed) }) }

// load returns the operations counted so far.
func (p *progress) load() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}

// wait returns true once n operations have been counted in all (at once if
// they already have), false if a load goroutine failed first or d passed
// without that many. One caller at a time.
func (p *progress) wait(n int64, d time.Duration) bool {
	p.mu.Lock()
	if p.n >= n {
		p.mu.Unlock()
		return true
	}
	hit := make(chan struct{})
	p.at, p.hit = n, hit
	p.mu.Unlock()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-hit:
		return true
	case <-p.failed:
	case <-t.C:
	}
	p.mu.Lock()
	p.hit = nil
	p.mu.Unlock()
	return false
}
