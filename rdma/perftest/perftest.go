// Package perftest measures an rdma transport the way perftest's ib_write_bw,
// ib_read_bw, ib_read_lat and ib_send_lat do, and measures plain TCP carrying the
// same request/response exchanges in the same run, so results are reported as
// ratios on a shared, noisy machine.
package perftest

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/rdmafs/rdmafs/rdma"
)

// Op is a measured operation.
type Op string

// The operations.
const (
	OpWrite Op = "write"
	OpRead  Op = "read"
	OpSend  Op = "send"
)

// MaxSize is the largest message size measured (8 MiB).
const MaxSize = 8 << 20

// Config describes one measurement.
type Config struct {
	Op       Op
	Size     int           // message size in bytes, 1..MaxSize
	Depth    int           // outstanding operations (iodepth)
	Batch    int           // work requests per post call
	Duration time.Duration // minimum measuring time
	MinIters int           // minimum operations
}

// Result is one measurement.
type Result struct {
	Config
	Iters   int
	Elapsed time.Duration
	P50     time.Duration // per-operation latency, post to completion
	P99     time.Duration
}

// MBps returns the bandwidth in MB/s (10^6 bytes).
func (r Result) MBps() float64 {
	return float64(r.Iters) * float64(r.Size) / r.Elapsed.Seconds() / 1e6
}

// Mops returns millions of operations per second.
func (r Result) Mops() float64 { return float64(r.Iters) / r.Elapsed.Seconds() / 1e6 }

// latencies records per-operation latencies into memory allocated up front.
type latencies struct{ d []time.Duration }

func newLatencies() *latencies { return &latencies{d: make([]time.Duration, 0, 1<<20)} }

func (l *latencies) add(d time.Duration) {
	if len(l.d) < cap(l.d) {
		l.d = append(l.d, d)
	}
}

func (l *latencies) percentiles() (p50, p99 time.Duration) {
	if len(l.d) == 0 {
		return 0, 0
	}
	slices.Sort(l.d)
	return l.d[len(l.d)/2], l.d[min(len(l.d)-1, len(l.d)*99/100)]
}

// serverInfo is the accept private data of a perftest server: where the client
// may read and write.
type serverInfo struct {
	addr uint64
	rkey uint32
	size uint32
}

func (s serverInfo) encode() []byte {
	b := make([]byte, 16)
	binary.LittleEndian.PutUint64(b, s.addr)
	binary.LittleEndian.PutUint32(b[8:], s.rkey)
	binary.LittleEndian.PutUint32(b[12:], s.size)
	return b
}

func decodeServerInfo(b []byte) (serverInfo, error) {
	if len(b) < 16 {
		return serverInfo{}, fmt.Errorf("perftest: server info of %d bytes, want 16", len(b))
	}
	return serverInfo{binary.LittleEndian.Uint64(b), binary.LittleEndian.Uint32(b[8:]), binary.LittleEndian.Uint32(b[12:])}, nil
}

// serverMem is the size of a server connection's region: the largest message
// plus room so that receives and remote ranges need not all overlap.
const serverMem = 2 * MaxSize

// Serve accepts perftest clients on ln until ctx ends: each connection gets a
// registered region the client reads and writes, and a ring of receives that is
// reposted as SENDs consume it.
func Serve(ctx context.Context, dev rdma.Device, ln rdma.Listener) error {
	for {
		req, err := ln.Accept(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("perftest: accept: %w", err)
		}
		go func() {
			if err := serveConn(ctx, dev, req); err != nil && ctx.Err() == nil {
				req.Reject([]byte(err.Error()))
			}
		}()
	}
}

const serverRecvs = 256

