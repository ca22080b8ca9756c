package stream

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmafs/rdmafs/rdma"
	"github.com/rdmafs/rdmafs/rdma/internal/soft"
)

// sendSlot is one entry of the send queue: a copy of the posted work request with
// its local SGEs resolved to memory.
type sendSlot struct {
	id       uint64
	op       rdma.Opcode
	signaled bool
	fence    bool // wait for earlier RDMA_READs to complete before going out
	imm      uint32
	raddr    uint64
	rkey     uint32
	length   uint32
	psn      uint32
	localMem
}

// recvSlot is one entry of the receive queue.
type recvSlot struct {
	id       uint64
	capacity uint64
	localMem
}

// localMem is the local memory of a queued work request: its SGEs resolved
// to the registered bytes they name, with the regions held until the request
// completes; or, if an SGE was bad, its status and nothing held.
type localMem struct {
	localErr rdma.WCStatus
	segs     [][]byte
	regs     []*soft.Region
}

// resolve resolves sgl with pd's keys, for writing when write (the request
// puts data there: RDMA_READ, RECV), and returns sgl's total length. A bad
// SGE releases what was taken and is recorded in localErr. segs and regs
// keep their capacity from one request to the next; they must hold nothing
// (releaseRegions runs when a request completes).
func (m *localMem) resolve(pd *soft.PD, sgl []rdma.SGE, write bool) (length uint64) {
	m.localErr = rdma.WCSuccess
	m.segs, m.regs = m.segs[:0], m.regs[:0]
	for _, sge := range sgl {
		length += uint64(sge.Length)
	}
	for _, sge := range sgl {
		if sge.Length == 0 {
			continue
		}
		r, b, st := pd.Keys.Local(sge, pd, write)
		if st != rdma.WCSuccess {
			m.localErr = st
			m.releaseRegions()
			return length
		}
		m.regs = append(m.regs, r)
		m.segs = append(m.segs, b)
	}
	return length
}

// releaseRegions releases the regions held and forgets the resolved memory.
func (m *localMem) releaseRegions() {
	for i, r := range m.regs {
		r.Release()
		m.regs[i] = nil
	}
	m.regs = m.regs[:0]
	m.segs = m.segs[:0]
}

// outItem is a response waiting for the writer: an ACK, a NAK or an RDMA_READ
// response whose payload is read from registered memory held by region.
type outItem struct {
	op         uint8
	status     uint8
	psn        uint32
	rkey       uint32 // GRANT, REVOKE, REVOKE_ACK
	imm        uint32 // GRANT: the access rights
	payload    []byte
	region     *soft.Region
	closeAfter bool // the connection ends once this item is on the wire
}

// sockWriter is a queue pair's socket writer: the batch of frames being
// written (requests and responses, many per writev) and the socket. Whoever
// holds mu writes (see engine.go); nothing in it is allocated per write.
type sockWriter struct {
	mu sync.Mutex
	// flushWanted is set by a flush that may have found mu taken; the
	// holder flushes again after unlocking (see flush).
	flushWanted atomic.Bool
	iov         [][]byte  // the unwritten rest of the current batch
	iovBase     [][]byte  // the backing array iov is a view of
	items       []outItem // the responses of the current batch
	hdrs        []byte    // arena of the current batch's headers
	bufs        net.Buffers
	raw         syscall.RawConn
	fd          int         // the detached socket, or -1 when it is read through the poller
	msg         unix.Msghdr // sendmsg's header, for a detached socket
	iovecs      []unix.Iovec
	n           int   // bytes the last writev callback wrote
	err         error // the last writev callback's error
	broken      bool  // a write failed: nothing more is written
	writevFn    func(fd uintptr) bool
}

