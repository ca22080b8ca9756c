// Package client is the client side of the chunk protocol: the stub the FUSE
// client and repair use to read and write chunk versions on a chunkd. Control
// requests travel as SEND/RECV on the connection's queue pair, batched where the
// caller batches them; chunk bytes move with one-sided RDMA_READ and RDMA_WRITE
// between the caller's registered buffers and the regions chunkd grants.
//
// A Client is one connection to one chunkd and is safe for concurrent use. The
// buffers named in SGEs must be registered in the protection domain the client
// was dialed with. A connection that fails (including a one-sided access to a
// revoked grant, which moves the queue pair to ERR as verbs do) stays failed: dial
// again.
package client

import (
	"container/list"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmafs/rdmafs/chunkserver/chunk"
	"github.com/rdmafs/rdmafs/chunkserver/proto"
	"github.com/rdmafs/rdmafs/rdma"
)

// Options configure a Client.
type Options struct {
	// Secret is the cluster secret, or with Token the mount token's data
	// key (auth.MountToken.DataKey).
	Secret []byte
	// Token, when set, connects as the holder of that mount token; Caps then
	// holds the chunk capabilities meta gave it, presented to chunkd before
	// a chunk's first use on the connection.
	Token *proto.Token
	Caps  *Caps
	// MaxSendWR is the send queue depth: control messages plus one-sided
	// operations in flight (default 256).
	MaxSendWR int
	// LeaseMargin is how long before its expiry a cached lease is renewed
	// (default a quarter of the lease time).
	LeaseMargin time.Duration
	// MaxCachedLeases bounds the leases the connection keeps cached (default
	// 128); the least recently used one is released beyond it, so that chunkd
	// does not keep memory pinned for versions this client no longer reads.
	// When chunkd answers busy (its memory all leased), the connection
	// releases its least recently used leases and asks again.
	MaxCachedLeases int
	// MinTimeout and MaxTimeout bound the connection's stall timeout (defaults
	// 2s and 10s): when requests are outstanding and nothing at all has
	// completed for that long, the peer is deemed gone and the connection
	// fails (as a queue pair does after its transport retries), so that no
	// caller waits for a silent chunkserver longer than that. Between the
	// bounds the timeout is 16 times the connection's average request
	// latency.
	MinTimeout, MaxTimeout time.Duration
	// Wire, when set, counts the connection's work requests (shared by a
	// pool's connections).
	Wire *WireStats
}

// Defaults of Options.MinTimeout and MaxTimeout.
const (
	defaultMinTimeout = 2 * time.Second
	defaultMaxTimeout = 10 * time.Second
)

// ErrStalled is wrapped by the error of a connection that failed because
// its chunkserver answered nothing for the stall timeout.
var ErrStalled = errors.New("chunkserver client: no answer within the stall timeout")

// ErrClosed is returned once the connection is closed or failed.
var ErrClosed = errors.New("chunkserver client: connection closed")

// RDMAError is a one-sided operation that completed with an error status.
// Status REM_ACCESS_ERR means the grant was revoked (expired) or never covered the
// range.
type RDMAError struct {
	Op     rdma.Opcode
	Status rdma.WCStatus
}

func (e *RDMAError) Error() string { return fmt.Sprintf("chunkserver client: %v: %v", e.Op, e.Status) }

// Lease is a read lease: RDMA_READs of [Addr, Addr+Length) with RKey on this
// connection read the version until Expiry.
type Lease struct {
	ID     uint64
	Key    chunk.Key
	Addr   uint64
	RKey   uint32
	Length uint32
	CRC    uint32    // CRC32C of the version's data
	Expiry time.Time // conservative: measured from when the request was sent
}

// Staging is a prepared write: RDMA_WRITEs into [Addr, Addr+Length) with RKey on
// this connection, then Commit.
type Staging struct {
	Key    chunk.Key
	Addr   uint64
	RKey   uint32
	Length uint32
	Expiry time.Time
}

const (
	recvTag = 1 << 62
	sendTag = 1 << 61
	opTag   = 1 << 60
)

// Client is a connection to one chunkd.
type Client struct {
	addr   string
	qp     rdma.QueuePair
	cq     rdma.CompletionQueue
	mem    *rdma.Memory
	mr     rdma.MemoryRegion
	limits proto.AcceptData
	margin time.Duration
	maxSGE int

	maxLeases int
	wire      *WireStats // nil: not counted

	// A mount token's connection: the capabilities to present and the
	// chunks presented (caps.go).
	caps       *Caps
	authMu     sync.Mutex
	authorized map[uint64]bool

	// Stall detection: the time of the last completion of anything, and
	// the average request latency (an EWMA, nanoseconds).
	minTimeout, maxTimeout time.Duration
	lastProgress           atomic.Int64
	latency                atomic.Int64

	slots chan int      // free send buffers: one per credit
	sq    chan struct{} // room in the send queue
	next  atomic.Uint64

	slab slab // the connection's staging slab on chunkd, for patches

	opPool sync.Pool // *op, reused so that reads and writes do not allocate
	// qpMu guards posting against Close: posts hold it shared and check
	// qpClosed, Close sets qpClosed holding it exclusively (and only then
	// closes the queue pair, without it).
	qpMu     sync.RWMutex
	qpClosed bool
	pollMu   sync.Mutex              // serializes polling the completion queue
	wcs      [64]rdma.WorkCompletion // the poll buffer, under pollMu

	// opsMu guards ops, the one-sided operations in flight by work request
	// ID. It is apart from mu so that completing a read does not contend
	// with the lease cache that every read consults.
	opsMu sync.Mutex
	ops   map[uint64]*op

	mu     sync.Mutex
	calls  map[uint64]*call
	err    error
	leases map[chunk.Key]*cachedLease
	lru    list.List // of *cachedLease, most recently used first

	done       chan struct{} // closed when the connection fails or closes
	closeOnce  sync.Once
	closing    chan struct{} // closed by Close: the poller stops
	closeOnce2 sync.Once
	closeAll   sync.Once // runs close once; concurrent Closes wait for it
	pollDone   chan struct{}
}

