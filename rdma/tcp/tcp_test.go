package tcp_test

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/rdmafs/rdmafs/rdma"
	"github.com/rdmafs/rdmafs/rdma/rdmatest"
	"github.com/rdmafs/rdmafs/rdma/tcp"
)

func open(t testing.TB) rdma.Device {
	d, err := tcp.Open(tcp.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestConformance(t *testing.T) {
	rdmatest.Run(t, open, rdmatest.Options{Blackhole: blackhole})
}

// blackhole starts a TCP proxy to addr on 127.0.0.1; after cut it keeps the
// connections open but drops every byte, like a peer gone from the network.
func blackhole(t testing.TB, addr string) (string, func()) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var dropped atomic.Bool
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	pipe := func(dst, src net.Conn) {
		defer wg.Done()
		buf := make([]byte, 64<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 && !dropped.Load() {
				if _, err := dst.Write(buf[:n]); err != nil {
					return
				}
			}
			if err != nil {
				if err != io.EOF && !dropped.Load() {
					dst.Close()
				}
				return
			}
		}
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", addr)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, s)
			mu.Unlock()
			wg.Add(2)
			go pipe(s, c)
			go pipe(c, s)
		}
	}()
	return ln.Addr().String(), func() { dropped.Store(true) }
}