// queuePair is an RC queue pair carried by one TCP connection. A reader goroutine
// handles everything that arrives — it is the target-side engine that serves
// RDMA_READ / RDMA_WRITE against the key table without calling the application —
// and a writer goroutine sends requests and responses, many per writev.
type queuePair struct {
	dev    *Device
	pd     *soft.PD
	attr   rdma.QPAttr
	num    uint32
	sendCQ *soft.CQ
	recvCQ *soft.CQ

	mu      sync.Mutex
	state   rdma.QPState
	conn    net.Conn
	remote  string
	peerRNR time.Duration

	// The send queue is a ring indexed by absolute counters: slots [sqHead,
	// sqNext) are on their way or on the wire, [sqNext, sqTail) wait for the writer.
	sq                     []sendSlot
	sqHead, sqNext, sqTail uint64
	nextPSN                uint32
	readsInFlight          int // RDMA_READs in [sqHead, sqNext)

	rq             []recvSlot
	rqHead, rqTail uint64
	rqPosted       chan struct{}

	out  []outItem
	kick chan struct{}

	// w writes the socket; its state is guarded by w.mu (taken before mu).
	w sockWriter

	failStatus   rdma.WCStatus
	running      atomic.Int32 // reader and writer goroutines alive
	tornDown     bool
	done         chan struct{} // closed after teardown
	disconnected chan struct{}
	closeOnce    sync.Once
	progress     atomic.Uint64

	shm *shmState // set on shared-memory connections

	// quiet is set (under mu) while the reader goroutine completes work
	// requests: their completions are added to the CQs without waking a
	// waiter, and the reader notifies the CQs after its next read system
	// call, just before it would park (see frameReader).
	quiet bool

	destroyed bool // Close has run: posting fails with rdma.ErrClosed
}

func (d *Device) newQP(pd *soft.PD, attr rdma.QPAttr) (rdma.QueuePair, error) {
	scq, ok1 := attr.SendCQ.(*soft.CQ)
	rcq, ok2 := attr.RecvCQ.(*soft.CQ)
	if !ok1 || !ok2 {
		return nil, fmt.Errorf("rdma: create qp: completion queues of another transport: %w", rdma.ErrInvalidArgument)
	}
	q := &queuePair{
		dev: d, pd: pd, attr: attr, num: d.qpn.Add(1),
		sendCQ: scq, recvCQ: rcq,
		state:        rdma.QPStateInit,
		sq:           make([]sendSlot, attr.MaxSendWR),
		rq:           make([]recvSlot, attr.MaxRecvWR),
		rqPosted:     make(chan struct{}, 1),
		kick:         make(chan struct{}, 1),
		done:         make(chan struct{}),
		disconnected: make(chan struct{}),
		w:            sockWriter{fd: -1},
	}
	for i := range q.sq {
		q.sq[i].segs = make([][]byte, 0, attr.MaxSGE)
		q.sq[i].regs = make([]*soft.Region, 0, attr.MaxSGE)
	}
	for i := range q.rq {
		q.rq[i].segs = make([][]byte, 0, attr.MaxSGE)
		q.rq[i].regs = make([]*soft.Region, 0, attr.MaxSGE)
	}
	return q, nil
}

// Num implements rdma.QueuePair.
func (q *queuePair) Num() uint32 { return q.num }

// State implements rdma.QueuePair.
func (q *queuePair) State() rdma.QPState {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.state
}

// RemoteAddr implements rdma.QueuePair.
func (q *queuePair) RemoteAddr() string {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.remote
}

// Disconnected implements rdma.QueuePair.
func (q *queuePair) Disconnected() <-chan struct{} { return q.disconnected }

