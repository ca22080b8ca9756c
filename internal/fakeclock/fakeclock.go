// Package fakeclock is a clock that tests move by hand, for code that takes
// its time source as a function (a Config.Now): time passes only when the
// test calls Advance, so expiry and ageing are tested without sleeping.
package fakeclock

import (
	"sync"
	"time"
)

// Clock is a hand-moved clock, safe for concurrent use. Make one with New.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// New returns a clock that reads start until it is advanced.
func New(start time.Time) *Clock { return &Clock{now: start} }

// Now returns the clock's time: start plus every Advance so far.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock on by d. Nothing else happens: no timer fires and
// nothing is woken; the code under test sees the new time at its next Now.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}
