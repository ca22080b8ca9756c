// Package proto defines the chunk protocol's wire format: the control messages a
// client and chunkd exchange as SEND/RECV on their queue pair, and the private data
// of connection setup. Chunk bytes never travel in these messages: they move with
// one-sided RDMA_READ / RDMA_WRITE against the regions the replies grant.
//
// A message is a 16-byte header followed by a batch of fixed-size items:
//
//	header:  magic u16 | version u8 | kind u8 | count u16 | reserved u16 | request id u64
//	request: op u8 | flags u8 | slab u16 | length u32 | chunk u64 | version u64 | arg u64   (32 bytes)
//	reply:   op u8 | reserved u8 | status u16 | length u32 | arg u64 | addr u64 | rkey u32 | crc u32 | ttl ms u32 | n u32 (40 bytes)
//
// arg is the lease id (RenewLease, ReleaseLease, and the ReadLease reply), the
// CRC32C (Commit) or the base version a new version derives from (PreparePatch,
// PatchSlab, Clone). slab is the offset of a PatchSlab's patch in the
// connection's slab, in units of SlabAlign; 0 in every other request. A List reply is followed by n entries of version u64 | length u32 | crc
// u32. All integers are little endian. The replies of a batch come in the order of
// its requests, in one message that carries the request's id.
//
// A patch (the bytes a client stages after PreparePatch) describes a new version
// as byte ranges to overwrite in a copy of its base version:
//
//	count u32 | reserved u32 (0) | count × (off u32 | len u32) | data
//
// where data is the ranges' bytes back to back in table order. The ranges are
// sorted by offset, do not overlap, are not empty and lie inside the base
// version; the new version has exactly the base version's length.
//
// A patch that fits the connection's slab (OpSlab: a region chunkd grants the
// connection once, for its lifetime) costs one round trip instead of two: the
// client RDMA_WRITEs it into a part of the slab it is not using for another
// patch and sends OpPatchSlab and OpCommit in one message.
package proto

import (
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"
)

// Magic starts every message.
const Magic uint16 = 0xC3D4

// Version is the protocol version this package speaks.
const Version uint8 = 1

// Sizes of the encoded parts.
const (
	HeaderLen    = 16
	RequestLen   = 32
	ReplyLen     = 40
	ListEntryLen = 16
)

// Kind tells requests from replies.
type Kind uint8

// Message kinds.
const (
	KindRequest Kind = 1
	KindReply   Kind = 2
)

// Op is a request operation.
type Op uint8

// Operations.
const (
	// OpReadLease asks for a read lease on (Chunk, Version): the reply grants
	// {Addr, RKey, Length, CRC, TTL} and a LeaseID. Asking again for a version the
	// connection holds renews and returns the same lease.
	OpReadLease Op = 1
	// OpRenewLease extends lease LeaseID by the lease time.
	OpRenewLease Op = 2
	// OpReleaseLease ends lease LeaseID now; its rkey is revoked.
	OpReleaseLease Op = 3
	// OpPrepareWrite reserves a staging region of Length bytes for a new
	// (Chunk, Version): the reply grants {Addr, RKey, Length, TTL}.
	OpPrepareWrite Op = 4
	// OpCommit verifies CRC over the staged bytes of (Chunk, Version), makes them
	// durable and answers once they are.
	OpCommit Op = 5
	// OpAbort drops the staging of (Chunk, Version).
	OpAbort Op = 6
	// OpDelete deletes the stored (Chunk, Version).
	OpDelete Op = 7
	// OpStat returns the Length and CRC of a stored (Chunk, Version).
	OpStat Op = 8
	// OpList returns the stored versions of Chunk.
	OpList Op = 9
	// OpPreparePatch reserves a staging region of Length bytes for a patch (see
	// the package documentation) that derives the new (Chunk, Version) from the
	// stored (Chunk, Base): the reply grants {Addr, RKey, Length, TTL} as for
	// OpPrepareWrite. The client RDMA_WRITEs the patch and sends OpCommit with
	// the CRC32C of the staged patch bytes; the commit's reply carries the
	// Length and CRC of the new version.
	OpPreparePatch Op = 10
	// OpClone stores (Chunk, Version) as an exact copy of the stored (Chunk,
	// Base) and answers {Length, CRC} of the new version once it is durable.
	OpClone Op = 11
	// OpAuthorize presents, on a mount token's connection, the capability
	// meta gave the token for Chunk (AuthorizeRequest): the connection may
	// then read the chunk, and write it if the capability says so. A
	// token's connection is refused every other request on a chunk it has
	// not authorized (StatusNotAuthorized); other connections need none.
	OpAuthorize Op = 12
	// OpSlab asks for the connection's slab: {Addr, RKey, Length} of a region
	// the client may RDMA_WRITE patches into until the connection ends. Asking
	// again answers the same slab. Only sent to a chunkd whose AcceptData
	// offers one.
	OpSlab Op = 13
	// OpPatchSlab stages, as OpPreparePatch does, the patch of Length bytes
	// the client wrote at offset Slab of the connection's slab, which derives
	// (Chunk, Version) from (Chunk, Base). The bytes are copied when the
	// request is served: the OpCommit that follows it in the same message
	// verifies and stores them, and the client may reuse that part of the
	// slab once the reply has come.
	OpPatchSlab Op = 14

	// LastOp is the highest operation this package knows.
	LastOp = OpPatchSlab
)

