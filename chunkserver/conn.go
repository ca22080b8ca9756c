package chunkserver

import (
	"context"
	"crypto/hmac"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/rdmafs/rdmafs/chunkserver/chunk"
	"github.com/rdmafs/rdmafs/chunkserver/mempool"
	"github.com/rdmafs/rdmafs/chunkserver/proto"
	"github.com/rdmafs/rdmafs/internal/datakey"
	"github.com/rdmafs/rdmafs/rdma"
)

// sendTag marks the work request ids of replies (receives carry the bare slot).
const sendTag = 1 << 32

// conn is one client connection: a queue pair, a ring of receive buffers (one per
// credit) and of reply buffers carved from the pool, a set of memory windows, and
// the leases and staging grants the client holds. Request messages are handled by
// one worker per credit, so a connection never holds more than Credits requests.
type conn struct {
	s    *Server
	log  *slog.Logger
	peer string // the client's address, for audit lines
	// token is the mount token of a token's connection (nil: the client
	// holds the secret): it is served only the chunks it authorized
	// (chunk -> writable), never writes when the token is read-only.
	token      *proto.Token
	authorized map[uint64]bool // under mu
	qp         rdma.QueuePair
	cq         rdma.CompletionQueue

	ring      mempool.Buf // Credits receive buffers, then sendSlots reply buffers
	sendSlots int
	allMWs    []rdma.MemoryWindow
	mws       chan rdma.MemoryWindow // free windows
	work      chan received
	sendFree  chan int
	pollMu    sync.Mutex              // serializes polling cq
	wcs       [32]rdma.WorkCompletion // the poll buffer, under pollMu

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu          sync.Mutex
	leases      map[uint64]*lease
	byKey       map[chunk.Key]*lease
	staging     map[chunk.Key]*staging
	stagedBytes int
	slab        slab // the connection's staging slab, once granted
}

// slab is a connection's staging slab (OpSlab): a buffer the client may write
// patches into for the connection's life, through mw.
type slab struct {
	buf mempool.Buf
	mw  rdma.MemoryWindow
	rep proto.Reply // the grant: Addr, RKey, Length
}

type received struct {
	slot int
	n    int
}

// lease is a read lease: a resident version pinned and a window granting remote
// read of it to this connection until expiry.
type lease struct {
	id     uint64
	key    chunk.Key
	res    *resident
	mw     rdma.MemoryWindow // nil for an empty version
	rkey   uint32
	addr   uint64
	expiry time.Time
}

// staging is a prepared write: a buffer and a window granting remote write of it.
type staging struct {
	key chunk.Key
	stageSpec
	buf    mempool.Buf
	mw     rdma.MemoryWindow
	rkey   uint32
	expiry time.Time
}

