package perftest_test

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/rdma/perftest"
	"github.com/rdmafs/rdmafs/rdma/tcp"
)

// loopback starts a perftest server and a baseline server on 127.0.0.1 and
// returns connected clients.
func loopback(t testing.TB, depth int) (*perftest.Client, *perftest.TCPClient) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	srv, err := tcp.Open(tcp.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := srv.Listen(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go perftest.Serve(ctx, srv, ln)
	bl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go perftest.ServeTCP(ctx, bl)
	dev, _ := tcp.Open(tcp.Options{})
	c, err := perftest.Dial(ctx, dev, ln.Addr(), depth)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	b, err := perftest.DialTCP(ctx, bl.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return c, b
}

func TestSweep(t *testing.T) {
	c, b := loopback(t, 4)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rows, err := perftest.Sweep(ctx, c, b, []perftest.Op{perftest.OpWrite, perftest.OpRead, perftest.OpSend}, []int{2, 4096, perftest.MaxSize}, 4, 2, time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 9 {
		t.Fatalf("%d rows, want 9", len(rows))
	}
	for _, r := range rows {
		if r.RDMA.Iters < r.RDMA.MinIters || r.Base == nil || r.Base.Iters < r.RDMA.MinIters || r.RDMA.P50 <= 0 {
			t.Fatalf("row %+v: too few iterations or no latency", r)
		}
	}
	if _, err := c.Run(ctx, perftest.Config{Op: perftest.OpRead, Size: perftest.MaxSize + 1, Depth: 1}); err == nil {
		t.Fatal("size over the maximum accepted")
	}
}

func TestParseSizes(t *testing.T) {
	cases := []struct {
		in   string
		want []int
		ok   bool
	}{
		{"4K,1M", []int{4096, 1 << 20}, true},
		{"2", []int{2}, true},
		{"9M", nil, false},
		{"x", nil, false},
		{"0", nil, false},
	}
	for _, c := range cases {
		got, err := perftest.ParseSizes(c.in)
		if (err == nil) != c.ok || fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("ParseSizes(%q) = %v, %v", c.in, got, err)
		}
	}
	if n := len(perftest.AllSizes()); n != 23 {
		t.Errorf("AllSizes has %d sizes, want 23 (2 B .. 8 MiB)", n)
	}
}

// BenchmarkTransport measures the tcp transport and the TCP baseline side by side
// (b.N operations each); run with -benchtime=2s and compare the pairs.
func BenchmarkTransport(b *testing.B) {
	for _, bc := range []struct {
		op          perftest.Op
		size, depth int
	}{
		{perftest.OpRead, 4096, 1}, {perftest.OpRead, 4096, 16}, {perftest.OpRead, 1 << 20, 1},
		{perftest.OpWrite, 1 << 20, 16}, {perftest.OpRead, 1 << 20, 16},
	} {
		c, base := loopback(b, bc.depth)
		for _, side := range []struct {
			name string
			r    perftest.Runner
		}{{"rdma", c}, {"tcp", base}} {
			b.Run(fmt.Sprintf("%s/%s-%d-depth%d", side.name, bc.op, bc.size, bc.depth), func(b *testing.B) {
				b.SetBytes(int64(bc.size))
				res, err := side.r.Run(context.Background(), perftest.Config{Op: bc.op, Size: bc.size, Depth: bc.depth, Batch: bc.depth, MinIters: b.N})
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(res.P50.Nanoseconds()), "p50-ns")
			})
		}
	}
}
