package stream

import (
	"time"

	"github.com/rdmafs/rdmafs/rdma"
)

// maxBatch bounds the requests one batch takes from the send queue.
const maxBatch = 256

// The socket is written by whoever holds q.w.mu: the goroutine posting requests,
// the reader answering them, or the writer goroutine. The first two only try the
// lock and write without blocking (one non-blocking writev), or leave the writing
// to the goroutine holding the lock; what the socket does not take at once is left
// in q.w.iov for the writer goroutine, the only one that waits for the socket. So
// PostSend never blocks, and the reader can never be stuck writing to a peer whose
// reader is stuck writing to us.

// flush writes what is queued if the socket lock is free, without blocking, and
// hands whatever remains to the writer goroutine. When another goroutine holds
// the lock, flush leaves the writing to it: every holder looks for a flush
// wanted after it lets go of the lock (tryFlush). Kicking the writer goroutine
// instead cost two goroutine wake-ups (the kick, then the lock) that mostly
// found the holder had written everything already: in a 4 KiB random-read load
// they were half of the mount's blocking on locks.
func (q *queuePair) flush() {
	q.w.flushWanted.Store(true)
	q.tryFlush()
}

// tryFlush writes what is queued, as flush, if a flush is wanted. A goroutine
// that held q.w.mu calls it after unlocking: a flush that found the lock taken
// (before this goroutine unlocked) stored flushWanted first, and this load
// sees it.
func (q *queuePair) tryFlush() {
	for q.w.flushWanted.Load() && q.w.mu.TryLock() {
		q.w.flushWanted.Store(false)
		done := q.push(false)
		q.w.mu.Unlock()
		if !done {
			q.kickWriter()
			return
		}
	}
}

// writeLoop writes, blocking as long as the socket needs, whatever the
// non-blocking writers could not.
func (q *queuePair) writeLoop() {
	defer q.exit()
	for {
		select {
		case <-q.kick:
		case <-q.disconnected:
			return
		}
		q.w.mu.Lock()
		q.push(true)
		q.w.mu.Unlock()
		q.tryFlush()
		if q.State() != rdma.QPStateRTS {
			return
		}
	}
}

// push writes the unfinished batch, then new batches built from the send queue and
// the responses, until nothing is queued (true) or, when !blocking, the socket would
// block (false). The caller holds q.w.mu.
func (q *queuePair) push(blocking bool) bool {
	if q.w.broken {
		return true
	}
	for {
		if len(q.w.iov) == 0 && !q.buildBatch() {
			return true
		}
		var err error
		switch {
		case blocking && q.w.fd < 0:
			q.w.bufs = q.w.iov
			_, err = q.w.bufs.WriteTo(q.conn)
			q.w.iov = q.w.iov[:0]
		case blocking:
			for len(q.w.iov) > 0 && err == nil {
				var n int
				n, err = q.w.writevOnce(true)
				q.w.iov = trimIOV(q.w.iov, n)
			}
		default:
			var n int
			n, err = q.w.writevOnce(false)
			q.w.iov = trimIOV(q.w.iov, n)
		}
		if err != nil {
			q.writeFailed()
			return true
		}
		if len(q.w.iov) > 0 {
			return false
		}
		closeAfter := q.finishBatch()
		if closeAfter {
			q.fail(rdma.WCWRFlushErr)
			return true
		}
	}
}

// writeErrGrace is how long a queue pair whose socket refused a write waits
// for its reader to report why before it fails with RETRY_EXC_ERR.
const writeErrGrace = 100 * time.Millisecond

// writeFailed handles a socket that refused a write: nothing more is written.
// The peer may have closed after a NAK that the reader has yet to read, and
// that NAK's status is the one to report; the reader also sees the end of the
// stream. Only if neither fails the queue pair soon does it fail with
// RETRY_EXC_ERR. The caller holds q.w.mu.
func (q *queuePair) writeFailed() {
	q.w.broken = true
	q.w.iov = q.w.iov[:0]
	q.finishBatch()
	time.AfterFunc(min(writeErrGrace, q.attr.RetryTimeout), func() { q.fail(rdma.WCRetryExcErr) })
}