// newConn allocates a connection's resources and posts its receives; the caller
// accepts the request with c.qp.
func (s *Server) newConn(ctx context.Context, log *slog.Logger, peer string) (_ *conn, err error) {
	cfg := &s.cfg
	c := &conn{
		s: s, log: log, peer: peer,
		sendSlots: cfg.Credits + 4,
		leases:    make(map[uint64]*lease),
		byKey:     make(map[chunk.Key]*lease),
		staging:   make(map[chunk.Key]*staging),
	}
	c.ctx, c.cancel = context.WithCancel(ctx)
	defer func() {
		if err != nil {
			c.destroy()
		}
	}()
	if c.cq, err = cfg.Device.CreateCQ(cfg.Credits + c.sendSlots + 8); err != nil {
		return nil, fmt.Errorf("create cq: %w", err)
	}
	if h, ok := c.cq.(eventHandlerSetter); ok {
		h.SetEventHandler(c.handleEvents)
	}
	c.qp, err = s.pd.CreateQP(rdma.QPAttr{
		SendCQ: c.cq, RecvCQ: c.cq,
		MaxSendWR: c.sendSlots, MaxRecvWR: cfg.Credits, MaxSGE: 1,
	})
	if err != nil {
		return nil, fmt.Errorf("create qp: %w", err)
	}
	if c.ring, err = s.cache.alloc((cfg.Credits + c.sendSlots) * cfg.MaxMsg); err != nil {
		return nil, fmt.Errorf("message buffers: %w", err)
	}
	c.mws = make(chan rdma.MemoryWindow, cfg.WindowsPerConn)
	for i := 0; i < cfg.WindowsPerConn; i++ {
		mw, err := s.pd.AllocMW()
		if err != nil {
			return nil, fmt.Errorf("alloc memory window: %w", err)
		}
		c.allMWs = append(c.allMWs, mw)
		c.mws <- mw
	}
	c.work = make(chan received, cfg.Credits)
	c.sendFree = make(chan int, c.sendSlots)
	for i := 0; i < c.sendSlots; i++ {
		c.sendFree <- i
	}
	for i := 0; i < cfg.Credits; i++ {
		if err := c.postRecv(i); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func (c *conn) msgBuf(slot int) rdma.SGE {
	return c.s.pool.SGE(c.ring, slot*c.s.cfg.MaxMsg, c.s.cfg.MaxMsg)
}

func (c *conn) msgBytes(slot int) []byte {
	b := c.s.pool.Bytes(c.ring)
	return b[slot*c.s.cfg.MaxMsg : (slot+1)*c.s.cfg.MaxMsg]
}

func (c *conn) postRecv(slot int) error {
	sge := [1]rdma.SGE{c.msgBuf(slot)}
	wr := [1]rdma.RecvWR{{ID: uint64(slot), SGL: sge[:]}}
	if err := c.qp.PostRecv(wr[:]); err != nil {
		return fmt.Errorf("post receive: %w", err)
	}
	return nil
}

// run serves the connection until it disconnects or the server stops, then
// releases everything it held.
func (c *conn) run() {
	c.wg.Add(2 + c.s.cfg.Credits)
	// The reaper's ticker exists before any request is served, so whoever
	// ticks an injected one after a reply reaches this connection too.
	tick := c.s.cfg.NewTicker(c.s.cfg.ReapInterval)
	go c.poll()
	go c.reap(tick)
	for i := 0; i < c.s.cfg.Credits; i++ {
		go c.worker()
	}
	select {
	case <-c.ctx.Done():
	case <-c.qp.Disconnected():
	}
	c.cancel()
	// The workers finish what they are doing (a commit in progress completes)
	// and stop; only then is the queue pair closed, so nothing posts to a
	// destroyed queue pair.
	c.wg.Wait()
	c.destroy()
}

// fail ends the connection.
func (c *conn) fail() { c.cancel() }

// destroy revokes every grant and frees the connection's resources. The workers
// have stopped.
func (c *conn) destroy() {
	c.cancel()
	if c.qp != nil {
		c.qp.Close()
	}
	c.mu.Lock()
	leases := c.leases
	stagings := c.staging
	c.leases, c.byKey, c.staging = nil, nil, nil
	c.mu.Unlock()
	for _, l := range leases {
		c.endLease(l)
	}
	for _, st := range stagings {
		c.endStaging(st)
	}
	c.mu.Lock()
	sl := c.slab
	c.slab = slab{}
	c.mu.Unlock()
	if sl.buf.Size != 0 {
		c.revoke(sl.mw)
		c.s.pool.Free(sl.buf)
		c.s.slabBytes.Add(-int64(sl.rep.Length))
		c.s.metrics.StagingBytes.Sub(float64(sl.rep.Length))
	}
	for _, mw := range c.allMWs {
		mw.Close()
	}
	if c.cq != nil {
		c.cq.Close()
	}
	if c.ring.Size != 0 {
		c.s.pool.Free(c.ring)
		c.ring = mempool.Buf{}
	}
}

// eventHandlerSetter is a completion queue that can hand its completions to a
// function on the transport's own goroutine (the software transports' CQs).
type eventHandlerSetter interface {
	SetEventHandler(fn func() bool)
}

// handleEvents dispatches completions on the transport's goroutine, where they
// were produced: a request reaches its worker with one goroutine switch
// instead of two. Dispatching never blocks (the channels hold a slot per
// credit and per reply buffer). When the poller holds the queue it reports
// false, and the queue wakes the poller instead.
func (c *conn) handleEvents() bool {
	if !c.pollMu.TryLock() {
		return false
	}
	defer c.pollMu.Unlock()
	for {
		n := c.cq.Poll(c.wcs[:])
		if !c.dispatch(c.wcs[:n]) || n < len(c.wcs) {
			return true
		}
	}
}

// poll dispatches completions that were not handled where they were produced.
func (c *conn) poll() {
	defer c.wg.Done()
	for {
		c.pollMu.Lock()
		n := c.cq.Poll(c.wcs[:])
		ok := c.dispatch(c.wcs[:n])
		c.pollMu.Unlock()
		if !ok {
			return
		}
		if n == 0 {
			if err := c.cq.Wait(c.ctx); err != nil {
				return
			}
		}
	}
}

// dispatch hands received messages to the workers and finished reply sends
// back to the free list; it reports false when a completion failed the
// connection. The caller holds c.pollMu.
func (c *conn) dispatch(wcs []rdma.WorkCompletion) bool {
	for _, wc := range wcs {
		if wc.Status != rdma.WCSuccess {
			if wc.Status != rdma.WCWRFlushErr {
				c.log.Warn("chunkd: connection failed", "status", wc.Status, "opcode", wc.Opcode)
			}
			c.fail()
			return false
		}
		if wc.ID&sendTag != 0 {
			c.sendFree <- int(wc.ID &^ sendTag)
			continue
		}
		c.work <- received{slot: int(wc.ID), n: int(wc.ByteLen)}
	}
	return true
}

// reap revokes, at each tick of t, the leases and staging grants expired by
// the configured clock, until the connection ends; it stops t.
func (c *conn) reap(t Ticker) {
	defer c.wg.Done()
	defer t.Stop()
	var leases []*lease
	var stagings []*staging
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-t.C():
			now := c.s.cfg.Now()
			leases, stagings = leases[:0], stagings[:0]
			c.mu.Lock()
			for id, l := range c.leases {
				if now.After(l.expiry) {
					delete(c.leases, id)
					delete(c.byKey, l.key)
					leases = append(leases, l)
				}
			}
			for k, st := range c.staging {
				if now.After(st.expiry) {
					delete(c.staging, k)
					stagings = append(stagings, st)
				}
			}
			c.mu.Unlock()
			for _, l := range leases {
				c.endLease(l)
			}
			for _, st := range stagings {
				c.log.Info("chunkd: staging expired without commit", "chunk", st.key)
				c.endStaging(st)
			}
		}
	}
}

