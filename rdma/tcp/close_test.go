package tcp_test

import (
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/rdma"
	"github.com/rdmafs/rdmafs/rdma/rdmatest"
)

// TestCloseWhileHandlerPosts closes a queue pair while its completion queue's
// event handler (run by the transport's reader) is about to post a receive on
// it. Close must not wait for the reader while holding what the handler needs.
func TestCloseWhileHandlerPosts(t *testing.T) {
	a, b := rdmatest.Pair(t, open, rdmatest.PairConfig{})
	h, ok := b.RCQ.(interface{ SetEventHandler(func() bool) })
	if !ok {
		t.Skip("the tcp completion queue has no event handler")
	}
	recv := []rdma.RecvWR{{ID: 1, SGL: []rdma.SGE{b.SGE(0, 64)}}}
	inHandler := make(chan struct{}, 1)
	h.SetEventHandler(func() bool {
		select {
		case inHandler <- struct{}{}:
		default:
		}
		time.Sleep(50 * time.Millisecond) // Close arrives meanwhile
		b.QP.PostRecv(recv)               // fails once closed, but must return
		b.RCQ.Poll(make([]rdma.WorkCompletion, 4))
		return true
	})
	if err := b.QP.PostRecv(recv); err != nil {
		t.Fatal(err)
	}
	send := []rdma.SendWR{{ID: 1, Opcode: rdma.OpSend, Flags: rdma.SendSignaled, SGL: []rdma.SGE{a.SGE(0, 64)}}}
	if err := a.QP.PostSend(send); err != nil {
		t.Fatal(err)
	}
	select {
	case <-inHandler:
	case <-time.After(5 * time.Second):
		t.Fatal("the event handler never ran")
	}
	closed := make(chan struct{})
	go func() {
		b.QP.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close deadlocked with the event handler")
	}
}