func serveConn(ctx context.Context, dev rdma.Device, req rdma.ConnRequest) error {
	pd, err := dev.AllocPD()
	if err != nil {
		return err
	}
	defer pd.Close()
	mem, err := rdma.AllocMemory("perftest-server", serverMem)
	if err != nil {
		return err
	}
	defer mem.Free()
	mr, err := pd.RegisterMemory(mem, rdma.AccessLocalWrite|rdma.AccessRemoteRead|rdma.AccessRemoteWrite)
	if err != nil {
		return err
	}
	defer mr.Deregister()
	scq, _ := dev.CreateCQ(64)
	defer scq.Close()
	rcq, _ := dev.CreateCQ(2 * serverRecvs)
	defer rcq.Close()
	qp, err := pd.CreateQP(rdma.QPAttr{SendCQ: scq, RecvCQ: rcq, MaxRecvWR: serverRecvs, MaxSendWR: 16, RNRTimeout: 5 * time.Second})
	if err != nil {
		return err
	}
	defer qp.Close()
	recvs := make([]rdma.RecvWR, serverRecvs)
	sges := make([]rdma.SGE, serverRecvs)
	for i := range recvs {
		sges[i] = rdma.SGE{Addr: mr.Addr() + uint64(i%2)*MaxSize, Length: MaxSize, LKey: mr.LKey()}
		recvs[i] = rdma.RecvWR{ID: uint64(i), SGL: sges[i : i+1]}
	}
	if err := qp.PostRecv(recvs); err != nil {
		return err
	}
	if err := req.Accept(qp, serverInfo{mr.Addr(), mr.RKey(), serverMem}.encode()); err != nil {
		return err
	}
	wcs := make([]rdma.WorkCompletion, 64)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-qp.Disconnected():
		case <-ctx.Done():
		}
		cancel()
	}()
	for {
		n := rcq.Poll(wcs)
		for _, wc := range wcs[:n] {
			if wc.Status != rdma.WCSuccess {
				return nil
			}
			if err := qp.PostRecv(recvs[wc.ID : wc.ID+1]); err != nil {
				return nil
			}
		}
		if n == 0 {
			if err := rcq.Wait(ctx); err != nil {
				return nil
			}
		}
	}
}

// Client is a connection to a perftest server.
type Client struct {
	dev    rdma.Device
	pd     rdma.ProtectionDomain
	scq    rdma.CompletionQueue
	rcq    rdma.CompletionQueue
	qp     rdma.QueuePair
	mem    *rdma.Memory
	mr     rdma.MemoryRegion
	server serverInfo
	depth  int
}