// endLease revokes a lease removed from the maps and unpins its version.
func (c *conn) endLease(l *lease) {
	if l.mw != nil {
		c.revoke(l.mw)
	}
	c.s.cache.release(l.res)
	c.s.metrics.Leases.Dec()
}

// endStaging revokes and frees a staging grant removed from the maps.
func (c *conn) endStaging(st *staging) {
	if st.mw != nil {
		c.revoke(st.mw)
	}
	c.s.pool.Free(st.buf)
	c.mu.Lock()
	c.stagedBytes -= st.length
	c.mu.Unlock()
	c.s.store.Unclaim(st.key) // a no-op after a commit's Put took the claim
	c.s.unstage(st.key, c)
	c.s.metrics.Staging.Dec()
	c.s.metrics.StagingBytes.Sub(float64(st.length))
}

// revoke invalidates mw (waiting for remote accesses in progress) and returns it
// to the free windows.
func (c *conn) revoke(mw rdma.MemoryWindow) {
	if err := c.qp.InvalidateMW(mw); err != nil {
		c.log.Debug("chunkd: invalidate window", "err", err)
	}
	c.s.metrics.Revocations.Inc()
	c.mws <- mw
}

// stage marks key as being written by c; it reports false when another
// write of it is in progress.
func (s *Server) stage(key chunk.Key, c *conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.staged[key]; ok {
		return false
	}
	s.staged[key] = c
	return true
}

