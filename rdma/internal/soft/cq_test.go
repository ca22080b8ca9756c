package soft

import (
	"context"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/rdma"
)

// TestCQNotify checks the quiet path of a completion queue: Add queues without
// waking, Notify wakes a parked Wait, or hands the completions to the event
// handler, and a handler that cannot poll leaves the wake-up to Wait.
func TestCQNotify(t *testing.T) {
	tests := []struct {
		name       string
		handler    bool
		handled    bool // what the handler reports
		wantCalls  int
		wantWakeup bool
	}{
		{name: "no handler", wantWakeup: true},
		{name: "handler polls", handler: true, handled: true, wantCalls: 1},
		{name: "handler busy", handler: true, handled: false, wantCalls: 1, wantWakeup: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			q := NewCQ(4)
			calls := 0
			if tc.handler {
				q.SetEventHandler(func() bool { calls++; return tc.handled })
			}
			woken := make(chan error, 1)
			// The waiter parks: nothing is queued yet.
			go func() { woken <- q.Wait(context.Background()) }()
			time.Sleep(10 * time.Millisecond)
			for i := range 20 { // more than the ring holds: it grows
				q.Add(rdma.WorkCompletion{ID: uint64(i)})
			}
			q.Notify()
			q.Notify() // nothing added since: no second call
			if calls != tc.wantCalls {
				t.Fatalf("handler called %d times, want %d", calls, tc.wantCalls)
			}
			if tc.wantWakeup {
				if err := <-woken; err != nil {
					t.Fatalf("Wait: %v", err)
				}
			} else {
				select {
				case <-woken:
					t.Fatal("Wait woken although the handler took the completions")
				case <-time.After(20 * time.Millisecond):
				}
				q.Close()
				<-woken
			}
			wcs := make([]rdma.WorkCompletion, 32)
			if n := q.Poll(wcs); n != 20 {
				t.Fatalf("polled %d, want 20", n)
			}
			for i, wc := range wcs[:20] {
				if wc.ID != uint64(i) {
					t.Fatalf("completion %d has id %d: order lost", i, wc.ID)
				}
			}
		})
	}
}
