package fs

import (
	"testing"
	"time"
)

// TestNegativeTTL: the kernel may cache a missing name only until the mount
// would stop using the lease without hearing from meta (leaseFresh after the
// last Recalls answer), at most the entry timeout, and not at all when that
// is too near; meta takes the lease back only later (LeaseSilence).
func TestNegativeTTL(t *testing.T) {
	fsys := &FS{opts: Options{EntryTimeout: time.Second}}
	now := time.Now()
	for _, c := range []struct {
		heard time.Time
		want  time.Duration
	}{
		{now, time.Second},
		{now.Add(-300 * time.Millisecond), 700 * time.Millisecond},
		{now.Add(-995 * time.Millisecond), 0},
		{now.Add(-2 * time.Second), 0},
		{time.Time{}, 0},
	} {
		fsys.leases.heard = c.heard
		if got := fsys.negativeTTL(now); got != c.want {
			t.Errorf("heard %v ago: negative entries for %v, want %v", now.Sub(c.heard), got, c.want)
		}
	}
	fsys.opts.EntryTimeout = 200 * time.Millisecond
	fsys.leases.heard = now
	if got := fsys.negativeTTL(now); got != 200*time.Millisecond {
		t.Errorf("entry timeout 200ms: negative entries for %v", got)
	}
}
