// Package ratelog logs events that a peer can repeat at will — rejected
// authentications, malformed frames — at a bounded rate, so that a flood of
// them cannot fill the disk or drown other log lines, and says how many it
// left out.
package ratelog

import (
	"log/slog"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// Logger writes warnings through a token bucket: burst lines at once, then
// one per every. Lines over the limit are counted, not written; the next
// line written carries the count as "suppressed". Safe for concurrent use.
type Logger struct {
	log        *slog.Logger
	lim        *rate.Limiter
	now        func() time.Time
	suppressed atomic.Int64
}

// New returns a Logger writing to log at most burst lines at once and then
// one per every; now is the clock (nil: time.Now).
func New(log *slog.Logger, every time.Duration, burst int, now func() time.Time) *Logger {
	if now == nil {
		now = time.Now
	}
	return &Logger{log: log, lim: rate.NewLimiter(rate.Every(every), burst), now: now}
}

// Warn logs msg with args at warning level if the rate allows, and reports
// whether it did.
func (l *Logger) Warn(msg string, args ...any) bool {
	if !l.lim.AllowN(l.now(), 1) {
		l.suppressed.Add(1)
		return false
	}
	if n := l.suppressed.Swap(0); n > 0 {
		args = append(args, "suppressed", n)
	}
	l.log.Warn(msg, args...)
	return true
}