func (s *Server) unstage(key chunk.Key, c *conn) {
	s.mu.Lock()
	if s.staged[key] == c {
		delete(s.staged, key)
	}
	s.mu.Unlock()
}

// worker handles request messages: decode, give the receive buffer back, serve the
// batch, send the replies.
func (c *conn) worker() {
	defer c.wg.Done()
	cfg := &c.s.cfg
	reqs := make([]proto.Request, 0, cfg.MaxBatch)
	reps := make([]proto.Reply, 0, cfg.MaxBatch)
	var sge [1]rdma.SGE
	var wr [1]rdma.SendWR
	for {
		var rv received
		select {
		case <-c.ctx.Done():
			return
		case rv = <-c.work:
		}
		id, batch, err := proto.DecodeRequests(c.msgBytes(rv.slot)[:rv.n], reqs)
		if perr := c.postRecv(rv.slot); perr != nil {
			c.log.Warn("chunkd: repost receive", "err", perr)
			c.fail()
			return
		}
		if err != nil {
			// A peer that does not speak the protocol gets disconnected: there
			// is no request to answer.
			c.s.metrics.Errors.WithLabelValues("protocol").Inc()
			c.s.audit.Warn("chunkd: malformed request message, disconnecting", "peer", c.peer, "err", err)
			c.fail()
			return
		}
		reps = reps[:0]
		spare := cfg.MaxMsg - proto.HeaderLen - len(batch)*proto.ReplyLen
		for i := range batch {
			reps = append(reps, c.serve(&batch[i], &spare))
		}
		var slot int
		select {
		case <-c.ctx.Done():
			return
		case slot = <-c.sendFree:
		}
		n, err := proto.EncodeReplies(c.msgBytes(cfg.Credits+slot), id, reps)
		if err != nil { // cannot happen: the sizes were checked
			c.log.Error("chunkd: encode replies", "err", err)
			c.fail()
			return
		}
		sge[0] = c.msgBuf(cfg.Credits + slot)
		sge[0].Length = uint32(n)
		wr[0] = rdma.SendWR{ID: sendTag | uint64(slot), Opcode: rdma.OpSend, Flags: rdma.SendSignaled, SGL: sge[:]}
		if err := c.qp.PostSend(wr[:]); err != nil {
			c.log.Debug("chunkd: send reply", "err", err)
			c.fail()
			return
		}
	}
}

// serve handles one request and accounts for it.
func (c *conn) serve(req *proto.Request, spare *int) proto.Reply {
	start := time.Now()
	rep := c.handle(req, spare)
	rep.Op = req.Op
	c.s.requests.Add(1)
	c.s.opCount[req.Op][min(int(rep.Status), numStatus-1)].Inc()
	c.s.opLat[req.Op].Observe(time.Since(start).Seconds())
	return rep
}