// buildBatch moves the send queue's waiting requests and the queued responses
// into q.w.iov, and reports whether there is anything to write.
func (q *queuePair) buildBatch() bool {
	q.mu.Lock()
	if q.state != rdma.QPStateRTS {
		q.mu.Unlock()
		return false
	}
	first := q.sqNext
	for q.sqNext < q.sqTail && q.sqNext-first < maxBatch {
		s := &q.sq[q.sqNext%uint64(len(q.sq))]
		if s.localErr != rdma.WCSuccess || (s.fence && q.readsInFlight > 0) {
			break
		}
		if s.op == rdma.OpRDMARead {
			q.readsInFlight++
		}
		q.sqNext++
	}
	last := q.sqNext
	q.w.items, q.out = q.out, q.w.items[:0]
	q.checkLocalErrLocked()
	// The slots are read under q.mu: once on the wire, their ACK can arrive
	// and be handled (completeSendLocked clears them) before this goroutine
	// takes the lock again, and only the lock orders the two for the memory
	// model.
	defer q.mu.Unlock()
	if first == last && len(q.w.items) == 0 {
		return false
	}
	// Start from the full backing arrays: writing trims q.w.iov from the front.
	hdrs, iov := q.w.hdrs[:0], q.w.iovBase[:0]
	var h header
	for i := first; i < last; i++ {
		s := &q.sq[i%uint64(len(q.sq))]
		h = header{length: s.length, psn: s.psn, rkey: s.rkey, raddr: s.raddr, imm: s.imm}
		switch s.op {
		case rdma.OpSend:
			h.op = opSend
		case rdma.OpSendWithImm:
			h.op = opSendImm
		case rdma.OpRDMAWrite:
			h.op = opWrite
		case rdma.OpRDMAWriteWithImm:
			h.op = opWriteImm
		case rdma.OpRDMARead:
			h.op = opReadReq
		}
		hdrs, iov = appendHeader(hdrs, iov, &h)
		if h.op != opReadReq {
			iov = append(iov, s.segs...)
		}
	}
	for i := range q.w.items {
		it := &q.w.items[i]
		h = header{op: it.op, status: it.status, psn: it.psn, rkey: it.rkey, imm: it.imm, length: uint32(len(it.payload))}
		hdrs, iov = appendHeader(hdrs, iov, &h)
		if len(it.payload) > 0 {
			iov = append(iov, it.payload)
		}
	}
	q.w.hdrs, q.w.iov, q.w.iovBase = hdrs, iov, iov
	return true
}

// finishBatch releases the memory the written batch's responses held and reports
// whether one of them ends the connection.
func (q *queuePair) finishBatch() bool {
	closeAfter := false
	for i := range q.w.items {
		if q.w.items[i].region != nil {
			q.w.items[i].region.Release()
		}
		closeAfter = closeAfter || q.w.items[i].closeAfter
		q.w.items[i] = outItem{}
	}
	q.w.items = q.w.items[:0]
	return closeAfter
}

// releaseWriteState frees what an unfinished batch held; the queue pair is being
// torn down and nobody writes any more. The caller holds q.w.mu.
func (q *queuePair) releaseWriteState() {
	q.w.iov = q.w.iov[:0]
	q.finishBatch()
}

// trimIOV drops the first n bytes of iov.
func trimIOV(iov [][]byte, n int) [][]byte {
	for n > 0 && len(iov) > 0 {
		if n >= len(iov[0]) {
			n -= len(iov[0])
			iov = iov[1:]
			continue
		}
		iov[0] = iov[0][n:]
		n = 0
	}
	for len(iov) > 0 && len(iov[0]) == 0 {
		iov = iov[1:]
	}
	return iov
}