// SlabAlign is the unit of a patch's offset in the slab and of the slab's size;
// MaxSlab is the largest slab a request can address.
const (
	SlabAlign = 4096
	MaxSlab   = 1 << 16 * SlabAlign
)

var opNames = [...]string{"", "ReadLease", "RenewLease", "ReleaseLease", "PrepareWrite", "Commit", "Abort", "Delete", "Stat", "List", "PreparePatch", "Clone", "Authorize", "Slab", "PatchSlab"}

func (o Op) String() string {
	if o > 0 && int(o) < len(opNames) {
		return opNames[o]
	}
	return fmt.Sprintf("Op(%d)", uint8(o))
}

// Valid reports whether o is a known operation.
func (o Op) Valid() bool { return o >= OpReadLease && o <= LastOp }

// AuthorizeRequest returns the OpAuthorize request presenting capability
// (datakey.CapabilitySize bytes) for chunk, for writing if write. The
// capability travels in the Version and Base fields, write in Length.
func AuthorizeRequest(chunk uint64, capability []byte, write bool) Request {
	r := Request{Op: OpAuthorize, Chunk: chunk}
	if len(capability) == 16 {
		r.Version = binary.LittleEndian.Uint64(capability[:8])
		r.Base = binary.LittleEndian.Uint64(capability[8:])
	}
	if write {
		r.Length = 1
	}
	return r
}

// Capability returns what an OpAuthorize request presents: the capability
// and whether it asks for writing.
func (r *Request) Capability() (capability [16]byte, write bool) {
	binary.LittleEndian.PutUint64(capability[:8], r.Version)
	binary.LittleEndian.PutUint64(capability[8:], r.Base)
	return capability, r.Length == 1
}

// Status is the result of one request.
type Status uint16

// Status codes.
const (
	StatusOK               Status = 0
	StatusUnknownChunk     Status = 1  // the chunk has no version here
	StatusWrongVersion     Status = 2  // the chunk exists but not in this version
	StatusTooLong          Status = 3  // length over the limit
	StatusNoPrepare        Status = 4  // commit or abort without a prepared write
	StatusChecksumMismatch Status = 5  // staged bytes do not match the commit's CRC
	StatusNoSpace          Status = 6  // ENOSPC: the disk or the configured capacity is full
	StatusLeaseExpired     Status = 7  // the lease or staging grant ended
	StatusNotAuthorized    Status = 8  // the connection may not do this
	StatusBusy             Status = 9  // out of credits, windows or memory: retry later
	StatusInvalid          Status = 10 // malformed request
	StatusExists           Status = 11 // the version is already stored (or being written)
	StatusIOError          Status = 12 // the disk failed or stored data is corrupt
	StatusShuttingDown     Status = 13 // chunkd is stopping
)

var statusText = [...]string{
	"ok", "unknown chunk", "wrong version", "length over the limit", "commit without prepare",
	"checksum mismatch", "no space left", "lease expired", "not authorized", "busy, retry later",
	"invalid request", "version exists", "i/o error", "shutting down",
}