// start moves a connected queue pair to RTS and starts its engine. With
// detach, the socket leaves the network poller and the reader sleeps in
// recv(2) on a thread of its own (see sock.go); conn is then closed.
func (q *queuePair) start(conn net.Conn, peerRNR time.Duration, detach bool) error {
	q.mu.Lock()
	if q.state != rdma.QPStateInit {
		q.mu.Unlock()
		return fmt.Errorf("rdma: connect qp %d in state %v: %w", q.num, q.state, rdma.ErrInvalidState)
	}
	sc, ok := conn.(syscall.Conn)
	if !ok {
		q.mu.Unlock()
		return fmt.Errorf("rdma: connection %T has no file descriptor", conn)
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		q.mu.Unlock()
		return fmt.Errorf("rdma: connection descriptor: %w", err)
	}
	q.remote = conn.RemoteAddr().String()
	if detach {
		fd, err := detachSocket(raw)
		if err != nil {
			q.mu.Unlock()
			return err
		}
		conn.Close()
		q.w.fd = fd
	} else {
		q.w.raw = raw
		q.w.writevFn = q.w.writev
		q.conn = conn
	}
	q.peerRNR = peerRNR
	q.state = rdma.QPStateRTS
	q.running.Store(2)
	q.mu.Unlock()
	go q.readLoop(newFrameReader(q.w.raw, q.w.fd, &q.progress, q.notifyCQs))
	go q.writeLoop()
	go q.watchdog()
	return nil
}

func (q *queuePair) kickWriter() {
	select {
	case q.kick <- struct{}{}:
	default:
	}
}

// PostSend implements rdma.QueuePair.
func (q *queuePair) PostSend(wrs []rdma.SendWR) error {
	for i := range wrs {
		if err := q.validate(&wrs[i]); err != nil {
			return fmt.Errorf("rdma: post send: request %d: %w", i, err)
		}
	}
	q.mu.Lock()
	if q.destroyed {
		q.mu.Unlock()
		return fmt.Errorf("rdma: post send on destroyed qp %d: %w", q.num, rdma.ErrClosed)
	}
	if q.state < rdma.QPStateRTS {
		q.mu.Unlock()
		return fmt.Errorf("rdma: post send on qp %d in state %v: %w", q.num, q.state, rdma.ErrInvalidState)
	}
	if q.sqTail-q.sqHead+uint64(len(wrs)) > uint64(len(q.sq)) {
		q.mu.Unlock()
		return fmt.Errorf("rdma: post send: %d requests, %d free: %w", len(wrs), uint64(len(q.sq))-(q.sqTail-q.sqHead), rdma.ErrQueueFull)
	}
	for i := range wrs {
		wr := &wrs[i]
		status := rdma.WCSuccess
		if q.shm != nil && q.sqHead == q.sqTail && q.state == rdma.QPStateRTS &&
			(wr.Opcode == rdma.OpRDMARead || wr.Opcode == rdma.OpRDMAWrite) {
			var done bool
			if done, status = q.direct(wr); done {
				continue
			}
		}
		s := &q.sq[q.sqTail%uint64(len(q.sq))]
		q.fillSlot(s, wr)
		if status != rdma.WCSuccess && s.localErr == rdma.WCSuccess {
			s.releaseRegions()
			s.localErr = status
		}
		q.sqTail++
	}
	if q.tornDown {
		q.flushSendLocked()
		q.mu.Unlock()
		return nil
	}
	q.mu.Unlock()
	q.flush()
	return nil
}

func (q *queuePair) validate(wr *rdma.SendWR) error {
	switch wr.Opcode {
	case rdma.OpSend, rdma.OpSendWithImm, rdma.OpRDMAWrite, rdma.OpRDMAWriteWithImm, rdma.OpRDMARead:
	default:
		return fmt.Errorf("opcode %v: %w", wr.Opcode, rdma.ErrInvalidWR)
	}
	if len(wr.SGL) > q.attr.MaxSGE {
		return fmt.Errorf("%d SGEs, max %d: %w", len(wr.SGL), q.attr.MaxSGE, rdma.ErrInvalidWR)
	}
	if wr.Flags&rdma.SendInline != 0 {
		return fmt.Errorf("inline data: max_inline_data is 0: %w", rdma.ErrInvalidWR)
	}
	var total uint64
	for _, s := range wr.SGL {
		total += uint64(s.Length)
	}
	if total > maxMessage {
		return fmt.Errorf("%d bytes over max_msg_sz %d: %w", total, maxMessage, rdma.ErrInvalidWR)
	}
	return nil
}