type cachedLease struct {
	l    Lease
	elem *list.Element
}

type call struct {
	start int64 // when it was sent, Unix nanoseconds
	slot  int
	want  int
	reps  []proto.Reply
	err   error
	done  chan struct{}
}

type op struct {
	start   int64 // when it was posted, Unix nanoseconds
	pending int
	status  rdma.WCStatus
	done    chan struct{} // receives one value when all work requests completed
	wrs     [4]rdma.SendWR
	wcs     [8]rdma.WorkCompletion
}

// Dial connects to the chunkd at addr through dev, with a queue pair in pd (the
// domain the caller's buffers are registered in), and authenticates with the
// cluster secret.
func Dial(ctx context.Context, dev rdma.Device, pd rdma.ProtectionDomain, addr string, opts Options) (_ *Client, err error) {
	if opts.MaxSendWR <= 0 {
		opts.MaxSendWR = 256
	}
	if opts.MaxCachedLeases <= 0 {
		opts.MaxCachedLeases = 128
	}
	if opts.MaxTimeout <= 0 {
		opts.MaxTimeout = defaultMaxTimeout
	}
	if opts.MinTimeout <= 0 || opts.MinTimeout > opts.MaxTimeout {
		opts.MinTimeout = min(defaultMinTimeout, opts.MaxTimeout)
	}
	c := &Client{
		addr: addr, maxSGE: rdma.MaxSGELimit, minTimeout: opts.MinTimeout, maxTimeout: opts.MaxTimeout,
		calls: make(map[uint64]*call), ops: make(map[uint64]*op), leases: make(map[chunk.Key]*cachedLease),
		done: make(chan struct{}), closing: make(chan struct{}), pollDone: make(chan struct{}),
		caps: opts.Caps, wire: opts.Wire,
	}
	if c.caps != nil {
		c.authorized = make(map[uint64]bool)
	}
	defer func() {
		if err != nil {
			c.release()
		}
	}()
	const maxRecv = 256
	if c.cq, err = dev.CreateCQ(opts.MaxSendWR + maxRecv); err != nil {
		return nil, fmt.Errorf("chunkserver client: create cq: %w", err)
	}
	if h, ok := c.cq.(eventHandlerSetter); ok {
		h.SetEventHandler(c.handleEvents)
	}
	c.qp, err = pd.CreateQP(rdma.QPAttr{SendCQ: c.cq, RecvCQ: c.cq, MaxSendWR: opts.MaxSendWR, MaxRecvWR: maxRecv, MaxSGE: c.maxSGE})
	if err != nil {
		return nil, fmt.Errorf("chunkserver client: create qp: %w", err)
	}
	cd := proto.ConnectData{Time: time.Now(), Token: opts.Token}
	rand.Read(cd.Nonce[:])
	priv := proto.EncodeConnect(opts.Secret, cd)
	acc, err := dev.Connect(ctx, c.qp, addr, priv)
	if err != nil {
		var re *rdma.RejectError
		if errors.As(err, &re) {
			return nil, fmt.Errorf("chunkserver client: %s refused the connection: %s", addr, re.PrivateData)
		}
		return nil, fmt.Errorf("chunkserver client: connect %s: %w", addr, err)
	}
	if c.limits, err = proto.DecodeAccept(opts.Secret, priv, acc); err != nil {
		return nil, fmt.Errorf("chunkserver client: %s: %w", addr, err)
	}
	credits := min(c.limits.Credits, maxRecv, opts.MaxSendWR/2)
	c.maxLeases = opts.MaxCachedLeases
	c.margin = opts.LeaseMargin
	if c.margin <= 0 {
		c.margin = c.limits.LeaseTTL / 4
	}
	if c.mem, err = rdma.AllocMemory("chunk-client-msgs", 2*credits*c.limits.MaxMsg); err != nil {
		return nil, fmt.Errorf("chunkserver client: %w", err)
	}
	if c.mr, err = pd.RegisterMemory(c.mem, rdma.AccessLocalWrite); err != nil {
		return nil, fmt.Errorf("chunkserver client: register message buffers: %w", err)
	}
	c.slots = make(chan int, credits)
	for i := 0; i < credits; i++ {
		c.slots <- i
		if err := c.postRecv(i); err != nil {
			return nil, err
		}
	}
	c.sq = make(chan struct{}, opts.MaxSendWR)
	go c.poll()
	go func() {
		select {
		case <-c.qp.Disconnected():
			c.failAll(fmt.Errorf("%w: %s disconnected", ErrClosed, addr))
		case <-c.done:
		}
	}()
	go c.watch()
	return c, nil
}

// Timeout returns the connection's current stall timeout.
func (c *Client) Timeout() time.Duration {
	return min(max(16*time.Duration(c.latency.Load()), c.minTimeout), c.maxTimeout)
}

// progress records a completion that took lat.
func (c *Client) progress(now, start int64) {
	c.lastProgress.Store(now)
	if start == 0 {
		return
	}
	lat := now - start
	for {
		old := c.latency.Load()
		next := old + (lat-old)/8
		if old == 0 {
			next = lat
		}
		if c.latency.CompareAndSwap(old, next) {
			return
		}
	}
}

