// Package wake parks a goroutine until another wakes it, through an eventfd
// watched by the Go runtime's network poller instead of a channel.
//
// The difference is in which thread runs the woken goroutine. A wake-up
// through a channel or a mutex makes the runtime wake an idle thread to run
// it (a futex wake-up and a context switch, both costly on virtual machines)
// although the waker is often about to park and its own thread could run it:
// in a transport that completes a request and then waits on its socket, that
// is a wasted context switch per request. A goroutine parked on a file
// descriptor is found by the next thread that looks for work, without waking
// one: normally the waker's own thread, as soon as the waker parks.
//
// The eventfd is never read: every write to it is a new edge for the poller,
// and the woken goroutine checks its condition rather than the counter, so a
// wake-up costs one system call (the write) and the wait none beyond parking.
// The counter cannot reach its maximum (2^64-2 writes).
package wake

import (
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// Gate parks one goroutine at a time until a condition holds. The zero value
// is not usable; make one with New.
type Gate struct {
	f       *os.File
	raw     syscall.RawConn
	pollFn  func(fd uintptr) bool
	writeFn func(fd uintptr) bool
	one     [8]byte // the eventfd increment (read-only)

	// Owned by the waiter (Wait is not called concurrently).
	ready func() bool
	armed bool // pollFn has parked: its next call is a wake-up
}

// New returns a gate with its own eventfd. Close releases it (the eventfd is
// also closed if the gate is garbage collected).
func New() (*Gate, error) {
	fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("wake: eventfd: %w", err)
	}
	f := os.NewFile(uintptr(fd), "wake-eventfd")
	raw, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("wake: eventfd: %w", err)
	}
	g := &Gate{f: f, raw: raw, one: [8]byte{1}}
	g.pollFn = g.poll
	g.writeFn = g.write
	return g, nil
}

// Wait parks until ready reports true, checking it before parking and after
// every wake-up. ready must be safe to call from any goroutine, and a waker
// must make it true before it calls Wake. Wait is not safe for concurrent use
// (one waiter per gate). It fails only when the gate is closed.
func (g *Gate) Wait(ready func() bool) error {
	for !ready() {
		g.ready, g.armed = ready, false
		err := g.raw.Read(g.pollFn)
		g.ready = nil
		if err != nil {
			return fmt.Errorf("wake: wait: %w", err)
		}
	}
	return nil
}

// poll is the poller's callback: true ends a park. Its first call in a Read
// comes after the poller has forgotten earlier edges, so a wake-up that came
// before it shows in the condition; a later one is an edge that ends the park.
func (g *Gate) poll(uintptr) bool {
	if g.armed {
		g.armed = false
		return true
	}
	if g.ready() {
		return true
	}
	g.armed = true
	return false
}

// Wake wakes the waiter, if one is parked or about to park. It costs one
// system call; callers that know nobody waits should not call it.
func (g *Gate) Wake() {
	g.raw.Write(g.writeFn)
}

func (g *Gate) write(fd uintptr) bool {
	for {
		// EAGAIN (a full counter) cannot happen, and would mean a wake-up
		// is pending anyway.
		if _, err := unix.Write(int(fd), g.one[:]); err != unix.EINTR {
			return true
		}
	}
}

// Close wakes a parked waiter, whose Wait then fails unless ready holds, and
// releases the eventfd.
func (g *Gate) Close() error {
	g.Wake()
	return g.f.Close()
}
