package fakeclock_test

import (
	"sync"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/internal/fakeclock"
)

func TestClock(t *testing.T) {
	start := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	c := fakeclock.New(start)
	if got := c.Now(); !got.Equal(start) {
		t.Fatalf("Now = %v, want the start %v", got, start)
	}
	if got := c.Now(); !got.Equal(start) {
		t.Fatalf("Now moved by itself: %v", got)
	}
	// Concurrent advances all count.
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() { c.Advance(time.Second) })
	}
	wg.Wait()
	if got, want := c.Now(), start.Add(10*time.Second); !got.Equal(want) {
		t.Fatalf("Now after 10 advances of 1s = %v, want %v", got, want)
	}
}