// watch fails the connection when requests are outstanding and nothing has
// completed for the stall timeout: a silent peer (hung host, dropped
// packets) would otherwise keep callers waiting for TCP's own timeouts,
// minutes long. Failing closes the queue pair, which flushes every
// outstanding one-sided operation, so the callers' buffers are free again.
func (c *Client) watch() {
	for {
		d := c.Timeout()
		t := time.NewTimer(d / 4)
		select {
		case <-c.done:
			t.Stop()
			return
		case <-t.C:
		}
		oldest := c.oldestOutstanding()
		if oldest == 0 {
			continue
		}
		now := time.Now().UnixNano()
		if since := now - max(oldest, c.lastProgress.Load()); since > int64(d) {
			c.failAll(fmt.Errorf("%w: %w: nothing from %s for %v with requests outstanding", ErrClosed, ErrStalled, c.addr, time.Duration(since).Round(time.Millisecond)))
			go c.Close()
			return
		}
	}
}

// oldestOutstanding returns when the oldest outstanding call or one-sided
// operation started (Unix nanoseconds), or 0 when none is.
func (c *Client) oldestOutstanding() int64 {
	var oldest int64
	c.mu.Lock()
	for _, cl := range c.calls {
		if oldest == 0 || cl.start < oldest {
			oldest = cl.start
		}
	}
	c.mu.Unlock()
	c.opsMu.Lock()
	for _, o := range c.ops {
		if oldest == 0 || o.start < oldest {
			oldest = o.start
		}
	}
	c.opsMu.Unlock()
	return oldest
}

// Limits returns what chunkd granted this connection.
func (c *Client) Limits() proto.AcceptData { return c.limits }

// Addr returns the chunkd's address.
func (c *Client) Addr() string { return c.addr }

// Done is closed when the connection has failed or been closed.
func (c *Client) Done() <-chan struct{} { return c.done }

// Err returns why the connection ended, or nil while it is up.
func (c *Client) Err() error {
	select {
	case <-c.done: // closed after err is set
	default:
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Close disconnects. Outstanding calls fail with ErrClosed. It may be called
// more than once and concurrently; every call returns once the queue pair is
// closed and its memory released.
func (c *Client) Close() error {
	c.closeAll.Do(c.close)
	return nil
}

func (c *Client) close() {
	c.failAll(ErrClosed)
	// No post starts once qpClosed is set; the queue pair is closed after the
	// lock is released, because closing waits for the transport's reader,
	// which may be completing a receive in handleEvents and reposting it
	// (postRecv takes qpMu): holding the lock across Close deadlocked them.
	c.qpMu.Lock()
	c.qpClosed = true
	c.qpMu.Unlock()
	c.qp.Close()
	c.closeOnce2.Do(func() { close(c.closing) })
	<-c.pollDone
	c.release()
}

func (c *Client) release() {
	if c.qp != nil {
		c.qp.Close()
	}
	if c.mr != nil {
		c.mr.Deregister()
		c.mr = nil
	}
	if c.mem != nil {
		c.mem.Free()
		c.mem = nil
	}
	if c.cq != nil {
		c.cq.Close()
	}
}

func (c *Client) failAll(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
		c.closeOnce.Do(func() { close(c.done) })
	}
	calls := c.calls
	c.calls = map[uint64]*call{}
	c.mu.Unlock()
	for _, cl := range calls {
		cl.err = err
		close(cl.done)
	}
}

func (c *Client) msgSGE(i int) rdma.SGE {
	m := c.limits.MaxMsg
	return rdma.SGE{Addr: c.mr.Addr() + uint64(i*m), Length: uint32(m), LKey: c.mr.LKey()}
}

func (c *Client) msgBytes(i int) []byte {
	m := c.limits.MaxMsg
	return c.mem.Bytes()[i*m : (i+1)*m]
}

func (c *Client) recvIndex(slot int) int { return cap(c.slots) + slot }

func (c *Client) postRecv(slot int) error {
	sge := [1]rdma.SGE{c.msgSGE(c.recvIndex(slot))}
	wr := [1]rdma.RecvWR{{ID: recvTag | uint64(slot), SGL: sge[:]}}
	c.qpMu.RLock()
	defer c.qpMu.RUnlock()
	if c.qpClosed {
		return ErrClosed
	}
	if err := c.qp.PostRecv(wr[:]); err != nil {
		return fmt.Errorf("chunkserver client: post receive: %w", err)
	}
	return nil
}

// eventHandlerSetter is a completion queue that can hand its completions to a
// function on the transport's own goroutine (the software transports' CQs).
type eventHandlerSetter interface {
	SetEventHandler(fn func() bool)
}

// handleEvents polls the completion queue where the transport's engine
// produced completions: a read's completion reaches its waiter with one
// goroutine switch instead of two. When another goroutine is polling it
// reports false, and the queue wakes the poller instead.
func (c *Client) handleEvents() bool {
	if !c.pollMu.TryLock() {
		return false
	}
	for {
		n := c.cq.Poll(c.wcs[:])
		for i := range c.wcs[:n] {
			c.complete(&c.wcs[i])
		}
		if n < len(c.wcs) {
			break
		}
	}
	c.pollMu.Unlock()
	return true
}

func (c *Client) poll() {
	defer close(c.pollDone)
	wcs := &c.wcs
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-c.closing
		cancel()
	}()
	for {
		c.pollMu.Lock()
		n := c.cq.Poll(wcs[:])
		for i := range wcs[:n] {
			c.complete(&wcs[i])
		}
		c.pollMu.Unlock()
		if n > 0 {
			continue
		}
		if err := c.cq.Wait(ctx); err != nil && ctx.Err() != nil {
			// Closed: the queue pair has flushed; take what it left, then stop.
			c.pollMu.Lock()
			for n = c.cq.Poll(wcs[:]); n > 0; n = c.cq.Poll(wcs[:]) {
				for i := range wcs[:n] {
					c.complete(&wcs[i])
				}
			}
			c.pollMu.Unlock()
			c.failOps()
			return
		}
	}
}