// fillSlot copies wr into s and resolves its local SGEs; a bad SGE is recorded as
// the slot's local error, reported when the slot reaches the head of the queue.
func (q *queuePair) fillSlot(s *sendSlot, wr *rdma.SendWR) {
	*s = sendSlot{
		id: wr.ID, op: wr.Opcode, imm: wr.Imm, raddr: wr.RemoteAddr, rkey: wr.RKey,
		signaled: wr.Flags&rdma.SendSignaled != 0 || q.attr.SignalAll,
		fence:    wr.Flags&rdma.SendFence != 0,
		psn:      q.nextPSN, localMem: s.localMem,
	}
	q.nextPSN++
	s.length = uint32(s.resolve(q.pd, wr.SGL, wr.Opcode == rdma.OpRDMARead)) // at most maxMessage (validate)
}

// PostRecv implements rdma.QueuePair.
func (q *queuePair) PostRecv(wrs []rdma.RecvWR) error {
	for i := range wrs {
		if len(wrs[i].SGL) > q.attr.MaxSGE {
			return fmt.Errorf("rdma: post recv: request %d: %d SGEs, max %d: %w", i, len(wrs[i].SGL), q.attr.MaxSGE, rdma.ErrInvalidWR)
		}
	}
	q.mu.Lock()
	if q.destroyed {
		q.mu.Unlock()
		return fmt.Errorf("rdma: post recv on destroyed qp %d: %w", q.num, rdma.ErrClosed)
	}
	if q.rqTail-q.rqHead+uint64(len(wrs)) > uint64(len(q.rq)) {
		q.mu.Unlock()
		return fmt.Errorf("rdma: post recv: %d requests, %d free: %w", len(wrs), uint64(len(q.rq))-(q.rqTail-q.rqHead), rdma.ErrQueueFull)
	}
	for i := range wrs {
		s := &q.rq[q.rqTail%uint64(len(q.rq))]
		*s = recvSlot{id: wrs[i].ID, localMem: s.localMem}
		s.capacity = s.resolve(q.pd, wrs[i].SGL, true)
		q.rqTail++
	}
	if q.tornDown {
		q.flushRecvLocked()
	}
	q.mu.Unlock()
	select {
	case q.rqPosted <- struct{}{}:
	default:
	}
	return nil
}

// completeSendLocked completes the slot at the head of the send queue.
func (q *queuePair) completeSendLocked(status rdma.WCStatus, byteLen uint32) {
	s := &q.sq[q.sqHead%uint64(len(q.sq))]
	s.releaseRegions()
	if s.op == rdma.OpRDMARead && q.sqHead < q.sqNext {
		q.readsInFlight--
		if q.readsInFlight == 0 && q.sqNext < q.sqTail && q.sq[q.sqNext%uint64(len(q.sq))].fence {
			// A fenced request was waiting for the reads. (Other requests
			// queued but not written yet are their poster's to flush:
			// kicking the writer for them woke it for nothing.)
			q.kickWriter()
		}
	}
	if status != rdma.WCSuccess || s.signaled {
		q.pushLocked(q.sendCQ, rdma.WorkCompletion{ID: s.id, Status: status, Opcode: s.op.CompletionOpcode(), ByteLen: byteLen, QPNum: q.num})
	}
	q.sqHead++
	if q.sqNext < q.sqHead {
		q.sqNext = q.sqHead
	}
}

// checkLocalErrLocked fails the queue pair when the head of the send queue is a
// request whose local SGEs were bad: every request before it has completed.
func (q *queuePair) checkLocalErrLocked() {
	if q.sqHead < q.sqTail && q.sqHead == q.sqNext {
		if st := q.sq[q.sqHead%uint64(len(q.sq))].localErr; st != rdma.WCSuccess {
			q.failLocked(st)
		}
	}
}