func (c *conn) handle(req *proto.Request, spare *int) proto.Reply {
	key := chunk.Key{Chunk: req.Chunk, Version: req.Version}
	if c.token != nil {
		if st := c.tokenAllows(req); st != proto.StatusOK {
			return proto.Reply{Status: st}
		}
		if req.Op == proto.OpAuthorize {
			return proto.Reply{}
		}
	}
	switch req.Op {
	case proto.OpReadLease:
		return c.readLease(key)
	case proto.OpRenewLease:
		return c.renewLease(req.LeaseID)
	case proto.OpReleaseLease:
		c.mu.Lock()
		l := c.leases[req.LeaseID]
		if l != nil {
			delete(c.leases, l.id)
			delete(c.byKey, l.key)
		}
		c.mu.Unlock()
		if l == nil {
			return proto.Reply{Status: proto.StatusLeaseExpired}
		}
		c.endLease(l)
		return proto.Reply{}
	case proto.OpPrepareWrite:
		return c.prepare(key, stageSpec{length: int(req.Length)})
	case proto.OpPreparePatch:
		return c.preparePatch(key, int(req.Length), req.Base, nil)
	case proto.OpClone:
		return c.clone(key, req.Base)
	case proto.OpSlab:
		return c.grantSlab()
	case proto.OpPatchSlab:
		return c.patchFromSlab(key, req)
	case proto.OpCommit:
		return c.commit(key, req.CRC)
	case proto.OpAbort:
		c.mu.Lock()
		st := c.staging[key]
		delete(c.staging, key)
		c.mu.Unlock()
		if st == nil {
			return proto.Reply{Status: proto.StatusNoPrepare}
		}
		c.endStaging(st)
		return proto.Reply{}
	case proto.OpDelete:
		return proto.Reply{Status: statusOf(c.s.deleteVersion(key))}
	case proto.OpStat:
		info, err := c.s.store.Stat(key)
		if err != nil {
			return proto.Reply{Status: statusOf(err)}
		}
		return proto.Reply{Length: info.Length, CRC: info.CRC}
	case proto.OpList:
		vs := c.s.store.List(req.Chunk)
		if len(vs) == 0 {
			return proto.Reply{Status: proto.StatusUnknownChunk}
		}
		n := min(len(vs), *spare/proto.ListEntryLen)
		*spare -= n * proto.ListEntryLen
		rep := proto.Reply{Versions: make([]proto.VersionInfo, n)}
		for i := range rep.Versions {
			rep.Versions[i] = proto.VersionInfo{Version: vs[i].Version, Length: vs[i].Length, CRC: vs[i].CRC}
		}
		if n < len(vs) { // truncated: ask again with a larger message or fewer requests
			rep.Status = proto.StatusBusy
		}
		return rep
	}
	return proto.Reply{Status: proto.StatusInvalid}
}

func ms(d time.Duration) uint32 { return uint32(d / time.Millisecond) }

func (l *lease) reply(ttl time.Duration) proto.Reply {
	return proto.Reply{LeaseID: l.id, Addr: l.addr, RKey: l.rkey, Length: l.res.info.Length, CRC: l.res.info.CRC, TTL: ms(ttl)}
}

func (c *conn) readLease(key chunk.Key) proto.Reply {
	ttl := c.s.cfg.LeaseTTL
	c.mu.Lock()
	if l := c.byKey[key]; l != nil {
		l.expiry = c.s.cfg.Now().Add(ttl)
		c.mu.Unlock()
		return l.reply(ttl)
	}
	c.mu.Unlock()
	res, err := c.s.cache.acquire(c.ctx, key)
	if err != nil {
		c.noteErr("lease", key, err)
		return proto.Reply{Status: statusOf(err)}
	}
	l := &lease{key: key, res: res}
	if res.info.Length > 0 {
		var ok bool
		select {
		case l.mw, ok = <-c.mws:
		default:
		}
		if !ok {
			c.s.cache.release(res)
			return proto.Reply{Status: proto.StatusBusy}
		}
		l.addr = c.s.pool.Addr(res.buf)
		l.rkey, err = c.qp.BindMW(l.mw, c.s.pool.MR(), l.addr, uint64(res.info.Length), rdma.AccessRemoteRead)
		if err != nil {
			c.mws <- l.mw
			c.s.cache.release(res)
			c.noteErr("bind", key, err)
			return proto.Reply{Status: proto.StatusBusy}
		}
	}
	c.mu.Lock()
	if c.leases == nil { // connection closing
		c.mu.Unlock()
		c.endLeaseQuiet(l)
		return proto.Reply{Status: proto.StatusShuttingDown}
	}
	if other := c.byKey[key]; other != nil { // a concurrent request won
		other.expiry = c.s.cfg.Now().Add(ttl)
		rep := other.reply(ttl)
		c.mu.Unlock()
		c.endLeaseQuiet(l)
		return rep
	}
	l.id = c.s.nextLease.Add(1)
	l.expiry = c.s.cfg.Now().Add(ttl)
	c.leases[l.id] = l
	c.byKey[key] = l
	c.mu.Unlock()
	c.s.metrics.Leases.Inc()
	c.s.metrics.LeaseBytes.Add(float64(res.info.Length))
	return l.reply(ttl)
}