func (c *Client) complete(wc *rdma.WorkCompletion) {
	switch {
	case wc.ID&recvTag != 0:
		if wc.Status != rdma.WCSuccess {
			c.failAll(fmt.Errorf("%w: receive: %v", ErrClosed, wc.Status))
			return
		}
		slot := int(wc.ID &^ recvTag)
		c.deliver(c.msgBytes(c.recvIndex(slot))[:wc.ByteLen])
		if err := c.postRecv(slot); err != nil {
			c.failAll(fmt.Errorf("%w: %v", ErrClosed, err))
		}
	case wc.ID&sendTag != 0:
		<-c.sq
		if wc.Status != rdma.WCSuccess {
			c.wire.failed(WireSend)
			c.failAll(fmt.Errorf("%w: send: %v", ErrClosed, wc.Status))
		}
	case wc.ID&opTag != 0:
		<-c.sq
		c.opsMu.Lock()
		o := c.ops[wc.ID]
		if o != nil {
			if wc.Status != rdma.WCSuccess && o.status == rdma.WCSuccess {
				o.status = wc.Status
			}
			o.pending--
			if o.pending == 0 {
				c.progress(time.Now().UnixNano(), o.start)
				delete(c.ops, wc.ID)
				o.done <- struct{}{}
			}
		}
		c.opsMu.Unlock()
		if wc.Status != rdma.WCSuccess && wc.Status != rdma.WCWRFlushErr {
			c.failAll(fmt.Errorf("%w: %v failed with %v", ErrClosed, wc.Opcode, wc.Status))
		}
	}
}

// failOps completes the one-sided operations nobody will complete any more.
func (c *Client) failOps() {
	c.opsMu.Lock()
	defer c.opsMu.Unlock()
	for id, o := range c.ops {
		if o.status == rdma.WCSuccess {
			o.status = rdma.WCWRFlushErr
		}
		delete(c.ops, id)
		o.done <- struct{}{}
	}
}

// deliver hands a reply message to its call.
func (c *Client) deliver(b []byte) {
	h, err := proto.DecodeHeader(b)
	if err != nil {
		c.failAll(fmt.Errorf("%w: bad reply from %s: %v", ErrClosed, c.addr, err))
		return
	}
	c.mu.Lock()
	cl := c.calls[h.ID]
	delete(c.calls, h.ID)
	c.mu.Unlock()
	if cl == nil {
		c.progress(time.Now().UnixNano(), 0)
		return
	}
	c.progress(time.Now().UnixNano(), cl.start)
	_, cl.reps, cl.err = proto.DecodeReplies(b, cl.reps[:0])
	if cl.err == nil && len(cl.reps) != cl.want {
		cl.err = fmt.Errorf("chunkserver client: %d replies to %d requests", len(cl.reps), cl.want)
	}
	c.slots <- cl.slot
	close(cl.done)
}

// Do sends a batch of requests in one message and returns their replies, in
// order. The replies' statuses are not turned into errors: see proto.Status.Err.
// len(reqs) must not exceed Limits().MaxBatch.
func (c *Client) Do(ctx context.Context, reqs []proto.Request) ([]proto.Reply, error) {
	if len(reqs) == 0 {
		return nil, nil
	}
	if c.caps != nil {
		return c.doAuthorized(ctx, reqs)
	}
	return c.send(ctx, reqs)
}

// send is Do without authorizations.
func (c *Client) send(ctx context.Context, reqs []proto.Request) ([]proto.Reply, error) {
	if len(reqs) > c.limits.MaxBatch {
		return nil, fmt.Errorf("chunkserver client: batch of %d requests, at most %d", len(reqs), c.limits.MaxBatch)
	}
	var slot int
	select {
	case slot = <-c.slots:
	case <-c.done:
		return nil, c.Err()
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	id := c.next.Add(1)
	// The message memory is freed by Close: it is written only under qpMu,
	// once Close has not begun.
	c.qpMu.RLock()
	if c.qpClosed {
		c.qpMu.RUnlock()
		c.slots <- slot
		return nil, ErrClosed
	}
	n, err := proto.EncodeRequests(c.msgBytes(slot), id, reqs)
	sge := [1]rdma.SGE{c.msgSGE(slot)}
	c.qpMu.RUnlock()
	if err != nil {
		c.slots <- slot
		return nil, fmt.Errorf("chunkserver client: %w", err)
	}
	cl := &call{start: time.Now().UnixNano(), slot: slot, want: len(reqs), reps: make([]proto.Reply, 0, len(reqs)), done: make(chan struct{})}
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		c.slots <- slot
		return nil, c.err
	}
	c.calls[id] = cl
	c.mu.Unlock()
	sge[0].Length = uint32(n)
	wr := [1]rdma.SendWR{{ID: sendTag | id, Opcode: rdma.OpSend, Flags: rdma.SendSignaled, SGL: sge[:]}}
	if err := c.post(ctx, wr[:]); err != nil {
		c.wire.failed(WireSend)
		c.mu.Lock()
		delete(c.calls, id)
		c.mu.Unlock()
		c.slots <- slot
		return nil, err
	}
	c.wire.posted(WireSend, n)
	select {
	case <-cl.done:
	case <-ctx.Done():
		// The reply will still come and return the credit; nobody waits for it.
		return nil, ctx.Err()
	}
	if cl.err != nil {
		return nil, cl.err
	}
	return cl.reps, nil
}