func (s Status) String() string {
	if int(s) < len(statusText) {
		return statusText[s]
	}
	return fmt.Sprintf("status %d", uint16(s))
}

// Err returns nil for StatusOK and a *StatusError otherwise.
func (s Status) Err(op Op) error {
	if s == StatusOK {
		return nil
	}
	return &StatusError{Op: op, Status: s}
}

// StatusError is a request that chunkd answered with a status other than OK.
type StatusError struct {
	Op     Op
	Status Status
}

func (e *StatusError) Error() string { return fmt.Sprintf("chunkd %v: %v", e.Op, e.Status) }

// Is lets errors.Is(err, &StatusError{Status: s}) match on the status alone.
func (e *StatusError) Is(target error) bool {
	t, ok := target.(*StatusError)
	return ok && t.Status == e.Status && (t.Op == 0 || t.Op == e.Op)
}

// Unwrap returns the errno a status stands for, so that callers can test
// with errors.Is: syscall.ENOSPC for StatusNoSpace (the chunkserver cannot
// take the version: place it elsewhere, or report ENOSPC). Other statuses
// have none.
func (e *StatusError) Unwrap() error {
	if e.Status == StatusNoSpace {
		return syscall.ENOSPC
	}
	return nil
}

// IsStatus reports whether err is a StatusError with status s.
func IsStatus(err error, s Status) bool {
	var se *StatusError
	return errors.As(err, &se) && se.Status == s
}

// Request is one decoded request item.
type Request struct {
	Op      Op
	Chunk   uint64
	Version uint64
	Length  uint32 // PrepareWrite, PreparePatch, PatchSlab
	LeaseID uint64 // RenewLease, ReleaseLease
	CRC     uint32 // Commit
	// Base is the version the new one derives from (PreparePatch, PatchSlab,
	// Clone). It must be stored and 0 < Base < Version: chunkd answers
	// StatusInvalid otherwise (the decoder accepts any value).
	Base uint64
	// Slab is the offset of a PatchSlab's patch in the connection's slab, a
	// multiple of SlabAlign below MaxSlab (the encoder refuses others).
	Slab uint32
}

// VersionInfo is one entry of a List reply.
type VersionInfo struct {
	Version uint64
	Length  uint32
	CRC     uint32
}

// Reply is one decoded reply item.
type Reply struct {
	Op       Op
	Status   Status
	LeaseID  uint64 // ReadLease
	Addr     uint64 // ReadLease, PrepareWrite, PreparePatch, Slab: remote address of the granted region
	RKey     uint32 // ReadLease, PrepareWrite, PreparePatch, Slab: rkey of the granted region
	Length   uint32 // ReadLease, PrepareWrite, PreparePatch, Slab, Stat; Commit, Clone: the stored version's
	CRC      uint32 // ReadLease, Stat; Commit, Clone: the stored version's
	TTL      uint32 // ReadLease, RenewLease, PrepareWrite, PreparePatch: milliseconds the grant lasts
	Versions []VersionInfo
}

// Errors of the decoders.
var (
	ErrShort    = errors.New("proto: message truncated")
	ErrMagic    = errors.New("proto: bad magic")
	ErrVersion  = errors.New("proto: unsupported protocol version")
	ErrKind     = errors.New("proto: unexpected message kind")
	ErrOp       = errors.New("proto: unknown operation")
	ErrTooLarge = errors.New("proto: batch does not fit")
	ErrTrailing = errors.New("proto: trailing bytes")
)

// Header is a decoded message header.
type Header struct {
	Kind  Kind
	Count int
	ID    uint64
}

func putHeader(b []byte, kind Kind, count int, id uint64) {
	binary.LittleEndian.PutUint16(b[0:], Magic)
	b[2] = Version
	b[3] = byte(kind)
	binary.LittleEndian.PutUint16(b[4:], uint16(count))
	binary.LittleEndian.PutUint16(b[6:], 0)
	binary.LittleEndian.PutUint64(b[8:], id)
}

