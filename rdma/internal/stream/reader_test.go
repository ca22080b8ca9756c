package stream

import (
	"bytes"
	"net"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestFrameReaderIdleAndLowat checks the reader's policies on a real TCP
// connection: a large payload arrives intact into its destination while the
// receive low-water mark is raised and then restored to 1, and idle (where
// completions are delivered) is called at least once per idleBytes even when
// the socket never runs empty, and once more before the reader parks.
func TestFrameReaderIdleAndLowat(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	w, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	r := <-accepted
	if r == nil {
		t.Fatal("accept failed")
	}
	defer r.Close()
	raw, err := r.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}

	const size = 4 << 20
	payload := make([]byte, size)
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	var progress atomic.Uint64
	idles, reads, violations, maxLowat := 0, 0, 0, 0
	rd := newFrameReader(raw, -1, &progress, func() { idles++ })
	// After every read, the bytes read since idle was last called must stay
	// under idleBytes: a read that reaches it calls idle.
	inner := rd.readFn
	parked := make(chan struct{}, 1) // a read found the socket empty and is about to park
	rd.readFn = func(fd uintptr) bool {
		ok := inner(fd)
		reads++
		if rd.unidled >= idleBytes {
			violations++
		}
		maxLowat = max(maxLowat, rd.lowat)
		if !ok {
			select {
			case parked <- struct{}{}:
			default:
			}
		}
		return ok
	}
	// The first MiB trickles in, so that the reader parks in the middle
	// of the payload; the rest comes at once, so that it never runs dry.
	go func() {
		const piece = 64 << 10
		for off := 0; off < 1<<20; off += piece {
			w.Write(payload[off : off+piece])
			time.Sleep(2 * time.Millisecond)
		}
		w.Write(payload[1<<20:])
	}()
	dst := make([]byte, size)
	if err := rd.readInto(dst); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(dst, payload) {
		t.Fatal("payload corrupted")
	}
	if violations > 0 || idles == 0 {
		t.Fatalf("%d reads, %d idle calls, %d reads left idleBytes or more undelivered", reads, idles, violations)
	}
	if rd.lowat == 0 {
		t.Skip("SO_RCVLOWAT refused on this system")
	}
	if maxLowat <= 1 {
		t.Fatalf("the low-water mark was never raised for a %d-byte payload", size)
	}
	// A small read that parks restores the low-water mark: one byte must
	// wake it.
	select { // forget the parks of the large read
	case <-parked:
	default:
	}
	done := make(chan error, 1)
	one := make([]byte, 1)
	go func() { done <- rd.readInto(one) }()
	select {
	case <-parked:
	case err := <-done:
		t.Fatalf("a read of an empty socket returned: %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("the small read neither parked nor returned")
	}
	w.Write([]byte("x"))
	select {
	case err := <-done:
		if err != nil || one[0] != 'x' {
			t.Fatalf("small read: %q, %v", one, err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a 1-byte read is still parked: the low-water mark stayed raised")
	}
	if rd.lowat != 1 {
		t.Fatalf("low-water mark %d after a small read, want 1", rd.lowat)
	}
}
