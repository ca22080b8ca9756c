package stream

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// The wire protocol. A connection starts with a hello from the connecting side and
// a reply from the accepting side; after that both directions carry frames: a
// 32-byte header, then for SEND, RDMA_WRITE and READ_RESP frames the payload.
//
//	off size field
//	0   1    op
//	1   1    status (NAK: the verbs status the initiator's request completes with)
//	2   2    reserved, zero
//	4   4    length: payload bytes; for READ_REQ the bytes asked for
//	8   4    psn: the request's sequence number; responses carry the request's
//	12  4    rkey
//	16  8    remote address
//	24  4    immediate data
//	28  4    reserved, zero
//
// Requests (SEND*, WRITE*, READ_REQ) travel from initiator to target; responses
// (READ_RESP, ACK, NAK) back. A target handles requests in order, so responses come
// back in PSN order and an ACK or READ_RESP for psn p acknowledges every earlier one.
const headerSize = 32

const (
	opSend       = 1
	opSendImm    = 2
	opWrite      = 3
	opWriteImm   = 4
	opReadReq    = 5
	opReadResp   = 6
	opAck        = 7
	opNak        = 8
	opDisconnect = 9
	// Shared-memory connections only: the target tells the initiator it may
	// access a region directly (payload: grantSize bytes), asks it to stop, and
	// the initiator confirms it has.
	opGrant     = 10
	opRevoke    = 11
	opRevokeAck = 12
	opMax       = opRevokeAck
)

// grantSize is the payload of a GRANT: base, length and the base of the shared
// memory the region lies in, each a little-endian uint64. The header carries the
// rkey, and the access rights in imm.
const grantSize = 24

// maxMessage is the largest payload of one work request, as a verbs device's
// max_msg_sz (2 GiB).
const maxMessage = 1 << 31

// header is a decoded frame header.
type header struct {
	op     uint8
	status uint8
	length uint32
	psn    uint32
	rkey   uint32
	raddr  uint64
	imm    uint32
}

var errBadFrame = errors.New("rdma: malformed frame")

func (h *header) encode(b []byte) {
	_ = b[headerSize-1]
	b[0] = h.op
	b[1] = h.status
	b[2], b[3] = 0, 0
	binary.LittleEndian.PutUint32(b[4:], h.length)
	binary.LittleEndian.PutUint32(b[8:], h.psn)
	binary.LittleEndian.PutUint32(b[12:], h.rkey)
	binary.LittleEndian.PutUint64(b[16:], h.raddr)
	binary.LittleEndian.PutUint32(b[24:], h.imm)
	binary.LittleEndian.PutUint32(b[28:], 0)
}

// decode parses a header from b and checks it: a known op, zero reserved fields,
// a length within the limits, a status only on NAKs.
func (h *header) decode(b []byte) error {
	if len(b) < headerSize {
		return fmt.Errorf("%w: header of %d bytes", errBadFrame, len(b))
	}
	h.op = b[0]
	h.status = b[1]
	h.length = binary.LittleEndian.Uint32(b[4:])
	h.psn = binary.LittleEndian.Uint32(b[8:])
	h.rkey = binary.LittleEndian.Uint32(b[12:])
	h.raddr = binary.LittleEndian.Uint64(b[16:])
	h.imm = binary.LittleEndian.Uint32(b[24:])
	switch {
	case h.op == 0 || h.op > opMax:
		return fmt.Errorf("%w: unknown op %d", errBadFrame, h.op)
	case b[2] != 0 || b[3] != 0 || binary.LittleEndian.Uint32(b[28:]) != 0:
		return fmt.Errorf("%w: reserved bytes set", errBadFrame)
	case h.length > maxMessage:
		return fmt.Errorf("%w: length %d over %d", errBadFrame, h.length, maxMessage)
	case h.op == opNak && (h.status == 0 || h.status > 21):
		return fmt.Errorf("%w: NAK with status %d", errBadFrame, h.status)
	case h.op != opNak && h.status != 0:
		return fmt.Errorf("%w: status %d on op %d", errBadFrame, h.status, h.op)
	case (h.op == opAck || h.op == opNak || h.op == opDisconnect || h.op == opRevoke || h.op == opRevokeAck) && h.length != 0:
		return fmt.Errorf("%w: length %d on op %d", errBadFrame, h.length, h.op)
	case h.op == opGrant && h.length != grantSize:
		return fmt.Errorf("%w: grant of %d bytes", errBadFrame, h.length)
	}
	return nil
}

// The connection handshake.
//
//	hello (connecting side):  magic "RDTP" | version u16 | kind=1 u8 | 0 u8 | qpn u32 |
//	                          rnr timeout ms u32 | private data length u16 | private data
//	reply (accepting side):   magic "RDTP" | version u16 | kind=2 accept / 3 reject u8 |
//	                          0 u8 | qpn u32 | 0 u32 | private data length u16 | private data
const (
	helloMagic      = "RDTP"
	protocolVersion = 1
	kindHello       = 1
	kindAccept      = 2
	kindReject      = 3
	handshakeFixed  = 18
	maxPrivateData  = 196
)

// handshake is a decoded hello or reply.
type handshake struct {
	kind         uint8
	qpn          uint32
	rnrTimeoutMS uint32
	private      []byte
}

func (m *handshake) encode() []byte {
	b := make([]byte, handshakeFixed+len(m.private))
	copy(b, helloMagic)
	binary.LittleEndian.PutUint16(b[4:], protocolVersion)
	b[6] = m.kind
	binary.LittleEndian.PutUint32(b[8:], m.qpn)
	binary.LittleEndian.PutUint32(b[12:], m.rnrTimeoutMS)
	binary.LittleEndian.PutUint16(b[16:], uint16(len(m.private)))
	copy(b[handshakeFixed:], m.private)
	return b
}

// decodeHandshakeFixed parses the fixed part of a hello or reply and returns the
// length of the private data that follows.
func (m *handshake) decodeFixed(b []byte) (int, error) {
	if len(b) < handshakeFixed {
		return 0, fmt.Errorf("%w: handshake of %d bytes", errBadFrame, len(b))
	}
	if string(b[:4]) != helloMagic {
		return 0, fmt.Errorf("%w: not an rdma-over-tcp peer (magic %q)", errBadFrame, b[:4])
	}
	if v := binary.LittleEndian.Uint16(b[4:]); v != protocolVersion {
		return 0, fmt.Errorf("%w: protocol version %d, want %d", errBadFrame, v, protocolVersion)
	}
	m.kind = b[6]
	if m.kind < kindHello || m.kind > kindReject || b[7] != 0 {
		return 0, fmt.Errorf("%w: handshake kind %d", errBadFrame, m.kind)
	}
	m.qpn = binary.LittleEndian.Uint32(b[8:])
	m.rnrTimeoutMS = binary.LittleEndian.Uint32(b[12:])
	n := int(binary.LittleEndian.Uint16(b[16:]))
	if n > maxPrivateData {
		return 0, fmt.Errorf("%w: %d bytes of private data", errBadFrame, n)
	}
	return n, nil
}

// decodeHandshake parses a whole hello or reply held in b.
func decodeHandshake(b []byte) (handshake, error) {
	var m handshake
	n, err := m.decodeFixed(b)
	if err != nil {
		return m, err
	}
	if len(b) != handshakeFixed+n {
		return m, fmt.Errorf("%w: handshake of %d bytes, header says %d", errBadFrame, len(b), handshakeFixed+n)
	}
	m.private = append([]byte(nil), b[handshakeFixed:]...)
	return m, nil
}