// DecodeHeader decodes and checks the header of a message.
func DecodeHeader(b []byte) (Header, error) {
	if len(b) < HeaderLen {
		return Header{}, ErrShort
	}
	if binary.LittleEndian.Uint16(b) != Magic {
		return Header{}, ErrMagic
	}
	if b[2] != Version {
		return Header{}, fmt.Errorf("%w %d", ErrVersion, b[2])
	}
	k := Kind(b[3])
	if k != KindRequest && k != KindReply {
		return Header{}, fmt.Errorf("%w %d", ErrKind, b[3])
	}
	return Header{Kind: k, Count: int(binary.LittleEndian.Uint16(b[4:])), ID: binary.LittleEndian.Uint64(b[8:])}, nil
}

// RequestsSize returns the encoded size of a batch of n requests.
func RequestsSize(n int) int { return HeaderLen + n*RequestLen }

// EncodeRequests encodes a batch of requests with id into b and returns the bytes
// used. It fails with ErrTooLarge when b is too small or the batch too long.
func EncodeRequests(b []byte, id uint64, reqs []Request) (int, error) {
	n := RequestsSize(len(reqs))
	if n > len(b) || len(reqs) > 0xffff {
		return 0, ErrTooLarge
	}
	putHeader(b, KindRequest, len(reqs), id)
	p := b[HeaderLen:]
	for i := range reqs {
		r := &reqs[i]
		q := p[i*RequestLen : (i+1)*RequestLen]
		q[0] = byte(r.Op)
		q[1] = 0
		var slab uint32
		if r.Op == OpPatchSlab {
			if r.Slab%SlabAlign != 0 || r.Slab >= MaxSlab {
				return 0, fmt.Errorf("proto: slab offset %d not a multiple of %d below %d", r.Slab, SlabAlign, MaxSlab)
			}
			slab = r.Slab / SlabAlign
		}
		binary.LittleEndian.PutUint16(q[2:], uint16(slab))
		binary.LittleEndian.PutUint32(q[4:], r.Length)
		binary.LittleEndian.PutUint64(q[8:], r.Chunk)
		binary.LittleEndian.PutUint64(q[16:], r.Version)
		var arg uint64
		switch r.Op {
		case OpRenewLease, OpReleaseLease:
			arg = r.LeaseID
		case OpCommit:
			arg = uint64(r.CRC)
		case OpPreparePatch, OpPatchSlab, OpClone, OpAuthorize:
			arg = r.Base
		}
		binary.LittleEndian.PutUint64(q[24:], arg)
	}
	return n, nil
}

// DecodeRequests decodes a request message into dst's backing array, which must
// have room for the batch (ErrTooLarge otherwise), and returns the message id and
// the requests. It does not allocate.
func DecodeRequests(b []byte, dst []Request) (uint64, []Request, error) {
	h, err := DecodeHeader(b)
	if err != nil {
		return 0, nil, err
	}
	if h.Kind != KindRequest {
		return 0, nil, fmt.Errorf("%w: reply where a request was expected", ErrKind)
	}
	if h.Count > cap(dst) {
		return h.ID, nil, fmt.Errorf("%w: %d requests, at most %d", ErrTooLarge, h.Count, cap(dst))
	}
	size := RequestsSize(h.Count)
	if len(b) < size {
		return h.ID, nil, ErrShort
	}
	if len(b) > size {
		return h.ID, nil, ErrTrailing
	}
	dst = dst[:h.Count]
	p := b[HeaderLen:]
	for i := range dst {
		q := p[i*RequestLen : (i+1)*RequestLen]
		op := Op(q[0])
		if !op.Valid() {
			return h.ID, nil, fmt.Errorf("%w %d in item %d", ErrOp, q[0], i)
		}
		arg := binary.LittleEndian.Uint64(q[24:])
		r := Request{
			Op:      op,
			Length:  binary.LittleEndian.Uint32(q[4:]),
			Chunk:   binary.LittleEndian.Uint64(q[8:]),
			Version: binary.LittleEndian.Uint64(q[16:]),
		}
		switch op {
		case OpRenewLease, OpReleaseLease:
			r.LeaseID = arg
		case OpCommit:
			if arg > 0xffffffff {
				return h.ID, nil, fmt.Errorf("proto: commit crc %#x out of range in item %d", arg, i)
			}
			r.CRC = uint32(arg)
		case OpPreparePatch, OpClone, OpAuthorize:
			r.Base = arg
		case OpPatchSlab:
			r.Base = arg
			r.Slab = uint32(binary.LittleEndian.Uint16(q[2:])) * SlabAlign
		}
		dst[i] = r
	}
	return h.ID, dst, nil
}