// post posts send work requests once the send queue has room for them.
func (c *Client) post(ctx context.Context, wrs []rdma.SendWR) error {
	for i := range wrs {
		var err error
		select {
		case c.sq <- struct{}{}:
			continue
		case <-c.done:
			err = c.Err()
		case <-ctx.Done():
			err = ctx.Err()
		}
		for range i { // give back the room taken so far
			<-c.sq
		}
		return err
	}
	c.qpMu.RLock()
	err := ErrClosed
	if !c.qpClosed {
		err = c.qp.PostSend(wrs)
	}
	c.qpMu.RUnlock()
	if err != nil {
		for range wrs {
			<-c.sq
		}
		return fmt.Errorf("chunkserver client: post: %w", err)
	}
	return nil
}

func (c *Client) do1(ctx context.Context, req proto.Request) (proto.Reply, error) {
	reps, err := c.Do(ctx, []proto.Request{req})
	if err != nil {
		return proto.Reply{}, err
	}
	return reps[0], reps[0].Status.Err(req.Op)
}

// ReadLease asks for a read lease on key (uncached: see Lease for the cached form).
func (c *Client) ReadLease(ctx context.Context, key chunk.Key) (Lease, error) {
	sent := time.Now()
	rep, err := c.do1(ctx, proto.Request{Op: proto.OpReadLease, Chunk: key.Chunk, Version: key.Version})
	if err != nil {
		return Lease{}, fmt.Errorf("read lease %v: %w", key, err)
	}
	return leaseOf(key, sent, &rep), nil
}

func leaseOf(key chunk.Key, sent time.Time, rep *proto.Reply) Lease {
	return Lease{ID: rep.LeaseID, Key: key, Addr: rep.Addr, RKey: rep.RKey, Length: rep.Length, CRC: rep.CRC,
		Expiry: sent.Add(time.Duration(rep.TTL) * time.Millisecond)}
}

// ReadLeases asks for read leases on several versions in one message.
func (c *Client) ReadLeases(ctx context.Context, keys []chunk.Key) ([]Lease, []error, error) {
	reqs := make([]proto.Request, len(keys))
	for i, k := range keys {
		reqs[i] = proto.Request{Op: proto.OpReadLease, Chunk: k.Chunk, Version: k.Version}
	}
	sent := time.Now()
	reps, err := c.Do(ctx, reqs)
	if err != nil {
		return nil, nil, err
	}
	leases := make([]Lease, len(keys))
	errs := make([]error, len(keys))
	for i := range reps {
		if errs[i] = reps[i].Status.Err(proto.OpReadLease); errs[i] == nil {
			leases[i] = leaseOf(keys[i], sent, &reps[i])
		}
	}
	return leases, errs, nil
}

// RenewLease extends l and returns it with its new expiry.
func (c *Client) RenewLease(ctx context.Context, l Lease) (Lease, error) {
	sent := time.Now()
	rep, err := c.do1(ctx, proto.Request{Op: proto.OpRenewLease, LeaseID: l.ID})
	if err != nil {
		return l, fmt.Errorf("renew lease %v: %w", l.Key, err)
	}
	l.Expiry = sent.Add(time.Duration(rep.TTL) * time.Millisecond)
	return l, nil
}

// ReleaseLease ends l now; chunkd revokes its rkey.
func (c *Client) ReleaseLease(ctx context.Context, l Lease) error {
	c.mu.Lock()
	c.dropLeaseLocked(l.Key, l.ID)
	c.mu.Unlock()
	if _, err := c.do1(ctx, proto.Request{Op: proto.OpReleaseLease, LeaseID: l.ID}); err != nil {
		return fmt.Errorf("release lease %v: %w", l.Key, err)
	}
	return nil
}

// dropLeaseLocked forgets the cached lease of key (only lease id, when id != 0).
func (c *Client) dropLeaseLocked(key chunk.Key, id uint64) {
	if cl := c.leases[key]; cl != nil && (id == 0 || cl.l.ID == id) {
		delete(c.leases, key)
		c.lru.Remove(cl.elem)
	}
}

// Lease returns a lease on key from the connection's cache, renewing it when it
// is within the margin of its expiry and asking for one when there is none.
// Repeated reads of a cached version are then pure one-sided operations.
func (c *Client) Lease(ctx context.Context, key chunk.Key) (Lease, error) {
	now := time.Now()
	c.mu.Lock()
	cached := c.leases[key]
	var l Lease
	if cached != nil {
		l = cached.l
		c.lru.MoveToFront(cached.elem)
	}
	c.mu.Unlock()
	if cached != nil && now.Add(c.margin).Before(l.Expiry) {
		return l, nil
	}
	var err error
	if cached != nil && now.Before(l.Expiry) {
		l, err = c.RenewLease(ctx, l)
	} else {
		l, err = c.readLeaseMakingRoom(ctx, key)
	}
	if err != nil {
		if cached != nil && proto.IsStatus(err, proto.StatusLeaseExpired) {
			l, err = c.ReadLease(ctx, key)
		}
		if err != nil {
			c.mu.Lock()
			c.dropLeaseLocked(key, 0)
			c.mu.Unlock()
			return Lease{}, err
		}
	}
	var evicted []Lease
	c.mu.Lock()
	if cl := c.leases[key]; cl != nil {
		cl.l = l
		c.lru.MoveToFront(cl.elem)
	} else {
		cl = &cachedLease{l: l}
		cl.elem = c.lru.PushFront(cl)
		c.leases[key] = cl
		for c.lru.Len() > c.maxLeases {
			old := c.lru.Back().Value.(*cachedLease)
			c.dropLeaseLocked(old.l.Key, 0)
			evicted = append(evicted, old.l)
		}
	}
	c.mu.Unlock()
	if len(evicted) > 0 {
		go c.releaseAll(evicted)
	}
	return l, nil
}