// endLeaseQuiet undoes a lease that was never handed out.
func (c *conn) endLeaseQuiet(l *lease) {
	if l.mw != nil {
		c.revoke(l.mw)
	}
	c.s.cache.release(l.res)
}

func (c *conn) renewLease(id uint64) proto.Reply {
	ttl := c.s.cfg.LeaseTTL
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.leases[id]
	if l == nil {
		return proto.Reply{Status: proto.StatusLeaseExpired}
	}
	l.expiry = c.s.cfg.Now().Add(ttl)
	return proto.Reply{TTL: ms(ttl)}
}

// stageSpec is what a prepare reserves: a staging buffer of length bytes the
// client writes, and disk room for the new version. A plain write stages the
// version itself and claims its length; a patch (base != 0) stages the encoded
// patch and claims the length of its base, which the new version will have.
type stageSpec struct {
	length  int           // bytes staged
	base    chunk.Version // the version a patch applies to; 0 for a plain write
	baseLen int           // the base's length (a patch only)
	// src, when not nil, is the staged bytes themselves (a patch from the
	// slab), copied at once instead of granting the client a window.
	src []byte
}

// claim returns the length of the version to claim disk room for.
func (sp stageSpec) claim() int {
	if sp.base != 0 {
		return sp.baseLen
	}
	return sp.length
}

// prepare reserves the staging of a plain write or a patch of key: the staged
// length bounded by the store's largest version and the connection's staging
// quota, key neither stored nor being written, disk room claimed for the new
// version, then a buffer and a window granting the client remote write.
func (c *conn) prepare(key chunk.Key, sp stageSpec) proto.Reply {
	s := c.s
	length := sp.length
	if length > s.store.MaxLength() || length < 0 {
		return proto.Reply{Status: proto.StatusTooLong}
	}
	if _, err := s.store.Stat(key); err == nil {
		return proto.Reply{Status: proto.StatusExists}
	}
	if !s.stage(key, c) {
		return proto.Reply{Status: proto.StatusExists}
	}
	c.mu.Lock()
	if c.staging == nil || c.stagedBytes+length > s.cfg.MaxStagingPerConn {
		closing := c.staging == nil
		c.mu.Unlock()
		s.unstage(key, c)
		if closing {
			return proto.Reply{Status: proto.StatusShuttingDown}
		}
		return proto.Reply{Status: proto.StatusBusy}
	}
	c.stagedBytes += length
	c.mu.Unlock()
	st := &staging{key: key, stageSpec: sp}
	undo := func(status proto.Status) proto.Reply {
		if st.mw != nil {
			c.mws <- st.mw
		}
		if st.buf.Size != 0 {
			s.pool.Free(st.buf)
		}
		s.store.Unclaim(key) // a no-op if the claim was refused
		c.mu.Lock()
		c.stagedBytes -= length
		c.mu.Unlock()
		s.unstage(key, c)
		return proto.Reply{Status: status}
	}
	// Disk space first: a full chunkserver says so (StatusNoSpace) before
	// the client sends any data, and the client places the shard elsewhere.
	err := s.store.Claim(key, sp.claim())
	c.noteClaim(key, err)
	if err != nil {
		return undo(statusOf(err))
	}
	if st.buf, err = s.cache.alloc(length); err != nil {
		c.noteErr("staging", key, err)
		return undo(proto.StatusBusy)
	}
	addr := s.pool.Addr(st.buf)
	if sp.src != nil {
		copy(s.pool.Bytes(st.buf)[:length], sp.src)
	} else if length > 0 {
		select {
		case st.mw = <-c.mws:
		default:
			return undo(proto.StatusBusy)
		}
		if st.rkey, err = c.qp.BindMW(st.mw, s.pool.MR(), addr, uint64(length), rdma.AccessRemoteWrite); err != nil {
			c.noteErr("bind", key, err)
			return undo(proto.StatusBusy)
		}
	}
	ttl := s.cfg.StagingTTL
	st.expiry = c.s.cfg.Now().Add(ttl)
	c.mu.Lock()
	if c.staging == nil {
		c.mu.Unlock()
		if st.mw != nil {
			c.qp.InvalidateMW(st.mw)
		}
		return undo(proto.StatusShuttingDown)
	}
	c.staging[key] = st
	c.mu.Unlock()
	s.metrics.Staging.Inc()
	s.metrics.StagingBytes.Add(float64(length))
	return proto.Reply{Addr: addr, RKey: st.rkey, Length: uint32(length), TTL: ms(ttl)}
}

