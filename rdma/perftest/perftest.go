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

// window is the measuring loop that Client.Run and TCPClient.Run share, so
// that the transport and its baseline measure alike: Depth operations are
// posted when the clock starts and, as they complete, replaced Batch at a
// time until Duration has passed and MinIters are done; then the
// outstanding ones drain. Operations are numbered from 0 in posting order.
// Nothing is allocated after newWindow.
type window struct {
	cfg      Config
	post     func(n int) error // posts the next n operations, numbering each with next
	posted   []time.Time       // when operation seq was posted, at seq % Depth
	lat      *latencies
	seq      uint64 // operations posted
	done     uint64 // operations completed
	start    time.Time
	deadline time.Time
	pending  int  // completed operations not replaced yet
	stopping bool // Duration has passed and MinIters are done: post no more
}

func newWindow(cfg Config) *window {
	return &window{cfg: cfg, posted: make([]time.Time, cfg.Depth), lat: newLatencies()}
}

// begin starts the clock and posts Depth operations with post, which refill
// calls from then on.
func (w *window) begin(post func(n int) error) error {
	w.post = post
	w.start = time.Now()
	w.deadline = w.start.Add(w.cfg.Duration)
	return post(w.cfg.Depth)
}

// next numbers an operation posted at now and returns its number.
func (w *window) next(now time.Time) uint64 {
	seq := w.seq
	w.posted[seq%uint64(w.cfg.Depth)] = now
	w.seq++
	return seq
}

// busy reports whether operations are outstanding.
func (w *window) busy() bool { return w.done < w.seq }

// complete records that operation seq completed at now.
func (w *window) complete(seq uint64, now time.Time) {
	w.lat.add(now.Sub(w.posted[seq%uint64(w.cfg.Depth)]))
	w.done++
}

// refill is called after n operations completed at now: it ends the
// measurement once Duration has passed and MinIters are done, and until
// then replaces completed operations once Batch of them are waiting (or
// none is outstanding).
func (w *window) refill(n int, now time.Time) error {
	if !w.stopping && w.done >= uint64(w.cfg.MinIters) && now.After(w.deadline) {
		w.stopping = true
	}
	if w.stopping {
		return nil
	}
	w.pending += n
	if w.pending < w.cfg.Batch && w.done != w.seq {
		return nil
	}
	n, w.pending = w.pending, 0
	return w.post(n)
}

// result is the measurement: the completed operations, timed from begin.
func (w *window) result() Result {
	res := Result{Config: w.cfg, Iters: int(w.done), Elapsed: time.Since(w.start)}
	res.P50, res.P99 = w.lat.percentiles()
	return res
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
	wcs := make([]rdma.WorkCompletion, cfg.Depth)
	w := newWindow(cfg)
	post := func(n int) error {
		// Requests go out in runs of up to Batch per call.
		for n > 0 {
			k := min(n, cfg.Batch)
			first := int(w.seq % uint64(cfg.Depth))
			if first+k > cfg.Depth {
				k = cfg.Depth - first
			}
			now := time.Now()
			for i := first; i < first+k; i++ {
				wrs[i].ID = w.next(now)
			}
			if err := c.qp.PostSend(wrs[first : first+k]); err != nil {
				return err
			}
			n -= k
		}
		return nil
	}
	if err := w.begin(post); err != nil {
		return Result{}, err
	}
	for w.busy() {
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
			w.complete(wc.ID, now)
		}
		if err := w.refill(n, now); err != nil {
			return Result{}, err
		}
	}
	return w.result(), nil
}

// ErrBaseline is returned for a baseline server that does not answer correctly.
var ErrBaseline = errors.New("perftest: baseline protocol error")
