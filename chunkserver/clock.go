package chunkserver

import "time"

// Ticker delivers ticks on C until Stop: the part of a *time.Ticker that a
// connection's lease reaper uses, so that a test can tick it by hand.
type Ticker interface {
	// C returns the channel the ticks arrive on. Its values are not read:
	// the reaper asks Config.Now what time it is.
	C() <-chan time.Time
	// Stop ends the ticks; it does not close C.
	Stop()
}

// realTicker is a *time.Ticker as a Ticker.
type realTicker struct{ t *time.Ticker }

func (r realTicker) C() <-chan time.Time { return r.t.C }
func (r realTicker) Stop()               { r.t.Stop() }

// newRealTicker is the default Config.NewTicker: a time.Ticker of period d.
func newRealTicker(d time.Duration) Ticker { return realTicker{time.NewTicker(d)} }