// commit makes the staged version key durable and answers {Length, CRC} of
// the stored version. crc is the CRC32C of the staged bytes: of the version
// itself for a plain write, of the encoded patch for a patch (commitPatch
// builds the version).
//
// A retried commit whose first ack was lost finds no staging and the version
// stored. It is answered OK, with the stored version's length and CRC, when crc
// is the stored version's CRC (a plain write), otherwise StatusExists — a
// retried patch commit too, whose crc is the patch's: its writer rewrites the
// stripe whole, as after any failed patch.
func (c *conn) commit(key chunk.Key, crc uint32) proto.Reply {
	s := c.s
	c.mu.Lock()
	st := c.staging[key]
	if st != nil {
		delete(c.staging, key)
	}
	c.mu.Unlock()
	if st == nil {
		// A retried commit whose first ack was lost finds the version stored.
		if info, err := s.store.Stat(key); err == nil {
			if info.CRC == crc {
				return proto.Reply{Length: info.Length, CRC: info.CRC}
			}
			return proto.Reply{Status: proto.StatusExists}
		}
		s.mu.Lock()
		owner := s.staged[key]
		s.mu.Unlock()
		if owner != nil && owner != c {
			return proto.Reply{Status: proto.StatusNotAuthorized}
		}
		return proto.Reply{Status: proto.StatusNoPrepare}
	}
	// Revoke the client's write access first: from here on the staged bytes
	// cannot change under the checksum or the disk write.
	if st.mw != nil {
		c.revoke(st.mw)
		st.mw = nil
	}
	data := s.pool.Bytes(st.buf)[:st.length]
	var rep proto.Reply
	if got := checksum(data); got != crc {
		s.metrics.Errors.WithLabelValues("checksum").Inc()
		c.log.Info("chunkd: commit checksum mismatch", "chunk", key, "got", fmt.Sprintf("%08x", got), "want", fmt.Sprintf("%08x", crc))
		rep.Status = proto.StatusChecksumMismatch
	} else if st.base != 0 {
		rep = c.commitPatch(st, data)
	} else if err := s.store.Put(key, data, crc); err != nil {
		c.noteErr("commit", key, err)
		rep.Status = statusOf(err)
	} else {
		s.cache.insert(chunk.Info{Key: key, Length: uint32(st.length), CRC: crc}, st.buf)
		st.buf = mempool.Buf{}
		s.metrics.BytesWritten.Add(float64(st.length))
		s.updateStoreGauges()
		rep = proto.Reply{Length: uint32(st.length), CRC: crc}
	}
	c.endStaging(st)
	return rep
}

