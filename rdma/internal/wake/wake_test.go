package wake

import (
	"sync/atomic"
	"testing"
	"time"
)

// TestGate checks the ways a parked Wait ends: a wake-up after the condition
// turned true, a condition already true (no park), and Close.
func TestGate(t *testing.T) {
	tests := []struct {
		name    string
		before  bool // the condition holds before Wait
		end     func(g *Gate, flag *atomic.Bool)
		wantErr bool
	}{
		{name: "wake", end: func(g *Gate, flag *atomic.Bool) { flag.Store(true); g.Wake() }},
		{name: "already true", before: true, end: func(*Gate, *atomic.Bool) {}},
		{name: "close", end: func(g *Gate, _ *atomic.Bool) { g.Close() }, wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g, err := New()
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			var flag atomic.Bool
			flag.Store(tc.before)
			done := make(chan error, 1)
			go func() { done <- g.Wait(flag.Load) }()
			time.Sleep(10 * time.Millisecond)
			tc.end(g, &flag)
			select {
			case err := <-done:
				if (err != nil) != tc.wantErr {
					t.Fatalf("Wait = %v, want error %v", err, tc.wantErr)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("Wait still parked")
			}
		})
	}
}

// TestGateNoLostWakeup hands a token back and forth through two gates many
// times, with the waker sometimes racing the waiter's park and sometimes
// waking a parked waiter: a lost wake-up leaves the test stuck.
func TestGateNoLostWakeup(t *testing.T) {
	const rounds = 20000
	ping, err := New()
	if err != nil {
		t.Fatal(err)
	}
	defer ping.Close()
	pong, err := New()
	if err != nil {
		t.Fatal(err)
	}
	defer pong.Close()
	var turn atomic.Int64 // even: the pinger's turn, odd: the ponger's
	isOdd := func() bool { return turn.Load()%2 == 1 }
	isEven := func() bool { return turn.Load()%2 == 0 }
	go func() {
		for i := 0; i < rounds; i++ {
			if pong.Wait(isOdd) != nil {
				return
			}
			if i%100 == 0 {
				time.Sleep(20 * time.Microsecond)
			}
			turn.Add(1)
			ping.Wake()
		}
	}()
	timeout := time.AfterFunc(time.Minute, func() { ping.Close() })
	defer timeout.Stop()
	for i := 0; i < rounds; i++ {
		turn.Add(1)
		pong.Wake()
		if err := ping.Wait(isEven); err != nil {
			t.Fatalf("round %d: %v (a lost wake-up?)", i, err)
		}
	}
}