// ackThroughLocked completes the in-flight requests up to and including psn,
// which must all be SENDs or RDMA_WRITEs. It reports false for an ACK that no
// in-flight request explains.
func (q *queuePair) ackThroughLocked(psn uint32) bool {
	for q.sqHead < q.sqNext {
		s := &q.sq[q.sqHead%uint64(len(q.sq))]
		d := int32(psn - s.psn)
		if d < 0 || s.op == rdma.OpRDMARead {
			return false
		}
		q.completeSendLocked(rdma.WCSuccess, s.length)
		if d == 0 {
			return true
		}
	}
	return false
}

// ackBeforeLocked completes the in-flight requests before psn, which a response to
// psn acknowledges, and reports whether request psn is then at the head.
func (q *queuePair) ackBeforeLocked(psn uint32) bool {
	for q.sqHead < q.sqNext {
		s := &q.sq[q.sqHead%uint64(len(q.sq))]
		if s.psn == psn {
			return true
		}
		if int32(psn-s.psn) < 0 || s.op == rdma.OpRDMARead {
			return false
		}
		q.completeSendLocked(rdma.WCSuccess, s.length)
	}
	return false
}

// fail moves the queue pair to ERR: the connection is closed and, once the engine's
// goroutines have stopped touching memory, outstanding requests complete — the
// head one with status, the rest with WR_FLUSH_ERR.
func (q *queuePair) fail(status rdma.WCStatus) {
	q.mu.Lock()
	q.failLocked(status)
	q.mu.Unlock()
}

func (q *queuePair) failLocked(status rdma.WCStatus) {
	if q.state == rdma.QPStateErr {
		return
	}
	connected := q.state == rdma.QPStateRTS
	q.state = rdma.QPStateErr
	q.failStatus = status
	q.closeOnce.Do(func() { close(q.disconnected) })
	if connected {
		q.shutdownConn()
		q.kickWriter()
	} else {
		q.teardownLocked()
	}
}

// exit is called by the reader and the writer as they stop; the last one tears the
// queue pair down.
func (q *queuePair) exit() {
	if q.running.Add(-1) == 0 {
		q.w.mu.Lock()
		q.releaseWriteState()
		q.mu.Lock()
		q.teardownLocked()
		q.mu.Unlock()
		q.w.mu.Unlock()
		if q.w.fd >= 0 {
			unix.Close(q.w.fd)
		} else {
			q.conn.Close()
		}
	}
}

// shutdownConn ends both directions of the connection: the peer sees the end
// of the stream, and this queue pair's reader and writer wake and stop (the
// last of them closes the connection in exit). Closing it here instead would
// wait, under the caller's locks, for the reader to leave its read callback,
// where it may be delivering completions to a handler that needs those locks.
func (q *queuePair) shutdownConn() {
	if q.w.fd >= 0 {
		unix.Shutdown(q.w.fd, unix.SHUT_RDWR)
		return
	}
	q.w.raw.Control(func(fd uintptr) { unix.Shutdown(int(fd), unix.SHUT_RDWR) })
}

func (q *queuePair) teardownLocked() {
	if q.tornDown {
		return
	}
	q.tornDown = true
	for i := range q.out {
		if q.out[i].region != nil {
			q.out[i].region.Release()
		}
		q.out[i] = outItem{}
	}
	q.out = q.out[:0]
	if q.sqHead < q.sqTail {
		st := q.failStatus
		if s := &q.sq[q.sqHead%uint64(len(q.sq))]; s.localErr != rdma.WCSuccess {
			st = s.localErr
		}
		if st == rdma.WCSuccess {
			st = rdma.WCWRFlushErr
		}
		q.completeSendLocked(st, 0)
	}
	q.flushSendLocked()
	q.flushRecvLocked()
	q.releaseGrantsLocked()
	close(q.done)
}

func (q *queuePair) flushSendLocked() {
	for q.sqHead < q.sqTail {
		q.completeSendLocked(rdma.WCWRFlushErr, 0)
	}
}

