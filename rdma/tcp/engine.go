package tcp

import (
	"net"
	"time"

	"github.com/rdmafs/rdmafs/rdma"
)

// maxBatch bounds the frames one writev carries.
const maxBatch = 256

// writeLoop sends what the send queue and the responder have queued: all of it in
// one writev when it fits, so a batch of posted requests costs one system call.
func (q *queuePair) writeLoop() {
	defer q.exit()
	var (
		items []outItem
		hdrs  = make([]byte, 0, maxBatch*headerSize)
		iov   = make([][]byte, 0, 4*maxBatch)
		bufs  net.Buffers
		h     header
	)
	for {
		select {
		case <-q.kick:
		case <-q.disconnected:
			return
		}
		for {
			q.mu.Lock()
			if q.state != rdma.QPStateRTS {
				q.mu.Unlock()
				return
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
			items, q.out = q.out, items[:0]
			q.checkLocalErrLocked()
			conn := q.conn
			q.mu.Unlock()
			if first == last && len(items) == 0 {
				break
			}

			hdrs, iov = hdrs[:0], iov[:0]
			closeAfter := false
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
			for i := range items {
				it := &items[i]
				h = header{op: it.op, status: it.status, psn: it.psn, length: uint32(len(it.payload))}
				hdrs, iov = appendHeader(hdrs, iov, &h)
				if len(it.payload) > 0 {
					iov = append(iov, it.payload)
				}
				closeAfter = closeAfter || it.closeAfter
			}
			bufs = iov
			_, err := bufs.WriteTo(conn)
			for i := range items {
				if items[i].region != nil {
					items[i].region.Release()
				}
				items[i] = outItem{}
			}
			items = items[:0]
			if err != nil {
				q.fail(rdma.WCRetryExcErr)
				return
			}
			if closeAfter {
				q.fail(rdma.WCWRFlushErr)
				return
			}
		}
	}
}

// appendHeader encodes h at the end of hdrs and adds it to iov. hdrs has room for
// maxBatch headers per batch of requests and grows for responses beyond that.
func appendHeader(hdrs []byte, iov [][]byte, h *header) ([]byte, [][]byte) {
	n := len(hdrs)
	if n+headerSize > cap(hdrs) {
		// A new arena: the old one stays alive through the iov entries that point
		// into it until this batch is written.
		hdrs = make([]byte, 0, 2*cap(hdrs))
		n = 0
	}
	hdrs = hdrs[:n+headerSize]
	h.encode(hdrs[n:])
	return hdrs, append(iov, hdrs[n:n+headerSize])
}

// respond queues a response for the writer.
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
	q.kickWriter()
}

// readLoop handles every frame that arrives: requests as the target, responses as
// the initiator. As the target it coalesces acknowledgements: one ACK covers every
// SEND and RDMA_WRITE handled since the last response, sent when no more input is
// buffered.
func (q *queuePair) readLoop(rd *frameReader) {
	defer q.exit()
	var (
		h          header
		ackPending bool
		ackPSN     uint32
	)
	for {
		if ackPending && rd.buffered() < headerSize {
			q.respond(outItem{op: opAck, psn: ackPSN})
			ackPending = false
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
			q.mu.Lock()
			ok = q.ackThroughLocked(h.psn)
			q.checkLocalErrLocked()
			q.mu.Unlock()
			if !ok {
				q.fail(rdma.WCBadRespErr)
			}
		case opNak:
			q.mu.Lock()
			if q.ackBeforeLocked(h.psn) {
				q.failLocked(rdma.WCStatus(h.status))
			} else {
				q.failLocked(rdma.WCBadRespErr)
			}
			q.mu.Unlock()
			return
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
		q.mu.Lock()
		q.completeRecvLocked(st, rdma.WCRecv, 0, 0, false)
		q.mu.Unlock()
		q.nak(h.psn, remote)
		return false
	}
	if err := rd.scatter(s.segs, h.length); err != nil {
		q.fail(rdma.WCRetryExcErr)
		return false
	}
	q.mu.Lock()
	q.completeRecvLocked(rdma.WCSuccess, rdma.WCRecv, h.length, h.imm, withImm)
	q.mu.Unlock()
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
		r.Release()
		if err != nil {
			q.fail(rdma.WCRetryExcErr)
			return false
		}
	}
	if withImm {
		q.mu.Lock()
		q.completeRecvLocked(rdma.WCSuccess, rdma.WCRecvRDMAWithImm, h.length, h.imm, true)
		q.mu.Unlock()
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
	q.respond(outItem{op: opReadResp, psn: h.psn, payload: buf, region: r})
	return true
}

// readResponse scatters an RDMA_READ response into the request's local SGEs.
func (q *queuePair) readResponse(rd *frameReader, h *header) bool {
	q.mu.Lock()
	ok := q.ackBeforeLocked(h.psn)
	var s *sendSlot
	if ok {
		s = &q.sq[q.sqHead%uint64(len(q.sq))]
		ok = s.op == rdma.OpRDMARead && s.length == h.length
	}
	q.mu.Unlock()
	if !ok {
		q.fail(rdma.WCBadRespErr)
		return false
	}
	if err := rd.scatter(s.segs, h.length); err != nil {
		q.fail(rdma.WCRetryExcErr)
		return false
	}
	q.mu.Lock()
	q.completeSendLocked(rdma.WCSuccess, h.length)
	q.checkLocalErrLocked()
	q.mu.Unlock()
	return true
}
