package main

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/rdmafs/rdmafs/rdma/perftest"
	"github.com/rdmafs/rdmafs/rdma/transport"
)

type benchRDMAFlags struct {
	server    bool
	listen    string
	connect   string
	loopback  bool
	transport string
	ops       string
	sizes     string
	depths    []int
	batch     int
	duration  time.Duration
	baseline  string
}

func newBenchRDMACommand() *cobra.Command {
	f := &benchRDMAFlags{}
	c := &cobra.Command{
		Use:   "rdma",
		Short: "perftest-style bandwidth and latency of an rdma transport (ib_write_bw, ib_read_lat, ...)",
		Long: `Measures RDMA_WRITE, RDMA_READ and SEND over an rdma transport: bandwidth and
per-operation latency (post to completion, p50 and p99) for each message size and
queue depth. With --baseline tcp, plain TCP carrying the same request/response
exchanges is measured in the same run and each row shows the ratio.

Run both ends in one process with --loopback, or a server with --server on one
host and --connect on another. The server also answers the TCP baseline on the
next port (listen port + 1).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runBenchRDMA(cmd, f) },
	}
	fl := c.Flags()
	fl.BoolVar(&f.server, "server", false, "serve clients (the passive side)")
	fl.StringVar(&f.listen, "listen", "0.0.0.0:18515", "address the server listens on")
	fl.StringVar(&f.connect, "connect", "", "measure against the server at host:port")
	fl.BoolVar(&f.loopback, "loopback", false, "run server and client in this process over 127.0.0.1")
	fl.StringVar(&f.transport, "transport", "tcp", "rdma transport: tcp, shm, verbs or auto")
	fl.StringVar(&f.ops, "op", "write,read,send", "operations: write, read, send")
	fl.StringVar(&f.sizes, "sizes", "all", `message sizes: "all" (2 B .. 8 MiB) or a list such as 4K,1M`)
	fl.IntSliceVar(&f.depths, "depth", []int{1, 16}, "queue depths to measure (1 = latency)")
	fl.IntVar(&f.batch, "batch", 16, "work requests per post call")
	fl.DurationVar(&f.duration, "duration", 200*time.Millisecond, "minimum time per measurement")
	fl.StringVar(&f.baseline, "baseline", "none", `"tcp" (plain TCP, same exchanges) or "memcpy" (for shm), measured in the same run`)
	return c
}

func runBenchRDMA(cmd *cobra.Command, f *benchRDMAFlags) error {
	ctx := cmd.Context()
	modes := 0
	for _, b := range []bool{f.server, f.connect != "", f.loopback} {
		if b {
			modes++
		}
	}
	if modes != 1 {
		return fmt.Errorf("bench rdma: choose one of --server, --connect or --loopback")
	}
	if f.baseline != "none" && f.baseline != "tcp" && f.baseline != "memcpy" {
		return fmt.Errorf("bench rdma: --baseline %q: want tcp, memcpy or none", f.baseline)
	}
	ops, err := perftest.ParseOps(f.ops)
	if err != nil {
		return fmt.Errorf("bench rdma: %w", err)
	}
	sizes, err := perftest.ParseSizes(f.sizes)
	if err != nil {
		return fmt.Errorf("bench rdma: %w", err)
	}
	addr, baseAddr := f.connect, ""
	if f.server || f.loopback {
		listen := f.listen
		if f.loopback {
			listen = "127.0.0.1:0"
		}
		ra, ba, err := startBenchServers(ctx, f.transport, listen, f.server)
		if err != nil {
			return err
		}
		if f.server {
			fmt.Fprintf(cmd.OutOrStdout(), "serving %s on %s, tcp baseline on %s\n", f.transport, ra, ba)
			<-ctx.Done()
			return nil
		}
		addr, baseAddr = ra, ba
	} else {
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			return fmt.Errorf("bench rdma: --connect %q: %w", addr, err)
		}
		p, _ := strconv.Atoi(port)
		baseAddr = net.JoinHostPort(host, strconv.Itoa(p+1))
	}
	dev, err := transport.Open(f.transport, nil)
	if err != nil {
		return fmt.Errorf("bench rdma: %w", err)
	}
	defer dev.Close()
	for _, depth := range f.depths {
		client, err := perftest.Dial(ctx, dev, addr, depth)
		if err != nil {
			return fmt.Errorf("bench rdma: connect %s: %w", addr, err)
		}
		var base perftest.Runner
		switch f.baseline {
		case "memcpy":
			mc, err := perftest.NewMemcpy()
			if err != nil {
				client.Close()
				return fmt.Errorf("bench rdma: %w", err)
			}
			defer mc.Close()
			base = mc
		case "tcp":
			bc, err := perftest.DialTCP(ctx, baseAddr)
			if err != nil {
				client.Close()
				return fmt.Errorf("bench rdma: %w", err)
			}
			defer bc.Close()
			base = bc
		}
		rows, err := perftest.Sweep(ctx, client, base, ops, sizes, depth, f.batch, f.duration)
		client.Close()
		if err != nil {
			return fmt.Errorf("bench rdma: %w", err)
		}
		title := fmt.Sprintf("\n%s transport, depth %d, batch %d (latency: post to completion)", f.transport, depth, min(f.batch, depth))
		perftest.Print(cmd.OutOrStdout(), title, f.baseline, rows)
	}
	return nil
}

// startBenchServers starts a perftest server on its own device and a TCP baseline
// server on the next port, both stopping with ctx.
func startBenchServers(ctx context.Context, transportName, listen string, log bool) (rdmaAddr, baseAddr string, err error) {
	dev, err := transport.Open(transportName, nil)
	if err != nil {
		return "", "", fmt.Errorf("bench rdma: %w", err)
	}
	ln, err := dev.Listen(ctx, listen)
	if err != nil {
		return "", "", fmt.Errorf("bench rdma: %w", err)
	}
	host, port, _ := net.SplitHostPort(ln.Addr())
	p, _ := strconv.Atoi(port)
	bl, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(p+1)))
	if err != nil {
		ln.Close()
		return "", "", fmt.Errorf("bench rdma: baseline listener: %w", err)
	}
	go func() {
		defer dev.Close()
		defer ln.Close()
		perftest.Serve(ctx, dev, ln)
	}()
	go perftest.ServeTCP(ctx, bl)
	return ln.Addr(), bl.Addr().String(), nil
}