// busyWait bounds how long readLeaseMakingRoom waits for chunkd memory that
// other connections hold.
const busyWait = 2 * time.Second

// readLeaseMakingRoom asks for a lease on key. While chunkd answers busy —
// every copy in its memory leased — it releases the older half of this
// connection's cached leases and asks again, and once it holds none it waits
// (with backoff, up to busyWait) for other connections' leases to end.
func (c *Client) readLeaseMakingRoom(ctx context.Context, key chunk.Key) (Lease, error) {
	backoff := time.Millisecond
	deadline := time.Now().Add(busyWait)
	for {
		l, err := c.ReadLease(ctx, key)
		if err == nil || !proto.IsStatus(err, proto.StatusBusy) {
			return l, err
		}
		var old []Lease
		c.mu.Lock()
		for n := (c.lru.Len() + 1) / 2; n > 0; n-- {
			cl := c.lru.Back().Value.(*cachedLease)
			c.dropLeaseLocked(cl.l.Key, 0)
			old = append(old, cl.l)
		}
		c.mu.Unlock()
		if len(old) > 0 {
			c.releaseAll(old)
			continue
		}
		if time.Now().After(deadline) {
			return l, err
		}
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return Lease{}, fmt.Errorf("read lease %v: %w (waiting for chunkd memory: %v)", key, ctx.Err(), err)
		}
		backoff = min(2*backoff, 100*time.Millisecond)
	}
}

// releaseAll releases leases evicted from the cache, in one message per batch.
func (c *Client) releaseAll(ls []Lease) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for len(ls) > 0 {
		n := min(len(ls), c.limits.MaxBatch)
		reqs := make([]proto.Request, n)
		for i := range reqs {
			reqs[i] = proto.Request{Op: proto.OpReleaseLease, LeaseID: ls[i].ID}
		}
		if _, err := c.Do(ctx, reqs); err != nil {
			return // the connection is gone, and the leases with it
		}
		ls = ls[n:]
	}
}

// CachedLeases returns how many leases the connection has cached.
func (c *Client) CachedLeases() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.leases)
}

// Read reads len(sgl) bytes in total from offset off of the leased version into
// the caller's registered buffers with RDMA_READ, and waits for them. It waits
// for the transfer even if ctx ends, since the buffers are written until then.
func (c *Client) Read(ctx context.Context, l Lease, off int, sgl []rdma.SGE) error {
	return c.oneSided(ctx, rdma.OpRDMARead, l.Addr, l.RKey, int(l.Length), off, sgl)
}

// ReadAt reads from version key at off into sgl through the lease cache.
func (c *Client) ReadAt(ctx context.Context, key chunk.Key, off int, sgl []rdma.SGE) (Lease, error) {
	l, err := c.Lease(ctx, key)
	if err != nil {
		return Lease{}, err
	}
	return l, c.Read(ctx, l, off, sgl)
}

// PrepareWrite reserves staging for a new version key of length bytes.
func (c *Client) PrepareWrite(ctx context.Context, key chunk.Key, length int) (Staging, error) {
	return c.prepare(ctx, proto.Request{Op: proto.OpPrepareWrite, Chunk: key.Chunk, Version: key.Version}, length)
}

// PreparePatch reserves staging of length bytes for a patch that derives version key from (key.Chunk, base).
// The patch is laid out as proto.EncodePatchHeader and proto.ApplyPatch
// describe; chunkd claims disk room for the base's length, which the new
// version will have. Write the patch with Write, then Commit with the CRC32C of
// the patch bytes. Errors carry chunkd's status: StatusInvalid unless 0 < base <
// key.Version (or for a length shorter than an empty patch's header), the
// base's status when it is not stored (StatusUnknownChunk, StatusWrongVersion),
// StatusExists when key is stored or being written, and those of PrepareWrite.
func (c *Client) PreparePatch(ctx context.Context, key chunk.Key, base chunk.Version, length int) (Staging, error) {
	return c.prepare(ctx, proto.Request{Op: proto.OpPreparePatch, Chunk: key.Chunk, Version: key.Version, Base: base}, length)
}

// prepare sends a PrepareWrite or PreparePatch request for length bytes.
func (c *Client) prepare(ctx context.Context, req proto.Request, length int) (Staging, error) {
	key := chunk.Key{Chunk: req.Chunk, Version: req.Version}
	if length < 0 || length > c.limits.MaxLength {
		return Staging{}, fmt.Errorf("prepare %v: %w", key, proto.StatusTooLong.Err(req.Op))
	}
	req.Length = uint32(length)
	sent := time.Now()
	rep, err := c.do1(ctx, req)
	if err != nil {
		return Staging{}, fmt.Errorf("prepare %v: %w", key, err)
	}
	return Staging{Key: key, Addr: rep.Addr, RKey: rep.RKey, Length: rep.Length,
		Expiry: sent.Add(time.Duration(rep.TTL) * time.Millisecond)}, nil
}

// Write writes the bytes of sgl at offset off of the staging region with
// RDMA_WRITE and waits for them.
func (c *Client) Write(ctx context.Context, st Staging, off int, sgl []rdma.SGE) error {
	return c.oneSided(ctx, rdma.OpRDMAWrite, st.Addr, st.RKey, int(st.Length), off, sgl)
}

