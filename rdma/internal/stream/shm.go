package stream

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmafs/rdmafs/rdma"
	"github.com/rdmafs/rdmafs/rdma/internal/soft"
)

// Shared memory. On a unix-socket connection the accepting side passes the memfds
// of its protection domain's remotely accessible regions (SCM_RIGHTS) right after
// the handshake; the connecting side maps them, read-only unless the region can be
// written remotely. Requests still start on the wire, where the target's engine
// checks them as over TCP; after serving an access the target also GRANTs the key
// (base, length, rights). From then on the initiator executes RDMA_READ and
// RDMA_WRITE on that key itself, as a checked copy between its registered memory
// and the mapping: the target's CPU does nothing.
//
// Revocation: invalidating a key on the target (deregistration, window
// invalidation or rebinding) sends REVOKE to every connection it was granted to
// and waits for REVOKE_ACK, which the initiator sends once no copy through the key
// is in progress. A closed connection unmaps everything.
//
// The checks run in the initiator's process: shared memory is for peers on one
// host that run this code, not a boundary against a hostile local process.

// maxSharedRegions bounds the memfds passed at connection setup (SCM_MAX_FD is 253).
const maxSharedRegions = 250

// regionEntrySize is one region in the setup message: memory base, size, writable.
const regionEntrySize = 24

// shmState is a shared-memory connection's state. Initiator side: mappings and
// grants. Target side: what was exported and granted.
type shmState struct {
	mu     sync.RWMutex             // read-held by a direct access; write-held to change grants or mappings
	maps   map[uint64][]byte        // the peer's memory base -> our mapping of it
	grants map[uint32]shmGrant      // keys the peer granted us
	export map[uint64]bool          // memory bases we passed to the peer
	given  map[uint32]*soft.Region  // keys we granted the peer (reader goroutine; teardown under q.mu)
	acks   map[uint32]chan struct{} // revocations waiting for the peer (under q.mu)
}

type shmGrant struct {
	base   uint64
	access rdma.AccessFlags
	data   []byte // the granted bytes in our mapping
}

func newShmState() *shmState {
	return &shmState{
		maps: map[uint64][]byte{}, grants: map[uint32]shmGrant{},
		export: map[uint64]bool{}, given: map[uint32]*soft.Region{}, acks: map[uint32]chan struct{}{},
	}
}

// sendRegions passes the domain's remotely accessible memory to a connecting peer
// on a unix socket; on other sockets it does nothing.
func (q *queuePair) sendRegions(conn net.Conn) error {
	uc, ok := conn.(*net.UnixConn)
	if !ok {
		return nil
	}
	st := newShmState()
	var entries []byte
	var fds []int
	for _, mr := range q.pd.Regions() {
		acc := mr.Access()
		if acc&(rdma.AccessRemoteRead|rdma.AccessRemoteWrite|rdma.AccessMWBind) == 0 || len(fds) == maxSharedRegions {
			continue
		}
		mem := mr.Memory()
		if st.export[mem.Addr()] {
			continue
		}
		writable := uint64(0)
		if acc&rdma.AccessLocalWrite != 0 && acc&(rdma.AccessRemoteWrite|rdma.AccessMWBind) != 0 {
			writable = 1
		}
		entries = binary.LittleEndian.AppendUint64(entries, mem.Addr())
		entries = binary.LittleEndian.AppendUint64(entries, uint64(mem.Len()))
		entries = binary.LittleEndian.AppendUint64(entries, writable)
		fds = append(fds, int(mem.File().Fd()))
		st.export[mem.Addr()] = true
	}
	msg := binary.LittleEndian.AppendUint32(nil, uint32(len(fds)))
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if _, _, err := uc.WriteMsgUnix(msg, oob, nil); err != nil {
		return fmt.Errorf("pass shared regions: %w", err)
	}
	if _, err := uc.Write(entries); err != nil {
		return fmt.Errorf("pass shared regions: %w", err)
	}
	q.shm = st
	return nil
}