func (q *queuePair) flushRecvLocked() {
	for q.rqHead < q.rqTail {
		q.completeRecvLocked(rdma.WCWRFlushErr, rdma.WCRecv, 0, 0, false)
	}
}

// completeRecvLocked completes the receive at the head of the receive queue.
func (q *queuePair) completeRecvLocked(status rdma.WCStatus, op rdma.WCOpcode, byteLen, imm uint32, withImm bool) {
	s := &q.rq[q.rqHead%uint64(len(q.rq))]
	s.releaseRegions()
	wc := rdma.WorkCompletion{ID: s.id, Status: status, Opcode: op, ByteLen: byteLen, Imm: imm, QPNum: q.num}
	if withImm {
		wc.Flags = rdma.WCWithImm
	}
	q.rqHead++
	q.pushLocked(q.recvCQ, wc)
}

// pushLocked queues a completion, waking a waiter unless the reader goroutine
// is completing (q.quiet) and will notify before it waits.
func (q *queuePair) pushLocked(cq *soft.CQ, wc rdma.WorkCompletion) {
	if q.quiet {
		cq.Add(wc)
	} else {
		cq.Push(wc)
	}
}

// notifyCQs wakes the waiters of completions the reader added quietly.
func (q *queuePair) notifyCQs() {
	q.sendCQ.Notify()
	if q.recvCQ != q.sendCQ {
		q.recvCQ.Notify()
	}
}

// lockReader and unlockReader take q.mu for the reader goroutine: completions
// made meanwhile are added quietly.
func (q *queuePair) lockReader() {
	q.mu.Lock()
	q.quiet = true
}

func (q *queuePair) unlockReader() {
	q.quiet = false
	q.mu.Unlock()
}

// watchdog fails the queue pair with RETRY_EXC_ERR when requests are outstanding
// and the peer has sent nothing for RetryTimeout.
func (q *queuePair) watchdog() {
	tick := max(q.attr.RetryTimeout/4, 5*time.Millisecond)
	t := time.NewTicker(tick)
	defer t.Stop()
	last := q.progress.Load()
	silent := time.Duration(0)
	for {
		select {
		case <-q.disconnected:
			return
		case <-t.C:
		}
		q.mu.Lock()
		outstanding := q.sqHead < q.sqNext
		q.mu.Unlock()
		if p := q.progress.Load(); p != last || !outstanding {
			last, silent = p, 0
			continue
		}
		silent += tick
		if silent >= q.attr.RetryTimeout {
			q.fail(rdma.WCRetryExcErr)
			return
		}
	}
}

// Close implements rdma.QueuePair.
func (q *queuePair) Close() error {
	q.mu.Lock()
	connected := q.state == rdma.QPStateRTS
	if connected {
		q.out = append(q.out, outItem{op: opDisconnect, closeAfter: true})
	}
	q.mu.Unlock()
	if connected {
		q.kickWriter()
		select {
		case <-q.done:
		case <-time.After(time.Second):
		}
	}
	q.fail(rdma.WCWRFlushErr)
	<-q.done
	q.mu.Lock()
	first := !q.destroyed
	q.destroyed = true
	q.mu.Unlock()
	if first {
		q.pd.Released()
	}
	return nil
}

// BindMW implements rdma.QueuePair.
func (q *queuePair) BindMW(mw rdma.MemoryWindow, mr rdma.MemoryRegion, addr, length uint64, access rdma.AccessFlags) (uint32, error) {
	w, ok := mw.(*soft.MW)
	if !ok {
		return 0, fmt.Errorf("rdma: bind mw: window of another transport: %w", rdma.ErrInvalidArgument)
	}
	return w.Bind(q, mr, addr, length, access)
}

// InvalidateMW implements rdma.QueuePair.
func (q *queuePair) InvalidateMW(mw rdma.MemoryWindow) error {
	w, ok := mw.(*soft.MW)
	if !ok {
		return fmt.Errorf("rdma: invalidate mw: window of another transport: %w", rdma.ErrInvalidArgument)
	}
	w.Invalidate()
	return nil
}