// appendHeader encodes h at the end of hdrs and adds it to iov. When hdrs is full
// a bigger arena replaces it; the old one stays alive through the iov entries that
// point into it until the batch is written.
func appendHeader(hdrs []byte, iov [][]byte, h *header) ([]byte, [][]byte) {
	n := len(hdrs)
	if n+headerSize > cap(hdrs) {
		hdrs = make([]byte, 0, max(2*cap(hdrs), maxBatch*headerSize))
		n = 0
	}
	hdrs = hdrs[:n+headerSize]
	h.encode(hdrs[n:])
	return hdrs, append(iov, hdrs[n:n+headerSize])
}

// respond queues a response; the reader flushes responses before it waits for
// more input, so several go out in one write.
func (q *queuePair) respond(it outItem) {
	q.mu.Lock()
	if q.state != rdma.QPStateRTS {
		q.mu.Unlock()
		if it.region != nil {
			it.region.Release()
		}
		return
	}
	q.out = append(q.out, it)
	q.mu.Unlock()
}

// readLoop handles every frame that arrives: requests as the target, responses as
// the initiator. As the target it coalesces acknowledgements: one ACK covers every
// SEND and RDMA_WRITE handled since the last response, sent when no more input is
// buffered.
func (q *queuePair) readLoop(rd *frameReader) {
	defer q.exit()
	defer q.notifyCQs()
	var (
		h          header
		ackPending bool
		ackPSN     uint32
	)
	for {
		if rd.buffered() < headerSize {
			// About to wait for input: send the coalesced ACK and every queued
			// response now.
			if ackPending {
				q.respond(outItem{op: opAck, psn: ackPSN})
				ackPending = false
			}
			q.flush()
		}
		b, err := rd.header()
		if err != nil {
			q.fail(rdma.WCRetryExcErr)
			return
		}
		if err := h.decode(b); err != nil {
			q.fail(rdma.WCBadRespErr)
			return
		}
		var ok bool
		switch h.op {
		case opSend, opSendImm:
			ok = q.serveSend(rd, &h)
			ackPending, ackPSN = true, h.psn
		case opWrite, opWriteImm:
			ok = q.serveWrite(rd, &h)
			ackPending, ackPSN = true, h.psn
		case opReadReq:
			ok = q.serveRead(&h)
			ackPending = false
		case opReadResp:
			ok = q.readResponse(rd, &h)
		case opAck:
			q.lockReader()
			ok = q.ackThroughLocked(h.psn)
			q.checkLocalErrLocked()
			q.unlockReader()
			if !ok {
				q.fail(rdma.WCBadRespErr)
			}
		case opNak:
			q.lockReader()
			if q.ackBeforeLocked(h.psn) {
				q.failLocked(rdma.WCStatus(h.status))
			} else {
				q.failLocked(rdma.WCBadRespErr)
			}
			q.unlockReader()
			return
		case opGrant:
			ok = q.acceptGrant(rd, &h)
		case opRevoke:
			q.dropGrant(h.rkey)
			ok = true
		case opRevokeAck:
			q.revoked(h.rkey)
			ok = true
		case opDisconnect:
			q.fail(rdma.WCWRFlushErr)
			return
		}
		if !ok {
			return
		}
	}
}

// nak answers the request psn with a verbs error status and ends the connection
// once the NAK is on the wire, as an iWARP TERMINATE does.
func (q *queuePair) nak(psn uint32, status rdma.WCStatus) {
	q.respond(outItem{op: opNak, status: uint8(status), psn: psn, closeAfter: true})
	q.flush()
}

// waitRecv returns once a receive is posted, or false after the peer's RNR timeout
// or when the queue pair leaves RTS.
func (q *queuePair) waitRecv() bool {
	var timer *time.Timer
	for {
		q.mu.Lock()
		posted := q.rqHead < q.rqTail
		rnr := q.peerRNR
		q.mu.Unlock()
		if posted {
			if timer != nil {
				timer.Stop()
			}
			return true
		}
		if timer == nil {
			q.notifyCQs() // the application may be waiting for completions to post receives
			timer = time.NewTimer(rnr)
		}
		select {
		case <-q.rqPosted:
		case <-timer.C:
			return false
		case <-q.disconnected:
			timer.Stop()
			return false
		}
	}
}