// receiveRegions maps the regions a peer passed on a unix socket.
func (q *queuePair) receiveRegions(conn net.Conn) error {
	uc, ok := conn.(*net.UnixConn)
	if !ok {
		return nil
	}
	var hdr [4]byte
	oob := make([]byte, unix.CmsgSpace(maxSharedRegions*4))
	n, oobn, _, _, err := uc.ReadMsgUnix(hdr[:], oob)
	if err != nil {
		return fmt.Errorf("receive shared regions: %w", err)
	}
	var fds []int
	if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
		for _, m := range msgs {
			if f, err := unix.ParseUnixRights(&m); err == nil {
				fds = append(fds, f...)
			}
		}
	}
	closeAll := func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}
	if _, err := io.ReadFull(conn, hdr[n:]); err != nil {
		closeAll()
		return fmt.Errorf("receive shared regions: %w", err)
	}
	count := int(binary.LittleEndian.Uint32(hdr[:]))
	if count > maxSharedRegions || count != len(fds) {
		closeAll()
		return fmt.Errorf("receive shared regions: %w: %d regions with %d descriptors", errBadFrame, count, len(fds))
	}
	entries := make([]byte, count*regionEntrySize)
	if _, err := io.ReadFull(conn, entries); err != nil {
		closeAll()
		return fmt.Errorf("receive shared regions: %w", err)
	}
	st := newShmState()
	for i, fd := range fds {
		e := entries[i*regionEntrySize:]
		base, size, writable := binary.LittleEndian.Uint64(e), binary.LittleEndian.Uint64(e[8:]), binary.LittleEndian.Uint64(e[16:])
		var stat unix.Stat_t
		if err := unix.Fstat(fd, &stat); err != nil || size == 0 || size > uint64(stat.Size) || size > 1<<40 {
			continue // a region we cannot map safely is reached over the wire
		}
		prot := unix.PROT_READ
		if writable == 1 {
			prot |= unix.PROT_WRITE
		}
		m, err := unix.Mmap(fd, 0, int(size), prot, unix.MAP_SHARED)
		if err != nil {
			continue
		}
		st.maps[base] = m
	}
	closeAll()
	q.shm = st
	return nil
}

// unmapLocked drops every mapping and grant; the caller holds q.mu, so no direct
// access is in progress.
func (s *shmState) unmapLocked() {
	s.mu.Lock()
	for base, m := range s.maps {
		unix.Munmap(m)
		delete(s.maps, base)
	}
	clear(s.grants)
	s.mu.Unlock()
}

// acceptGrant records a GRANT from the peer: the key may be accessed directly.
func (q *queuePair) acceptGrant(rd *frameReader, h *header) bool {
	var p [grantSize]byte
	if err := rd.readInto(p[:]); err != nil {
		q.fail(rdma.WCRetryExcErr)
		return false
	}
	if q.shm == nil {
		return true
	}
	base, length, memBase := binary.LittleEndian.Uint64(p[:]), binary.LittleEndian.Uint64(p[8:]), binary.LittleEndian.Uint64(p[16:])
	q.shm.mu.Lock()
	defer q.shm.mu.Unlock()
	m, ok := q.shm.maps[memBase]
	if !ok || base < memBase || base-memBase > uint64(len(m)) || length > uint64(len(m))-(base-memBase) {
		return true // nothing mapped there: the key stays on the wire
	}
	off := base - memBase
	q.shm.grants[h.rkey] = shmGrant{base: base, access: rdma.AccessFlags(h.imm), data: m[off : off+length : off+length]}
	return true
}

// grant tells the peer it may access region r directly, once per key.
func (q *queuePair) grant(r *soft.Region) {
	s := q.shm
	if s == nil || !s.export[r.Memory().Addr()] {
		return
	}
	if _, done := s.given[r.Key()]; done || !r.AddRevoker(q) {
		return
	}
	s.given[r.Key()] = r
	p := make([]byte, 0, grantSize)
	p = binary.LittleEndian.AppendUint64(p, r.Base())
	p = binary.LittleEndian.AppendUint64(p, uint64(r.Len()))
	p = binary.LittleEndian.AppendUint64(p, r.Memory().Addr())
	q.respond(outItem{op: opGrant, rkey: r.Key(), imm: uint32(r.Access()), payload: p})
}

