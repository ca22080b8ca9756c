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

// TestCQWaitEnds checks every way a parked Wait ends: a completion, closing
// the queue, the context's cancellation or deadline.
func TestCQWaitEnds(t *testing.T) {
	tests := []struct {
		name    string
		timeout time.Duration // a context deadline, if not zero
		end     func(q *CQ, cancel context.CancelFunc)
		want    error
	}{
		{name: "push", end: func(q *CQ, _ context.CancelFunc) { q.Push(rdma.WorkCompletion{ID: 1}) }},
		{name: "add and notify", end: func(q *CQ, _ context.CancelFunc) { q.Add(rdma.WorkCompletion{ID: 1}); q.Notify() }},
		{name: "close", end: func(q *CQ, _ context.CancelFunc) { q.Close() }, want: rdma.ErrClosed},
		{name: "cancel", end: func(_ *CQ, cancel context.CancelFunc) { cancel() }, want: context.Canceled},
		{name: "deadline", timeout: 30 * time.Millisecond, end: func(*CQ, context.CancelFunc) {}, want: context.DeadlineExceeded},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			q := NewCQ(4)
			defer q.Close()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.timeout > 0 {
				ctx, cancel = context.WithTimeout(ctx, tc.timeout)
				defer cancel()
			}
			// A first wait with the same context registers its cancellation
			// hook, which the parked wait below must reuse.
			q.Push(rdma.WorkCompletion{})
			if err := q.Wait(ctx); err != nil {
				t.Fatalf("Wait with a completion queued: %v", err)
			}
			q.Poll(make([]rdma.WorkCompletion, 1))
			done := make(chan error, 1)
			go func() { done <- q.Wait(ctx) }()
			time.Sleep(10 * time.Millisecond)
			tc.end(q, cancel)
			select {
			case err := <-done:
				if err != tc.want {
					t.Fatalf("Wait = %v, want %v", err, tc.want)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("Wait still parked")
			}
		})
	}
}

// TestCQNoLostWakeup ping-pongs single completions between goroutines many
// times, with and without a pause before each push: a wake-up lost between a
// waiter's check and its park leaves the test stuck.
func TestCQNoLostWakeup(t *testing.T) {
	const rounds = 20000
	q, back := NewCQ(4), NewCQ(4)
	defer q.Close()
	defer back.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	go func() {
		wcs := make([]rdma.WorkCompletion, 1)
		for i := 0; i < rounds; i++ {
			for q.Poll(wcs) == 0 {
				if q.Wait(ctx) != nil {
					return
				}
			}
			if i%64 == 0 {
				time.Sleep(50 * time.Microsecond)
			}
			back.Add(wcs[0])
			back.Notify()
		}
	}()
	wcs := make([]rdma.WorkCompletion, 1)
	for i := 0; i < rounds; i++ {
		q.Push(rdma.WorkCompletion{ID: uint64(i)})
		for back.Poll(wcs) == 0 {
			if err := back.Wait(ctx); err != nil {
				t.Fatalf("round %d: %v (a lost wake-up?)", i, err)
			}
		}
		if wcs[0].ID != uint64(i) {
			t.Fatalf("round %d: got completion %d", i, wcs[0].ID)
		}
	}
}