// serveSend places an incoming SEND into the next posted receive.
func (q *queuePair) serveSend(rd *frameReader, h *header) bool {
	if !q.waitRecv() {
		rd.discard(h.length)
		q.nak(h.psn, rdma.WCRNRRetryExcErr)
		return false
	}
	q.mu.Lock()
	s := &q.rq[q.rqHead%uint64(len(q.rq))]
	q.mu.Unlock()
	withImm := h.op == opSendImm
	if s.localErr != rdma.WCSuccess || uint64(h.length) > s.capacity {
		st, remote := rdma.WCLocLenErr, rdma.WCRemInvReqErr
		if s.localErr != rdma.WCSuccess {
			st, remote = s.localErr, rdma.WCRemOpErr
		}
		rd.discard(h.length)
		q.lockReader()
		q.completeRecvLocked(st, rdma.WCRecv, 0, 0, false)
		q.unlockReader()
		q.nak(h.psn, remote)
		return false
	}
	if err := rd.scatter(s.segs, h.length); err != nil {
		q.fail(rdma.WCRetryExcErr)
		return false
	}
	q.lockReader()
	q.completeRecvLocked(rdma.WCSuccess, rdma.WCRecv, h.length, h.imm, withImm)
	q.unlockReader()
	return true
}

// serveWrite executes an incoming RDMA_WRITE against the key table, reading the
// payload straight into the target region.
func (q *queuePair) serveWrite(rd *frameReader, h *header) bool {
	withImm := h.op == opWriteImm
	if withImm && !q.waitRecv() {
		rd.discard(h.length)
		q.nak(h.psn, rdma.WCRNRRetryExcErr)
		return false
	}
	if h.length > 0 {
		r, buf, st := q.pd.Keys.Remote(h.rkey, q.pd, q, h.raddr, h.length, rdma.AccessRemoteWrite)
		if st != rdma.WCSuccess {
			rd.discard(h.length)
			q.nak(h.psn, st)
			return false
		}
		err := rd.readInto(buf)
		q.grant(r)
		r.Release()
		if err != nil {
			q.fail(rdma.WCRetryExcErr)
			return false
		}
	}
	if withImm {
		q.lockReader()
		q.completeRecvLocked(rdma.WCSuccess, rdma.WCRecvRDMAWithImm, h.length, h.imm, true)
		q.unlockReader()
	}
	return true
}

// serveRead answers an incoming RDMA_READ from the key table; the writer sends the
// bytes straight from the registered region.
func (q *queuePair) serveRead(h *header) bool {
	if h.length == 0 {
		q.respond(outItem{op: opReadResp, psn: h.psn})
		return true
	}
	r, buf, st := q.pd.Keys.Remote(h.rkey, q.pd, q, h.raddr, h.length, rdma.AccessRemoteRead)
	if st != rdma.WCSuccess {
		q.nak(h.psn, st)
		return false
	}
	q.grant(r)
	q.respond(outItem{op: opReadResp, psn: h.psn, payload: buf, region: r})
	return true
}

// readResponse scatters an RDMA_READ response into the request's local SGEs.
func (q *queuePair) readResponse(rd *frameReader, h *header) bool {
	q.lockReader()
	ok := q.ackBeforeLocked(h.psn)
	var s *sendSlot
	if ok {
		s = &q.sq[q.sqHead%uint64(len(q.sq))]
		ok = s.op == rdma.OpRDMARead && s.length == h.length
	}
	q.unlockReader()
	if !ok {
		q.fail(rdma.WCBadRespErr)
		return false
	}
	if err := rd.scatter(s.segs, h.length); err != nil {
		q.fail(rdma.WCRetryExcErr)
		return false
	}
	q.lockReader()
	q.completeSendLocked(rdma.WCSuccess, h.length)
	q.checkLocalErrLocked()
	q.unlockReader()
	return true
}