// Commit asks chunkd to verify crc (CRC32C) over the staged bytes and make the
// version durable; it returns once the version is on disk. For a patch staging
// (PreparePatch) crc is the CRC32C of the patch bytes.
func (c *Client) Commit(ctx context.Context, key chunk.Key, crc uint32) error {
	_, err := c.commit(ctx, key, crc)
	return err
}

// commit is Commit returning the stored version's info.
func (c *Client) commit(ctx context.Context, key chunk.Key, crc uint32) (chunk.Info, error) {
	rep, err := c.do1(ctx, proto.Request{Op: proto.OpCommit, Chunk: key.Chunk, Version: key.Version, CRC: crc})
	if err != nil {
		return chunk.Info{}, fmt.Errorf("commit %v: %w", key, err)
	}
	return chunk.Info{Key: key, Length: rep.Length, CRC: rep.CRC}, nil
}

// Abort drops a prepared write.
func (c *Client) Abort(ctx context.Context, key chunk.Key) error {
	if _, err := c.do1(ctx, proto.Request{Op: proto.OpAbort, Chunk: key.Chunk, Version: key.Version}); err != nil {
		return fmt.Errorf("abort %v: %w", key, err)
	}
	return nil
}

// WriteVersion writes a whole new version: prepare, RDMA_WRITE of sgl, commit with
// crc (the CRC32C of the bytes of sgl). The commit is sent right behind the
// RDMA_WRITE without waiting for its completion: a reliable connection delivers
// the SEND only after the written data is placed, so this saves a round trip. On
// failure the staging is dropped.
func (c *Client) WriteVersion(ctx context.Context, key chunk.Key, sgl []rdma.SGE, crc uint32) error {
	_, err := c.writeStaged(ctx, proto.OpPrepareWrite, key, 0, sgl, crc)
	return err
}

// WritePatch derives version key from (key.Chunk, base) with the patch in sgl (header and
// ranges, as proto.EncodePatchHeader lays out): prepare, RDMA_WRITE, commit with crc (the CRC32C
// of the patch bytes), like WriteVersion. It returns the new version's info (length, CRC).
// The new version has the base's length. A patch chunkd cannot apply (ranges
// unsorted, overlapping, empty or outside the base, or data not matching them)
// fails with StatusInvalid and stores nothing; see PreparePatch for the other
// statuses. A commit retried after a lost ack answers OK with the stored
// version's info while chunkd remembers the patch (see the chunkserver package).
//
// A patch that fits a free part of the connection's slab (a chunkd that
// offers one) goes in one round trip: RDMA_WRITE into the part, then
// OpPatchSlab and OpCommit in one message.
func (c *Client) WritePatch(ctx context.Context, key chunk.Key, base chunk.Version, sgl []rdma.SGE, crc uint32) (chunk.Info, error) {
	n := 0
	for _, s := range sgl {
		n += int(s.Length)
	}
	if part, ok := c.slabPart(ctx, n); ok {
		return c.writePatchSlab(ctx, key, base, sgl, n, crc, part)
	}
	return c.writeStaged(ctx, proto.OpPreparePatch, key, base, sgl, crc)
}

// writeStaged is WriteVersion (prepare is OpPrepareWrite) and WritePatch
// (OpPreparePatch from base).
func (c *Client) writeStaged(ctx context.Context, prepare proto.Op, key chunk.Key, base chunk.Version, sgl []rdma.SGE, crc uint32) (chunk.Info, error) {
	n := 0
	for _, s := range sgl {
		n += int(s.Length)
	}
	st, err := c.prepare(ctx, proto.Request{Op: prepare, Chunk: key.Chunk, Version: key.Version, Base: base}, n)
	if err != nil {
		return chunk.Info{}, err
	}
	o, err := c.startOneSided(ctx, rdma.OpRDMAWrite, st.Addr, st.RKey, int(st.Length), 0, sgl)
	if err != nil {
		if c.Err() == nil {
			c.Abort(ctx, key)
		}
		return chunk.Info{}, fmt.Errorf("write %v: %w", key, err)
	}
	info, cerr := c.commit(ctx, key, crc)
	if werr := c.finishOneSided(ctx, o, rdma.OpRDMAWrite); werr != nil {
		return chunk.Info{}, fmt.Errorf("write %v: %w", key, werr)
	}
	return info, cerr
}

// Clone stores version key as a copy of (key.Chunk, base) and returns its info.
// It returns once the copy is durable. Cloning a key already stored as a copy
// of base (a retry) succeeds; errors carry chunkd's status: StatusInvalid unless
// 0 < base < key.Version, the base's status when it is not stored
// (StatusUnknownChunk, StatusWrongVersion), StatusExists when key is stored
// otherwise or being written, StatusNoSpace when chunkd has no room for it.
func (c *Client) Clone(ctx context.Context, key chunk.Key, base chunk.Version) (chunk.Info, error) {
	rep, err := c.do1(ctx, proto.Request{Op: proto.OpClone, Chunk: key.Chunk, Version: key.Version, Base: base})
	if err != nil {
		return chunk.Info{}, fmt.Errorf("clone %v from version %x: %w", key, base, err)
	}
	return chunk.Info{Key: key, Length: rep.Length, CRC: rep.CRC}, nil
}