// ReplySize returns the encoded size of one reply item.
func ReplySize(r *Reply) int { return ReplyLen + len(r.Versions)*ListEntryLen }

// EncodeReplies encodes a batch of replies with id into b and returns the bytes
// used, or ErrTooLarge when they do not fit.
func EncodeReplies(b []byte, id uint64, reps []Reply) (int, error) {
	n := HeaderLen
	for i := range reps {
		n += ReplySize(&reps[i])
	}
	if n > len(b) || len(reps) > 0xffff {
		return 0, ErrTooLarge
	}
	putHeader(b, KindReply, len(reps), id)
	p := HeaderLen
	for i := range reps {
		r := &reps[i]
		q := b[p : p+ReplyLen]
		q[0] = byte(r.Op)
		q[1] = 0
		binary.LittleEndian.PutUint16(q[2:], uint16(r.Status))
		binary.LittleEndian.PutUint32(q[4:], r.Length)
		binary.LittleEndian.PutUint64(q[8:], r.LeaseID)
		binary.LittleEndian.PutUint64(q[16:], r.Addr)
		binary.LittleEndian.PutUint32(q[24:], r.RKey)
		binary.LittleEndian.PutUint32(q[28:], r.CRC)
		binary.LittleEndian.PutUint32(q[32:], r.TTL)
		binary.LittleEndian.PutUint32(q[36:], uint32(len(r.Versions)))
		p += ReplyLen
		for _, v := range r.Versions {
			binary.LittleEndian.PutUint64(b[p:], v.Version)
			binary.LittleEndian.PutUint32(b[p+8:], v.Length)
			binary.LittleEndian.PutUint32(b[p+12:], v.CRC)
			p += ListEntryLen
		}
	}
	return n, nil
}

// DecodeReplies decodes a reply message, appending the replies to dst[:0], and
// returns the message id and the replies. List entries are allocated.
func DecodeReplies(b []byte, dst []Reply) (uint64, []Reply, error) {
	h, err := DecodeHeader(b)
	if err != nil {
		return 0, nil, err
	}
	if h.Kind != KindReply {
		return 0, nil, fmt.Errorf("%w: request where a reply was expected", ErrKind)
	}
	if h.Count*ReplyLen > len(b)-HeaderLen {
		return h.ID, nil, ErrShort
	}
	dst = dst[:0]
	p := HeaderLen
	for i := 0; i < h.Count; i++ {
		if len(b)-p < ReplyLen {
			return h.ID, nil, ErrShort
		}
		q := b[p : p+ReplyLen]
		p += ReplyLen
		op := Op(q[0])
		if !op.Valid() {
			return h.ID, nil, fmt.Errorf("%w %d in reply %d", ErrOp, q[0], i)
		}
		r := Reply{
			Op:      op,
			Status:  Status(binary.LittleEndian.Uint16(q[2:])),
			Length:  binary.LittleEndian.Uint32(q[4:]),
			LeaseID: binary.LittleEndian.Uint64(q[8:]),
			Addr:    binary.LittleEndian.Uint64(q[16:]),
			RKey:    binary.LittleEndian.Uint32(q[24:]),
			CRC:     binary.LittleEndian.Uint32(q[28:]),
			TTL:     binary.LittleEndian.Uint32(q[32:]),
		}
		n := binary.LittleEndian.Uint32(q[36:])
		if n > 0 {
			if op != OpList {
				return h.ID, nil, fmt.Errorf("proto: %v reply with %d list entries", op, n)
			}
			if uint64(n)*ListEntryLen > uint64(len(b)-p) {
				return h.ID, nil, ErrShort
			}
			r.Versions = make([]VersionInfo, n)
			for j := range r.Versions {
				r.Versions[j] = VersionInfo{
					Version: binary.LittleEndian.Uint64(b[p:]),
					Length:  binary.LittleEndian.Uint32(b[p+8:]),
					CRC:     binary.LittleEndian.Uint32(b[p+12:]),
				}
				p += ListEntryLen
			}
		}
		dst = append(dst, r)
	}
	if p != len(b) {
		return h.ID, nil, ErrTrailing
	}
	return h.ID, dst, nil
}