// Revoke implements soft.Revoker: it asks the peer to stop using key and waits
// until it has, the connection ends, or the retry timeout passes (then the
// connection is ended).
func (q *queuePair) Revoke(key uint32) {
	q.mu.Lock()
	if q.state != rdma.QPStateRTS || q.shm == nil {
		q.mu.Unlock()
		return
	}
	ack := make(chan struct{})
	q.shm.acks[key] = ack
	q.out = append(q.out, outItem{op: opRevoke, rkey: key})
	q.mu.Unlock()
	q.flush()
	t := time.NewTimer(q.attr.RetryTimeout)
	defer t.Stop()
	select {
	case <-ack:
	case <-q.disconnected:
	case <-t.C:
		q.fail(rdma.WCRetryExcErr)
		<-q.done
	}
}

// revoked handles the peer's REVOKE_ACK.
func (q *queuePair) revoked(key uint32) {
	q.mu.Lock()
	if q.shm != nil {
		if ack, ok := q.shm.acks[key]; ok {
			close(ack)
			delete(q.shm.acks, key)
		}
		delete(q.shm.given, key)
	}
	q.mu.Unlock()
}

// dropGrant handles the peer's REVOKE: once no direct access through key is in
// progress, it is forgotten and the peer is told so.
func (q *queuePair) dropGrant(key uint32) {
	if q.shm != nil {
		q.shm.mu.Lock()
		delete(q.shm.grants, key)
		q.shm.mu.Unlock()
	}
	q.respond(outItem{op: opRevokeAck, rkey: key})
}

// releaseGrantsLocked forgets, on teardown, the regions this connection was
// granted access to. The caller holds q.mu.
func (q *queuePair) releaseGrantsLocked() {
	if q.shm == nil {
		return
	}
	for key, r := range q.shm.given {
		r.RemoveRevoker(q)
		delete(q.shm.given, key)
	}
	q.shm.unmapLocked()
}

// direct executes an RDMA_READ or RDMA_WRITE as a copy through shared memory when
// the key was granted, and reports whether it did. The caller holds q.mu and
// nothing is outstanding, so the request is next in order. A request the grant
// does not allow, or a bad local SGE, returns its error status: the request then
// goes into the send queue to fail in order.
func (q *queuePair) direct(wr *rdma.SendWR) (bool, rdma.WCStatus) {
	st := q.shm
	st.mu.RLock()
	defer st.mu.RUnlock()
	g, ok := st.grants[wr.RKey]
	if !ok {
		return false, rdma.WCSuccess
	}
	want := rdma.AccessRemoteRead
	if wr.Opcode == rdma.OpRDMAWrite {
		want = rdma.AccessRemoteWrite
	}
	var total uint64
	for _, sge := range wr.SGL {
		total += uint64(sge.Length)
	}
	if g.access&want == 0 || wr.RemoteAddr < g.base || wr.RemoteAddr-g.base > uint64(len(g.data)) || total > uint64(len(g.data))-(wr.RemoteAddr-g.base) {
		return false, rdma.WCRemAccessErr
	}
	remote := g.data[wr.RemoteAddr-g.base:]
	for _, sge := range wr.SGL {
		if sge.Length == 0 {
			continue
		}
		r, b, status := q.pd.Keys.Local(sge, q.pd, wr.Opcode == rdma.OpRDMARead)
		if status != rdma.WCSuccess {
			return false, status
		}
		if wr.Opcode == rdma.OpRDMARead {
			copy(b, remote)
		} else {
			copy(remote, b)
		}
		remote = remote[len(b):]
		r.Release()
	}
	if wr.Flags&rdma.SendSignaled != 0 || q.attr.SignalAll {
		q.sendCQ.Push(rdma.WorkCompletion{ID: wr.ID, Status: rdma.WCSuccess, Opcode: wr.Opcode.CompletionOpcode(), ByteLen: uint32(total), QPNum: q.num})
	}
	return true, rdma.WCSuccess
}