// Delete deletes version key.
func (c *Client) Delete(ctx context.Context, key chunk.Key) error {
	c.mu.Lock()
	c.dropLeaseLocked(key, 0)
	c.mu.Unlock()
	if _, err := c.do1(ctx, proto.Request{Op: proto.OpDelete, Chunk: key.Chunk, Version: key.Version}); err != nil {
		return fmt.Errorf("delete %v: %w", key, err)
	}
	return nil
}

// Stat returns the length and checksum of version key.
func (c *Client) Stat(ctx context.Context, key chunk.Key) (chunk.Info, error) {
	rep, err := c.do1(ctx, proto.Request{Op: proto.OpStat, Chunk: key.Chunk, Version: key.Version})
	if err != nil {
		return chunk.Info{}, fmt.Errorf("stat %v: %w", key, err)
	}
	return chunk.Info{Key: key, Length: rep.Length, CRC: rep.CRC}, nil
}

// List returns the stored versions of a chunk in increasing order (as many as fit
// in one reply; the error then has status Busy).
func (c *Client) List(ctx context.Context, id chunk.ID) ([]chunk.Info, error) {
	reps, err := c.Do(ctx, []proto.Request{{Op: proto.OpList, Chunk: id}})
	if err != nil {
		return nil, fmt.Errorf("list %016x: %w", id, err)
	}
	out := make([]chunk.Info, len(reps[0].Versions))
	for i, v := range reps[0].Versions {
		out[i] = chunk.Info{Key: chunk.Key{Chunk: id, Version: v.Version}, Length: v.Length, CRC: v.CRC}
	}
	return out, reps[0].Status.Err(proto.OpList)
}

// await waits for o, or for ctx to end (its error is returned then and o may
// still be in flight). A transport that completes an operation inside
// PostSend (shared memory does) has its completion in the queue already:
// reaping it here saves two goroutine switches through the poller.
func (c *Client) await(ctx context.Context, o *op) error {
	for i := 0; i < 2; i++ {
		select {
		case <-o.done:
			return nil
		default:
		}
		if !c.pollMu.TryLock() {
			break
		}
		n := c.cq.Poll(o.wcs[:])
		for j := range o.wcs[:n] {
			c.complete(&o.wcs[j])
		}
		c.pollMu.Unlock()
		if n == 0 {
			break
		}
	}
	select {
	case <-o.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// oneSided posts RDMA_READ or RDMA_WRITE work requests for sgl against the remote
// range [addr+off, ...) of a grant of length bytes, split as the queue pair's
// SGE limit requires, and waits for all of them.
func (c *Client) oneSided(ctx context.Context, opcode rdma.Opcode, addr uint64, rkey uint32, length, off int, sgl []rdma.SGE) error {
	o, err := c.startOneSided(ctx, opcode, addr, rkey, length, off, sgl)
	if err != nil {
		return err
	}
	return c.finishOneSided(ctx, o, opcode)
}

// startOneSided posts the work requests of a one-sided operation; o is nil when
// there was nothing to transfer.
func (c *Client) startOneSided(ctx context.Context, opcode rdma.Opcode, addr uint64, rkey uint32, length, off int, sgl []rdma.SGE) (*op, error) {
	total := 0
	for _, s := range sgl {
		total += int(s.Length)
	}
	if off < 0 || off+total > length {
		return nil, fmt.Errorf("chunkserver client: %v of [%d,+%d) outside the grant of %d bytes", opcode, off, total, length)
	}
	if total == 0 {
		return nil, nil
	}
	nwr := (len(sgl) + c.maxSGE - 1) / c.maxSGE
	id := opTag | c.next.Add(1)
	o, _ := c.opPool.Get().(*op)
	if o == nil {
		o = &op{done: make(chan struct{}, 1)}
	}
	o.pending, o.status, o.start = nwr, rdma.WCSuccess, time.Now().UnixNano()
	if err := c.Err(); err != nil {
		c.opPool.Put(o)
		return nil, err
	}
	c.opsMu.Lock()
	c.ops[id] = o
	c.opsMu.Unlock()
	wrs := o.wrs[:0]
	remote := addr + uint64(off)
	for i := 0; i < len(sgl); i += c.maxSGE {
		part := sgl[i:min(i+c.maxSGE, len(sgl))]
		wrs = append(wrs, rdma.SendWR{ID: id, Opcode: opcode, Flags: rdma.SendSignaled, SGL: part, RemoteAddr: remote, RKey: rkey})
		for _, s := range part {
			remote += uint64(s.Length)
		}
	}
	if err := c.post(ctx, wrs); err != nil {
		c.wire.failed(wireOp(opcode))
		c.opsMu.Lock()
		_, mine := c.ops[id]
		delete(c.ops, id)
		c.opsMu.Unlock()
		if mine {
			c.opPool.Put(o)
		}
		return nil, err
	}
	c.wire.posted(wireOp(opcode), total)
	return o, nil
}

// finishOneSided waits for an operation started by startOneSided. When ctx
// ends first (a peer gone silent) the connection is closed, because only a
// closed queue pair guarantees that nothing more lands in the caller's
// buffers: closing flushes its work requests, and the error wraps ctx's.
func (c *Client) finishOneSided(ctx context.Context, o *op, opcode rdma.Opcode) error {
	if o == nil {
		return nil
	}
	if err := c.await(ctx, o); err != nil {
		c.wire.failed(wireOp(opcode))
		c.Close()
		<-o.done
		c.opPool.Put(o)
		return fmt.Errorf("chunkserver client: %v to %s abandoned, connection closed: %w", opcode, c.addr, err)
	}
	status := o.status
	c.opPool.Put(o)
	if status != rdma.WCSuccess {
		c.wire.failed(wireOp(opcode))
		return &RDMAError{Op: opcode, Status: status}
	}
	return nil
}