// noteClaim accounts for a claim of disk room: a refusal for want of space is
// expected near full and counted, logged once when the chunkserver becomes full
// and once when it has room again; other errors go to noteErr.
func (c *conn) noteClaim(key chunk.Key, err error) {
	s := c.s
	switch st := statusOf(err); {
	case st == proto.StatusNoSpace:
		s.metrics.Errors.WithLabelValues("nospace").Inc()
		if !s.full.Swap(true) {
			s.log.Warn("chunkd: disk full: refusing new versions until space is freed", "chunk", key, "err", err)
		}
	case st != proto.StatusOK:
		c.noteErr("prepare", key, err)
	case s.full.Load() && s.full.Swap(false):
		s.log.Info("chunkd: disk has room again: taking new versions")
	}
}

func (c *conn) noteErr(kind string, key chunk.Key, err error) {
	c.s.metrics.Errors.WithLabelValues(kind).Inc()
	level := slog.LevelDebug
	if st := statusOf(err); st == proto.StatusIOError || st == proto.StatusNoSpace {
		level = slog.LevelError
	}
	c.log.Log(context.Background(), level, "chunkd: "+kind, "chunk", key, "err", err)
}

// statusOf maps an error of the store, the cache or the context to a status.
func statusOf(err error) proto.Status {
	var ve *storeVersionError
	switch {
	case err == nil:
		return proto.StatusOK
	case errors.As(err, &ve):
		return proto.StatusWrongVersion
	case errors.Is(err, errStoreNotFound):
		return proto.StatusUnknownChunk
	case errors.Is(err, errStoreExists), errors.Is(err, errStoreBusy):
		return proto.StatusExists
	case errors.Is(err, errStoreTooLong):
		return proto.StatusTooLong
	case errors.Is(err, errStoreNoSpace):
		return proto.StatusNoSpace
	case errors.Is(err, errNoMemory):
		return proto.StatusBusy
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded), errors.Is(err, errStoreClosed):
		return proto.StatusShuttingDown
	}
	return proto.StatusIOError
}

// tokenAllows checks a request of a mount token's connection: an OpAuthorize
// is checked and recorded; any other request on a chunk needs an
// authorization of it (for writing, one that allows writing); a read-only
// token writes nothing. The connection's workers call it concurrently: the
// map is under c.mu.
func (c *conn) tokenAllows(req *proto.Request) proto.Status {
	write := writes(req.Op)
	if (write && c.token.ReadOnly) || req.Op == proto.OpDelete {
		// Deleting versions is meta's garbage collection, never a mount's.
		return proto.StatusNotAuthorized
	}
	switch req.Op {
	case proto.OpRenewLease, proto.OpReleaseLease:
		return proto.StatusOK // the connection's own leases
	case proto.OpSlab:
		return proto.StatusOK // refused above to a read-only token (writes)
	case proto.OpAuthorize:
		capability, w := req.Capability()
		if w && c.token.ReadOnly {
			return proto.StatusNotAuthorized
		}
		if !hmac.Equal(capability[:], datakey.Capability(c.s.cfg.Secret, c.token.ID, req.Chunk, w)) {
			c.s.metrics.Errors.WithLabelValues("auth").Inc()
			c.s.audit.Warn("chunkd: bad chunk capability", "peer", c.peer, "chunk", req.Chunk)
			return proto.StatusNotAuthorized
		}
		c.mu.Lock()
		if c.authorized == nil {
			c.authorized = make(map[uint64]bool)
		}
		c.authorized[req.Chunk] = c.authorized[req.Chunk] || w
		c.mu.Unlock()
		return proto.StatusOK
	}
	c.mu.Lock()
	w, ok := c.authorized[req.Chunk]
	c.mu.Unlock()
	if !ok || (write && !w) {
		return proto.StatusNotAuthorized
	}
	return proto.StatusOK
}

// writes reports whether op stores or removes data (refused on a read-only
// token's connection).
func writes(op proto.Op) bool {
	switch op {
	case proto.OpPrepareWrite, proto.OpCommit, proto.OpAbort, proto.OpDelete, proto.OpPreparePatch, proto.OpSlab, proto.OpPatchSlab, proto.OpClone:
		return true
	}
	return false
}