// Dial connects to the perftest server at addr with room for depth outstanding
// operations of up to MaxSize bytes.
func Dial(ctx context.Context, dev rdma.Device, addr string, depth int) (*Client, error) {
	c := &Client{dev: dev, depth: depth}
	var err error
	if c.pd, err = dev.AllocPD(); err != nil {
		return nil, err
	}
	c.scq, _ = dev.CreateCQ(2 * depth)
	c.rcq, _ = dev.CreateCQ(16)
	if c.qp, err = c.pd.CreateQP(rdma.QPAttr{SendCQ: c.scq, RecvCQ: c.rcq, MaxSendWR: depth, MaxRecvWR: 16}); err != nil {
		c.Close()
		return nil, err
	}
	if c.mem, err = rdma.AllocMemory("perftest-client", min(depth, 4)*MaxSize); err != nil {
		c.Close()
		return nil, err
	}
	if c.mr, err = c.pd.RegisterMemory(c.mem, rdma.AccessLocalWrite); err != nil {
		c.Close()
		return nil, err
	}
	priv, err := dev.Connect(ctx, c.qp, addr, nil)
	if err != nil {
		c.Close()
		return nil, err
	}
	if c.server, err = decodeServerInfo(priv); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// Close disconnects and frees the client's resources.
func (c *Client) Close() error {
	if c.qp != nil {
		c.qp.Close()
	}
	if c.mr != nil {
		c.mr.Deregister()
	}
	if c.mem != nil {
		c.mem.Free()
	}
	if c.scq != nil {
		c.scq.Close()
	}
	if c.rcq != nil {
		c.rcq.Close()
	}
	if c.pd != nil {
		c.pd.Close()
	}
	return nil
}

// Run performs one measurement. Nothing is allocated per operation: the work
// requests, SGEs and completion array are prepared before the clock starts.
func (c *Client) Run(ctx context.Context, cfg Config) (Result, error) {
	if cfg.Size <= 0 || cfg.Size > MaxSize {
		return Result{}, fmt.Errorf("perftest: size %d outside 1..%d", cfg.Size, MaxSize)
	}
	if cfg.Depth <= 0 || cfg.Depth > c.depth {
		return Result{}, fmt.Errorf("perftest: depth %d outside 1..%d", cfg.Depth, c.depth)
	}
	cfg.Batch = max(1, min(cfg.Batch, cfg.Depth))
	var opcode rdma.Opcode
	switch cfg.Op {
	case OpWrite:
		opcode = rdma.OpRDMAWrite
	case OpRead:
		opcode = rdma.OpRDMARead
	case OpSend:
		opcode = rdma.OpSend
	default:
		return Result{}, fmt.Errorf("perftest: unknown op %q", cfg.Op)
	}
	slots := c.mem.Len() / MaxSize
	wrs := make([]rdma.SendWR, cfg.Depth)
	sges := make([]rdma.SGE, cfg.Depth)
	for i := range wrs {
		sges[i] = rdma.SGE{Addr: c.mr.Addr() + uint64(i%slots)*MaxSize, Length: uint32(cfg.Size), LKey: c.mr.LKey()}
		wrs[i] = rdma.SendWR{Opcode: opcode, Flags: rdma.SendSignaled, SGL: sges[i : i+1],
			RemoteAddr: c.server.addr + uint64(i%2)*MaxSize, RKey: c.server.rkey}
	}
	posted := make([]time.Time, cfg.Depth)
	wcs := make([]rdma.WorkCompletion, cfg.Depth)
	lat := newLatencies()
	var seq, done uint64
	post := func(n int) error {
		// Requests go out in runs of up to Batch per call.
		for n > 0 {
			k := min(n, cfg.Batch)
			first := int(seq % uint64(cfg.Depth))
			if first+k > cfg.Depth {
				k = cfg.Depth - first
			}
			now := time.Now()
			for i := first; i < first+k; i++ {
				wrs[i].ID = seq
				posted[i] = now
				seq++
			}
			if err := c.qp.PostSend(wrs[first : first+k]); err != nil {
				return err
			}
			n -= k
		}
		return nil
	}
	start := time.Now()
	deadline := start.Add(cfg.Duration)
	if err := post(cfg.Depth); err != nil {
		return Result{}, err
	}
	stopping := false
	pending := 0
	for done < seq {
		n := c.scq.Poll(wcs)
		if n == 0 {
			if err := c.scq.Wait(ctx); err != nil {
				return Result{}, err
			}
			continue
		}
		now := time.Now()
		for _, wc := range wcs[:n] {
			if wc.Status != rdma.WCSuccess {
				return Result{}, fmt.Errorf("perftest: %s of %d bytes: completion status %v", cfg.Op, cfg.Size, wc.Status)
			}
			lat.add(now.Sub(posted[wc.ID%uint64(cfg.Depth)]))
			done++
		}
		if !stopping && done >= uint64(cfg.MinIters) && now.After(deadline) {
			stopping = true
		}
		if !stopping {
			pending += n
			if pending >= cfg.Batch || done == seq {
				if err := post(pending); err != nil {
					return Result{}, err
				}
				pending = 0
			}
		}
	}
	res := Result{Config: cfg, Iters: int(done), Elapsed: time.Since(start)}
	res.P50, res.P99 = lat.percentiles()
	return res, nil
}

// ErrBaseline is returned for a baseline server that does not answer correctly.
var ErrBaseline = errors.New("perftest: baseline protocol error")
