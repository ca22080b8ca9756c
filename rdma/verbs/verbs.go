//go:build verbs

package verbs

/*
#cgo LDFLAGS: -libverbs -lrdmacm
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>

static int set_nonblock(int fd) {
	int flags = fcntl(fd, F_GETFL);
	if (flags < 0) return -1;
	return fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

// fill_send_wr fills one RDMA/SEND work request; the unions are not reachable from Go.
static void fill_send_wr(struct ibv_send_wr *wr, uint64_t id, int opcode, unsigned flags,
		struct ibv_sge *sg, int nsge, uint32_t imm, uint64_t raddr, uint32_t rkey,
		struct ibv_send_wr *next) {
	memset(wr, 0, sizeof(*wr));
	wr->wr_id = id;
	wr->next = next;
	wr->sg_list = sg;
	wr->num_sge = nsge;
	wr->opcode = opcode;
	wr->send_flags = flags;
	wr->imm_data = htonl(imm);
	wr->wr.rdma.remote_addr = raddr;
	wr->wr.rdma.rkey = rkey;
}

static void fill_bind_wr(struct ibv_send_wr *wr, uint64_t id, struct ibv_mw *mw, uint32_t rkey,
		struct ibv_mr *mr, uint64_t addr, uint64_t length, unsigned access) {
	memset(wr, 0, sizeof(*wr));
	wr->wr_id = id;
	wr->opcode = IBV_WR_BIND_MW;
	wr->bind_mw.mw = mw;
	wr->bind_mw.rkey = rkey;
	wr->bind_mw.bind_info.mr = mr;
	wr->bind_mw.bind_info.addr = addr;
	wr->bind_mw.bind_info.length = length;
	wr->bind_mw.bind_info.mw_access_flags = access;
}

static void fill_inv_wr(struct ibv_send_wr *wr, uint64_t id, uint32_t rkey) {
	memset(wr, 0, sizeof(*wr));
	wr->wr_id = id;
	wr->opcode = IBV_WR_LOCAL_INV;
	wr->invalidate_rkey = rkey;
}

static void fill_recv_wr(struct ibv_recv_wr *wr, uint64_t id, struct ibv_sge *sg, int nsge, struct ibv_recv_wr *next) {
	wr->wr_id = id;
	wr->next = next;
	wr->sg_list = sg;
	wr->num_sge = nsge;
}

static int post_send(struct ibv_qp *qp, struct ibv_send_wr *wr) {
	struct ibv_send_wr *bad;
	return ibv_post_send(qp, wr, &bad);
}

static int post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr) {
	struct ibv_recv_wr *bad;
	return ibv_post_recv(qp, wr, &bad);
}

static int poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc) { return ibv_poll_cq(cq, n, wc); }
static int req_notify(struct ibv_cq *cq) { return ibv_req_notify_cq(cq, 0); }
static struct ibv_mw *alloc_mw2(struct ibv_pd *pd) { return ibv_alloc_mw(pd, IBV_MW_TYPE_2); }
static int dealloc_mw(struct ibv_mw *mw) { return ibv_dealloc_mw(mw); }
static uint32_t inc_rkey(uint32_t rkey) { return ibv_inc_rkey(rkey); }
static uint32_t wc_imm(struct ibv_wc *wc) { return ntohl(wc->imm_data); }

// get_cq_event takes one event from a non-blocking completion channel: 1 when one
// was taken, 0 when none was ready, -1 on error.
static int get_cq_event(struct ibv_comp_channel *ch, struct ibv_cq **cq) {
	void *ctx;
	if (ibv_get_cq_event(ch, cq, &ctx) == 0) return 1;
	return errno == EAGAIN ? 0 : -1;
}

static int create_qp(struct ibv_pd *pd, struct ibv_cq *scq, struct ibv_cq *rcq, int sw, int rw, int sge, int sigall, struct ibv_qp **out) {
	struct ibv_qp_init_attr a;
	memset(&a, 0, sizeof(a));
	a.send_cq = scq;
	a.recv_cq = rcq;
	a.cap.max_send_wr = sw;
	a.cap.max_recv_wr = rw;
	a.cap.max_send_sge = sge;
	a.cap.max_recv_sge = sge;
	a.qp_type = IBV_QPT_RC;
	a.sq_sig_all = sigall;
	*out = ibv_create_qp(pd, &a);
	return *out ? 0 : errno;
}

// to_state moves qp to state with the attributes rdma_cm computes for id.
static int to_state(struct rdma_cm_id *id, struct ibv_qp *qp, int state) {
	struct ibv_qp_attr attr;
	int mask;
	memset(&attr, 0, sizeof(attr));
	attr.qp_state = state;
	if (rdma_init_qp_attr(id, &attr, &mask)) return errno;
	if (state == IBV_QPS_INIT)
		attr.qp_access_flags = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;
	return ibv_modify_qp(qp, &attr, mask) ? errno : 0;
}

static int to_error(struct ibv_qp *qp) {
	struct ibv_qp_attr attr;
	memset(&attr, 0, sizeof(attr));
	attr.qp_state = IBV_QPS_ERR;
	return ibv_modify_qp(qp, &attr, IBV_QP_STATE) ? errno : 0;
}

static int query_state(struct ibv_qp *qp) {
	struct ibv_qp_attr attr;
	struct ibv_qp_init_attr init;
	if (ibv_query_qp(qp, &attr, IBV_QP_STATE, &init)) return -1;
	return attr.qp_state;
}

static int resolve(struct rdma_cm_id *id, const char *host, const char *port, int timeout_ms) {
	struct rdma_addrinfo hints, *res;
	int ret;
	memset(&hints, 0, sizeof(hints));
	hints.ai_port_space = RDMA_PS_TCP;
	if (rdma_getaddrinfo(host, port, &hints, &res)) return errno ? errno : EINVAL;
	ret = rdma_resolve_addr(id, NULL, res->ai_dst_addr, timeout_ms);
	rdma_freeaddrinfo(res);
	return ret ? errno : 0;
}

static int bind_listen(struct rdma_cm_id *id, const char *host, const char *port) {
	struct rdma_addrinfo hints, *res;
	int ret;
	memset(&hints, 0, sizeof(hints));
	hints.ai_flags = RAI_PASSIVE;
	hints.ai_port_space = RDMA_PS_TCP;
	if (rdma_getaddrinfo(host, port, &hints, &res)) return errno ? errno : EINVAL;
	ret = rdma_bind_addr(id, res->ai_src_addr);
	rdma_freeaddrinfo(res);
	if (ret) return errno;
	return rdma_listen(id, 128) ? errno : 0;
}

static int format_addr(struct sockaddr *sa, char *buf, int len) {
	void *src = sa->sa_family == AF_INET6 ? (void*)&((struct sockaddr_in6*)sa)->sin6_addr : (void*)&((struct sockaddr_in*)sa)->sin_addr;
	return inet_ntop(sa->sa_family, src, buf, len) ? 0 : -1;
}

static int peer_addr(struct rdma_cm_id *id, char *buf, int len) {
	if (format_addr(rdma_get_peer_addr(id), buf, len)) return -1;
	return ntohs(rdma_get_dst_port(id));
}

static int local_addr(struct rdma_cm_id *id, char *buf, int len) {
	struct sockaddr *sa = rdma_get_local_addr(id);
	void *src = sa->sa_family == AF_INET6 ? (void*)&((struct sockaddr_in6*)sa)->sin6_addr : (void*)&((struct sockaddr_in*)sa)->sin_addr;
	if (!inet_ntop(sa->sa_family, src, buf, len)) return -1;
	return ntohs(rdma_get_src_port(id));
}

static int conn_param(struct rdma_conn_param *p, const void *priv, int len, uint32_t qpn) {
	memset(p, 0, sizeof(*p));
	p->private_data = priv;
	p->private_data_len = len;
	p->responder_resources = 16;
	p->initiator_depth = 16;
	p->retry_count = 7;
	p->rnr_retry_count = 6;
	p->qp_num = qpn;
	return 0;
}

static int do_connect(struct rdma_cm_id *id, const void *priv, int len, uint32_t qpn) {
	struct rdma_conn_param p;
	conn_param(&p, priv, len, qpn);
	return rdma_connect(id, &p) ? errno : 0;
}

static int do_accept(struct rdma_cm_id *id, const void *priv, int len, uint32_t qpn) {
	struct rdma_conn_param p;
	conn_param(&p, priv, len, qpn);
	return rdma_accept(id, &p) ? errno : 0;
}

// next_event takes one rdma_cm event from a non-blocking channel and copies what
// Go needs: 1 taken, 0 none ready, -1 error.
static int next_event(struct rdma_event_channel *ch, struct rdma_cm_id **id, struct rdma_cm_id **listen_id,
		int *type, int *status, void *priv, int *priv_len) {
	struct rdma_cm_event *ev;
	if (rdma_get_cm_event(ch, &ev)) return errno == EAGAIN ? 0 : -1;
	*id = ev->id;
	*listen_id = ev->listen_id;
	*type = ev->event;
	*status = ev->status;
	*priv_len = 0;
	if (ev->param.conn.private_data && ev->param.conn.private_data_len) {
		*priv_len = ev->param.conn.private_data_len;
		memcpy(priv, ev->param.conn.private_data, *priv_len);
	}
	rdma_ack_cm_event(ev);
	return 1;
}
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/rdmafs/rdmafs/rdma"
)

// Layouts and constants must match <infiniband/verbs.h>: these fail to compile if not.
var (
	_ = [1]int{}[int(unsafe.Sizeof(rdma.SGE{}))-int(C.sizeof_struct_ibv_sge)]
	_ = [1]int{}[int(unsafe.Offsetof(rdma.SGE{}.Length))-int(unsafe.Offsetof(C.struct_ibv_sge{}.length))]
	_ = [1]int{}[int(unsafe.Offsetof(rdma.SGE{}.LKey))-int(unsafe.Offsetof(C.struct_ibv_sge{}.lkey))]
	_ = [1]int{}[int(rdma.OpRDMAWrite)-int(C.IBV_WR_RDMA_WRITE)]
	_ = [1]int{}[int(rdma.OpRDMAWriteWithImm)-int(C.IBV_WR_RDMA_WRITE_WITH_IMM)]
	_ = [1]int{}[int(rdma.OpSend)-int(C.IBV_WR_SEND)]
	_ = [1]int{}[int(rdma.OpSendWithImm)-int(C.IBV_WR_SEND_WITH_IMM)]
	_ = [1]int{}[int(rdma.OpRDMARead)-int(C.IBV_WR_RDMA_READ)]
	_ = [1]int{}[int(rdma.WCRecv)-int(C.IBV_WC_RECV)]
	_ = [1]int{}[int(rdma.WCRecvRDMAWithImm)-int(C.IBV_WC_RECV_RDMA_WITH_IMM)]
	_ = [1]int{}[int(rdma.WCRDMARead)-int(C.IBV_WC_RDMA_READ)]
	_ = [1]int{}[int(rdma.WCRemAccessErr)-int(C.IBV_WC_REM_ACCESS_ERR)]
	_ = [1]int{}[int(rdma.WCWRFlushErr)-int(C.IBV_WC_WR_FLUSH_ERR)]
	_ = [1]int{}[int(rdma.WCRNRRetryExcErr)-int(C.IBV_WC_RNR_RETRY_EXC_ERR)]
	_ = [1]int{}[int(rdma.WCGeneralErr)-int(C.IBV_WC_GENERAL_ERR)]
	_ = [1]int{}[int(rdma.AccessRemoteRead)-int(C.IBV_ACCESS_REMOTE_READ)]
	_ = [1]int{}[int(rdma.AccessRemoteWrite)-int(C.IBV_ACCESS_REMOTE_WRITE)]
	_ = [1]int{}[int(rdma.AccessMWBind)-int(C.IBV_ACCESS_MW_BIND)]
	_ = [1]int{}[int(rdma.SendSignaled)-int(C.IBV_SEND_SIGNALED)]
	_ = [1]int{}[int(rdma.SendFence)-int(C.IBV_SEND_FENCE)]
	_ = [1]int{}[int(rdma.WCWithImm)-int(C.IBV_WC_WITH_IMM)]
	_ = [1]int{}[int(rdma.QPStateErr)-int(C.IBV_QPS_ERR)]
)

// InternalWRID is the wr_id of the memory window binds and invalidations the
// transport posts itself; they complete only on failure.
const InternalWRID = ^uint64(0)

// ErrNoDevice is returned by Open on a machine without an RDMA device.
var ErrNoDevice = errors.New("verbs: no RDMA device (ibv_get_device_list found none)")

// Options configure the transport.
type Options struct{}

// Device is an RDMA NIC's context with an rdma_cm event channel.
type Device struct {
	ctx *C.struct_ibv_context
	ec  *C.struct_rdma_event_channel
	ecf *os.File

	mu      sync.Mutex
	waiters map[*C.struct_rdma_cm_id]chan cmEvent
	listens map[*C.struct_rdma_cm_id]*listener
	done    chan struct{}
}

type cmEvent struct {
	id, listenID *C.struct_rdma_cm_id
	typ, status  int
	priv         []byte
}

// Open opens the first RDMA device rdma_cm knows.
func Open(Options) (rdma.Device, error) {
	var n C.int
	list := C.rdma_get_devices(&n)
	if list == nil || n == 0 {
		if list != nil {
			C.rdma_free_devices(list)
		}
		return nil, ErrNoDevice
	}
	ctx := *list
	C.rdma_free_devices(list)
	ec, err := C.rdma_create_event_channel()
	if ec == nil {
		return nil, fmt.Errorf("verbs: rdma_create_event_channel: %w", err)
	}
	f, err := pollable(int(ec.fd), "rdma_cm")
	if err != nil {
		C.rdma_destroy_event_channel(ec)
		return nil, err
	}
	d := &Device{ctx: ctx, ec: ec, ecf: f, waiters: map[*C.struct_rdma_cm_id]chan cmEvent{},
		listens: map[*C.struct_rdma_cm_id]*listener{}, done: make(chan struct{})}
	go d.dispatch()
	return d, nil
}

// pollable makes a duplicate of a non-blocking descriptor that Go's poller watches.
func pollable(fd int, name string) (*os.File, error) {
	if C.set_nonblock(C.int(fd)) != 0 {
		return nil, fmt.Errorf("verbs: %s descriptor: set non-blocking", name)
	}
	dup, err := syscall.Dup(fd)
	if err != nil {
		return nil, fmt.Errorf("verbs: %s descriptor: %w", name, err)
	}
	syscall.SetNonblock(dup, true)
	return os.NewFile(uintptr(dup), name), nil
}

// dispatch delivers rdma_cm events to whoever waits for them.
func (d *Device) dispatch() {
	rc, err := d.ecf.SyscallConn()
	if err != nil {
		return
	}
	priv := C.malloc(256)
	defer C.free(priv)
	for {
		var ev cmEvent
		got := false
		err := rc.Read(func(uintptr) bool {
			var id, lid *C.struct_rdma_cm_id
			var typ, status, plen C.int
			r := C.next_event(d.ec, &id, &lid, &typ, &status, priv, &plen)
			if r == 0 {
				return false
			}
			if r == 1 {
				got = true
				ev = cmEvent{id: id, listenID: lid, typ: int(typ), status: int(status), priv: C.GoBytes(priv, plen)}
			}
			return true
		})
		if err != nil {
			return
		}
		if !got {
			continue
		}
		d.mu.Lock()
		if ev.typ == C.RDMA_CM_EVENT_CONNECT_REQUEST {
			l := d.listens[ev.listenID]
			d.mu.Unlock()
			if l != nil {
				select {
				case l.reqs <- &connRequest{dev: d, id: ev.id, priv: ev.priv}:
				case <-l.done:
					C.rdma_reject(ev.id, nil, 0)
					C.rdma_destroy_id(ev.id)
				}
			}
			continue
		}
		ch := d.waiters[ev.id]
		d.mu.Unlock()
		if ch != nil {
			select {
			case ch <- ev:
			default: // nobody waits for this one (e.g. a second DISCONNECTED)
			}
		}
	}
}

func (d *Device) watch(id *C.struct_rdma_cm_id) chan cmEvent {
	ch := make(chan cmEvent, 8)
	d.mu.Lock()
	d.waiters[id] = ch
	d.mu.Unlock()
	return ch
}

func (d *Device) unwatch(id *C.struct_rdma_cm_id) {
	d.mu.Lock()
	delete(d.waiters, id)
	d.mu.Unlock()
}

func waitEvent(ctx context.Context, ch chan cmEvent, want int) (cmEvent, error) {
	select {
	case ev := <-ch:
		if ev.typ != want {
			if ev.typ == C.RDMA_CM_EVENT_REJECTED {
				return ev, &rdma.RejectError{PrivateData: ev.priv}
			}
			return ev, fmt.Errorf("verbs: rdma_cm event %d (status %d), want %d", ev.typ, ev.status, want)
		}
		return ev, nil
	case <-ctx.Done():
		return cmEvent{}, ctx.Err()
	}
}

// Name implements rdma.Device.
func (d *Device) Name() string { return "verbs" }

// Close implements rdma.Device.
func (d *Device) Close() error {
	d.ecf.Close()
	C.rdma_destroy_event_channel(d.ec)
	return nil
}

// AllocPD implements rdma.Device.
func (d *Device) AllocPD() (rdma.ProtectionDomain, error) {
	pd := C.ibv_alloc_pd(d.ctx)
	if pd == nil {
		return nil, fmt.Errorf("verbs: ibv_alloc_pd failed")
	}
	return &protectionDomain{dev: d, pd: pd}, nil
}

// CreateCQ implements rdma.Device.
func (d *Device) CreateCQ(depth int) (rdma.CompletionQueue, error) {
	ch := C.ibv_create_comp_channel(d.ctx)
	if ch == nil {
		return nil, fmt.Errorf("verbs: ibv_create_comp_channel failed")
	}
	f, err := pollable(int(ch.fd), "cq channel")
	if err != nil {
		C.ibv_destroy_comp_channel(ch)
		return nil, err
	}
	cq := C.ibv_create_cq(d.ctx, C.int(depth), nil, ch, 0)
	if cq == nil {
		f.Close()
		C.ibv_destroy_comp_channel(ch)
		return nil, fmt.Errorf("verbs: ibv_create_cq(%d) failed", depth)
	}
	const pollBatch = 64
	wcs := (*C.struct_ibv_wc)(C.calloc(pollBatch, C.sizeof_struct_ibv_wc))
	return &completionQueue{cq: cq, ch: ch, chf: f, wcs: wcs, n: pollBatch}, nil
}

type protectionDomain struct {
	dev *Device
	pd  *C.struct_ibv_pd
}

func (p *protectionDomain) RegisterMemory(mem *rdma.Memory, access rdma.AccessFlags) (rdma.MemoryRegion, error) {
	if err := mem.Pin(); err != nil {
		return nil, fmt.Errorf("verbs: register memory: %w", err)
	}
	// The memory is an mmap outside the Go heap: handing it to C is allowed.
	mr := C.ibv_reg_mr(p.pd, unsafe.Pointer(unsafe.SliceData(mem.Bytes())), C.size_t(mem.Len()), C.int(access))
	if mr == nil {
		mem.Unpin()
		return nil, fmt.Errorf("verbs: ibv_reg_mr of %d bytes failed", mem.Len())
	}
	return &memoryRegion{mr: mr, mem: mem, access: access}, nil
}

func (p *protectionDomain) AllocMW() (rdma.MemoryWindow, error) {
	mw := C.alloc_mw2(p.pd)
	if mw == nil {
		return nil, fmt.Errorf("verbs: ibv_alloc_mw(type 2) failed")
	}
	return &memoryWindow{mw: mw}, nil
}

func (p *protectionDomain) Close() error {
	if r := C.ibv_dealloc_pd(p.pd); r != 0 {
		return fmt.Errorf("verbs: ibv_dealloc_pd: %w", syscall.Errno(r))
	}
	return nil
}

type memoryRegion struct {
	mr     *C.struct_ibv_mr
	mem    *rdma.Memory
	access rdma.AccessFlags
	once   sync.Once
}

func (m *memoryRegion) Addr() uint64             { return m.mem.Addr() }
func (m *memoryRegion) Len() int                 { return m.mem.Len() }
func (m *memoryRegion) LKey() uint32             { return uint32(m.mr.lkey) }
func (m *memoryRegion) RKey() uint32             { return uint32(m.mr.rkey) }
func (m *memoryRegion) Access() rdma.AccessFlags { return m.access }
func (m *memoryRegion) Bytes() []byte            { return m.mem.Bytes() }

func (m *memoryRegion) Deregister() error {
	var err error
	m.once.Do(func() {
		if r := C.ibv_dereg_mr(m.mr); r != 0 {
			err = fmt.Errorf("verbs: ibv_dereg_mr: %w", syscall.Errno(r))
			return
		}
		m.mem.Unpin()
	})
	return err
}

type memoryWindow struct {
	mw   *C.struct_ibv_mw
	rkey atomic.Uint32
}

func (w *memoryWindow) RKey() uint32 { return w.rkey.Load() }

func (w *memoryWindow) Close() error {
	if r := C.dealloc_mw(w.mw); r != 0 {
		return fmt.Errorf("verbs: ibv_dealloc_mw: %w", syscall.Errno(r))
	}
	return nil
}

type completionQueue struct {
	cq  *C.struct_ibv_cq
	ch  *C.struct_ibv_comp_channel
	chf *os.File
	wcs *C.struct_ibv_wc
	n   int
}

func (q *completionQueue) Poll(wcs []rdma.WorkCompletion) int {
	want := min(len(wcs), q.n)
	got := int(C.poll_cq(q.cq, C.int(want), q.wcs))
	if got <= 0 {
		return 0
	}
	cw := unsafe.Slice(q.wcs, got)
	for i := range cw {
		wc := &cw[i]
		wcs[i] = rdma.WorkCompletion{
			ID: uint64(wc.wr_id), Status: rdma.WCStatus(wc.status), Opcode: rdma.WCOpcode(wc.opcode),
			Flags: rdma.WCFlags(wc.wc_flags), ByteLen: uint32(wc.byte_len), QPNum: uint32(wc.qp_num),
		}
		if wcs[i].Flags&rdma.WCWithImm != 0 {
			wcs[i].Imm = uint32(C.wc_imm(wc))
		}
	}
	return got
}

// Wait arms the completion channel, checks the queue once more (a completion may
// have arrived before arming), then waits for the channel's descriptor in Go's poller.
func (q *completionQueue) Wait(ctx context.Context) error {
	rc, err := q.chf.SyscallConn()
	if err != nil {
		return fmt.Errorf("verbs: cq wait: %w", err)
	}
	if C.req_notify(q.cq) != 0 {
		return fmt.Errorf("verbs: ibv_req_notify_cq failed")
	}
	if C.poll_cq(q.cq, 0, q.wcs) > 0 {
		return nil
	}
	stop := context.AfterFunc(ctx, func() { q.chf.SetReadDeadline(aLongTimeAgo) })
	defer stop()
	var evErr error
	err = rc.Read(func(uintptr) bool {
		var cq *C.struct_ibv_cq
		switch C.get_cq_event(q.ch, &cq) {
		case 1:
			C.ibv_ack_cq_events(cq, 1)
			return true
		case 0:
			return false
		}
		evErr = fmt.Errorf("verbs: ibv_get_cq_event failed")
		return true
	})
	if ctx.Err() != nil {
		q.chf.SetReadDeadline(noDeadline)
		return ctx.Err()
	}
	if err != nil {
		return fmt.Errorf("verbs: cq wait: %w", err)
	}
	return evErr
}

func (q *completionQueue) Close() error {
	q.chf.Close()
	C.free(unsafe.Pointer(q.wcs))
	if r := C.ibv_destroy_cq(q.cq); r != 0 {
		return fmt.Errorf("verbs: ibv_destroy_cq: %w", syscall.Errno(r))
	}
	C.ibv_destroy_comp_channel(q.ch)
	return nil
}

var (
	aLongTimeAgo = time.Unix(1, 0)
	noDeadline   time.Time
)

// queuePair is an RC queue pair with C arrays for posting, sized at creation.
type queuePair struct {
	dev     *Device
	pd      *protectionDomain
	qp      *C.struct_ibv_qp
	attr    rdma.QPAttr
	id      *C.struct_rdma_cm_id
	events  chan cmEvent
	remote  string
	mu      sync.Mutex // serializes posting (the C arrays are reused)
	swr     *C.struct_ibv_send_wr
	ssge    *C.struct_ibv_sge
	rwr     *C.struct_ibv_recv_wr
	rsge    *C.struct_ibv_sge
	disc    chan struct{}
	discOne sync.Once
	closed  bool
}

func (p *protectionDomain) CreateQP(attr rdma.QPAttr) (rdma.QueuePair, error) {
	attr = attr.WithDefaults()
	scq, ok1 := attr.SendCQ.(*completionQueue)
	rcq, ok2 := attr.RecvCQ.(*completionQueue)
	if !ok1 || !ok2 {
		return nil, fmt.Errorf("verbs: create qp: completion queues of another transport: %w", rdma.ErrInvalidArgument)
	}
	if attr.MaxSGE > rdma.MaxSGELimit {
		return nil, fmt.Errorf("verbs: create qp: %d SGEs: %w", attr.MaxSGE, rdma.ErrInvalidArgument)
	}
	sigAll := C.int(0)
	if attr.SignalAll {
		sigAll = 1
	}
	var qp *C.struct_ibv_qp
	if r := C.create_qp(p.pd, scq.cq, rcq.cq, C.int(attr.MaxSendWR), C.int(attr.MaxRecvWR), C.int(attr.MaxSGE), sigAll, &qp); r != 0 {
		return nil, fmt.Errorf("verbs: ibv_create_qp: %w", syscall.Errno(r))
	}
	q := &queuePair{dev: p.dev, pd: p, qp: qp, attr: attr, disc: make(chan struct{})}
	// Room for a whole queue of requests per post, plus one bind or invalidate.
	n := attr.MaxSendWR + 1
	q.swr = (*C.struct_ibv_send_wr)(C.calloc(C.size_t(n), C.sizeof_struct_ibv_send_wr))
	q.ssge = (*C.struct_ibv_sge)(C.calloc(C.size_t(n*attr.MaxSGE), C.sizeof_struct_ibv_sge))
	q.rwr = (*C.struct_ibv_recv_wr)(C.calloc(C.size_t(attr.MaxRecvWR), C.sizeof_struct_ibv_recv_wr))
	q.rsge = (*C.struct_ibv_sge)(C.calloc(C.size_t(attr.MaxRecvWR*attr.MaxSGE), C.sizeof_struct_ibv_sge))
	return q, nil
}

func (q *queuePair) Num() uint32 { return uint32(q.qp.qp_num) }

func (q *queuePair) State() rdma.QPState {
	st := C.query_state(q.qp)
	if st < 0 {
		return rdma.QPStateErr
	}
	return rdma.QPState(st)
}

func (q *queuePair) RemoteAddr() string { return q.remote }

func (q *queuePair) Disconnected() <-chan struct{} { return q.disc }

func (q *queuePair) markDisconnected() { q.discOne.Do(func() { close(q.disc) }) }

// copySGL copies a Go SGE list into C memory at dst (the layouts are identical).
func copySGL(dst *C.struct_ibv_sge, sgl []rdma.SGE) {
	if len(sgl) > 0 {
		C.memcpy(unsafe.Pointer(dst), unsafe.Pointer(unsafe.SliceData(sgl)), C.size_t(len(sgl))*C.sizeof_struct_ibv_sge)
	}
}

// PostSend implements rdma.QueuePair: one cgo call for the whole batch.
func (q *queuePair) PostSend(wrs []rdma.SendWR) error {
	if len(wrs) == 0 {
		return nil
	}
	if len(wrs) > q.attr.MaxSendWR {
		return fmt.Errorf("verbs: post send: %d requests, queue of %d: %w", len(wrs), q.attr.MaxSendWR, rdma.ErrQueueFull)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	cwr := unsafe.Slice(q.swr, len(wrs))
	for i := range wrs {
		wr := &wrs[i]
		if len(wr.SGL) > q.attr.MaxSGE {
			return fmt.Errorf("verbs: post send: request %d: %d SGEs: %w", i, len(wr.SGL), rdma.ErrInvalidWR)
		}
		sg := (*C.struct_ibv_sge)(unsafe.Add(unsafe.Pointer(q.ssge), i*q.attr.MaxSGE*C.sizeof_struct_ibv_sge))
		copySGL(sg, wr.SGL)
		var next *C.struct_ibv_send_wr
		if i+1 < len(wrs) {
			next = &cwr[i+1]
		}
		C.fill_send_wr(&cwr[i], C.uint64_t(wr.ID), C.int(wr.Opcode), C.uint(wr.Flags), sg, C.int(len(wr.SGL)),
			C.uint32_t(wr.Imm), C.uint64_t(wr.RemoteAddr), C.uint32_t(wr.RKey), next)
	}
	if r := C.post_send(q.qp, q.swr); r != 0 {
		if syscall.Errno(r) == syscall.ENOMEM {
			return fmt.Errorf("verbs: ibv_post_send: %w", rdma.ErrQueueFull)
		}
		return fmt.Errorf("verbs: ibv_post_send: %w", syscall.Errno(r))
	}
	return nil
}

// PostRecv implements rdma.QueuePair.
func (q *queuePair) PostRecv(wrs []rdma.RecvWR) error {
	if len(wrs) == 0 {
		return nil
	}
	if len(wrs) > q.attr.MaxRecvWR {
		return fmt.Errorf("verbs: post recv: %d requests, queue of %d: %w", len(wrs), q.attr.MaxRecvWR, rdma.ErrQueueFull)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	cwr := unsafe.Slice(q.rwr, len(wrs))
	for i := range wrs {
		if len(wrs[i].SGL) > q.attr.MaxSGE {
			return fmt.Errorf("verbs: post recv: request %d: %d SGEs: %w", i, len(wrs[i].SGL), rdma.ErrInvalidWR)
		}
		sg := (*C.struct_ibv_sge)(unsafe.Add(unsafe.Pointer(q.rsge), i*q.attr.MaxSGE*C.sizeof_struct_ibv_sge))
		copySGL(sg, wrs[i].SGL)
		var next *C.struct_ibv_recv_wr
		if i+1 < len(wrs) {
			next = &cwr[i+1]
		}
		C.fill_recv_wr(&cwr[i], C.uint64_t(wrs[i].ID), sg, C.int(len(wrs[i].SGL)), next)
	}
	if r := C.post_recv(q.qp, q.rwr); r != 0 {
		if syscall.Errno(r) == syscall.ENOMEM {
			return fmt.Errorf("verbs: ibv_post_recv: %w", rdma.ErrQueueFull)
		}
		return fmt.Errorf("verbs: ibv_post_recv: %w", syscall.Errno(r))
	}
	return nil
}

// BindMW implements rdma.QueuePair with an unsignaled IBV_WR_BIND_MW request.
func (q *queuePair) BindMW(mw rdma.MemoryWindow, mr rdma.MemoryRegion, addr, length uint64, access rdma.AccessFlags) (uint32, error) {
	w, ok1 := mw.(*memoryWindow)
	m, ok2 := mr.(*memoryRegion)
	if !ok1 || !ok2 {
		return 0, fmt.Errorf("verbs: bind mw: objects of another transport: %w", rdma.ErrInvalidArgument)
	}
	if addr < m.Addr() || addr-m.Addr() > uint64(m.Len()) || length > uint64(m.Len())-(addr-m.Addr()) {
		return 0, fmt.Errorf("verbs: bind mw: [%#x, +%d) outside the region: %w", addr, length, rdma.ErrInvalidArgument)
	}
	rkey := uint32(C.inc_rkey(C.uint32_t(w.mw.rkey)))
	q.mu.Lock()
	defer q.mu.Unlock()
	C.fill_bind_wr(q.swr, C.uint64_t(InternalWRID), w.mw, C.uint32_t(rkey), m.mr, C.uint64_t(addr), C.uint64_t(length), C.uint(access))
	if r := C.post_send(q.qp, q.swr); r != 0 {
		return 0, fmt.Errorf("verbs: post bind mw: %w", syscall.Errno(r))
	}
	w.rkey.Store(rkey)
	return rkey, nil
}

// InvalidateMW implements rdma.QueuePair with an unsignaled IBV_WR_LOCAL_INV.
func (q *queuePair) InvalidateMW(mw rdma.MemoryWindow) error {
	w, ok := mw.(*memoryWindow)
	if !ok {
		return fmt.Errorf("verbs: invalidate mw: window of another transport: %w", rdma.ErrInvalidArgument)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	C.fill_inv_wr(q.swr, C.uint64_t(InternalWRID), C.uint32_t(w.rkey.Load()))
	if r := C.post_send(q.qp, q.swr); r != 0 {
		return fmt.Errorf("verbs: post local invalidate: %w", syscall.Errno(r))
	}
	w.rkey.Store(0)
	return nil
}

// Close implements rdma.QueuePair.
func (q *queuePair) Close() error {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return nil
	}
	q.closed = true
	q.mu.Unlock()
	if q.id != nil {
		C.rdma_disconnect(q.id)
		q.dev.unwatch(q.id)
		C.rdma_destroy_id(q.id)
	}
	C.to_error(q.qp)
	q.markDisconnected()
	r := C.ibv_destroy_qp(q.qp)
	C.free(unsafe.Pointer(q.swr))
	C.free(unsafe.Pointer(q.ssge))
	C.free(unsafe.Pointer(q.rwr))
	C.free(unsafe.Pointer(q.rsge))
	if r != 0 {
		return fmt.Errorf("verbs: ibv_destroy_qp: %w", syscall.Errno(r))
	}
	return nil
}

// watchDisconnect closes Disconnected when rdma_cm reports the connection gone.
func (q *queuePair) watchDisconnect() {
	for ev := range q.events {
		switch ev.typ {
		case C.RDMA_CM_EVENT_DISCONNECTED, C.RDMA_CM_EVENT_DEVICE_REMOVAL, C.RDMA_CM_EVENT_TIMEWAIT_EXIT:
			C.to_error(q.qp)
			q.markDisconnected()
			return
		}
	}
}

// Connect implements rdma.Device: resolve address and route, move the queue pair
// through INIT, RTR and RTS with the attributes rdma_cm computes, and establish.
func (d *Device) Connect(ctx context.Context, qp rdma.QueuePair, addr string, privateData []byte) ([]byte, error) {
	q, ok := qp.(*queuePair)
	if !ok || q.dev != d {
		return nil, fmt.Errorf("verbs: connect: queue pair of another device: %w", rdma.ErrInvalidArgument)
	}
	if len(privateData) > rdma.MaxConnectPrivateData {
		return nil, fmt.Errorf("verbs: connect: %d bytes of private data: %w", len(privateData), rdma.ErrInvalidArgument)
	}
	if q.id != nil {
		return nil, fmt.Errorf("verbs: connect: %w", rdma.ErrInvalidState)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("verbs: connect %s: %w", addr, err)
	}
	var id *C.struct_rdma_cm_id
	if r, err := C.rdma_create_id(d.ec, &id, nil, C.RDMA_PS_TCP); r != 0 {
		return nil, fmt.Errorf("verbs: rdma_create_id: %w", err)
	}
	events := d.watch(id)
	fail := func(err error) ([]byte, error) {
		d.unwatch(id)
		C.rdma_destroy_id(id)
		return nil, fmt.Errorf("verbs: connect %s: %w", addr, err)
	}
	ch, cp := C.CString(host), C.CString(port)
	r := C.resolve(id, ch, cp, 2000)
	C.free(unsafe.Pointer(ch))
	C.free(unsafe.Pointer(cp))
	if r != 0 {
		return fail(syscall.Errno(r))
	}
	if _, err := waitEvent(ctx, events, C.RDMA_CM_EVENT_ADDR_RESOLVED); err != nil {
		return fail(err)
	}
	if r, err := C.rdma_resolve_route(id, 2000); r != 0 {
		return fail(err)
	}
	if _, err := waitEvent(ctx, events, C.RDMA_CM_EVENT_ROUTE_RESOLVED); err != nil {
		return fail(err)
	}
	if r := C.to_state(id, q.qp, C.IBV_QPS_INIT); r != 0 {
		return fail(fmt.Errorf("qp to INIT: %w", syscall.Errno(r)))
	}
	priv := C.CBytes(append([]byte{0}, privateData...))
	defer C.free(priv)
	if r := C.do_connect(id, unsafe.Add(priv, 1), C.int(len(privateData)), q.qp.qp_num); r != 0 {
		return fail(syscall.Errno(r))
	}
	ev, err := waitEvent(ctx, events, C.RDMA_CM_EVENT_CONNECT_RESPONSE)
	if err != nil {
		var rej *rdma.RejectError
		if errors.As(err, &rej) {
			d.unwatch(id)
			C.rdma_destroy_id(id)
			return nil, err
		}
		return fail(err)
	}
	for _, st := range []C.int{C.IBV_QPS_RTR, C.IBV_QPS_RTS} {
		if r := C.to_state(id, q.qp, st); r != 0 {
			C.rdma_reject(id, nil, 0)
			return fail(fmt.Errorf("qp to state %d: %w", st, syscall.Errno(r)))
		}
	}
	if r, err := C.rdma_establish(id); r != 0 {
		return fail(err)
	}
	q.id, q.events, q.remote = id, events, addr
	go q.watchDisconnect()
	return ev.priv, nil
}

type listener struct {
	dev  *Device
	id   *C.struct_rdma_cm_id
	reqs chan *connRequest
	done chan struct{}
	once sync.Once
	addr string
}

// Listen implements rdma.Device.
func (d *Device) Listen(ctx context.Context, addr string) (rdma.Listener, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("verbs: listen %s: %w", addr, err)
	}
	var id *C.struct_rdma_cm_id
	if r, err := C.rdma_create_id(d.ec, &id, nil, C.RDMA_PS_TCP); r != 0 {
		return nil, fmt.Errorf("verbs: rdma_create_id: %w", err)
	}
	ch, cp := C.CString(host), C.CString(port)
	r := C.bind_listen(id, ch, cp)
	C.free(unsafe.Pointer(ch))
	C.free(unsafe.Pointer(cp))
	if r != 0 {
		C.rdma_destroy_id(id)
		return nil, fmt.Errorf("verbs: listen %s: %w", addr, syscall.Errno(r))
	}
	buf := (*C.char)(C.malloc(64))
	defer C.free(unsafe.Pointer(buf))
	p := C.local_addr(id, buf, 64)
	l := &listener{dev: d, id: id, reqs: make(chan *connRequest), done: make(chan struct{}),
		addr: net.JoinHostPort(C.GoString(buf), fmt.Sprint(int(p)))}
	d.mu.Lock()
	d.listens[id] = l
	d.mu.Unlock()
	return l, nil
}

func (l *listener) Accept(ctx context.Context) (rdma.ConnRequest, error) {
	select {
	case r := <-l.reqs:
		return r, nil
	case <-l.done:
		return nil, fmt.Errorf("verbs: accept: %w", rdma.ErrClosed)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (l *listener) Addr() string { return l.addr }

func (l *listener) Close() error {
	l.once.Do(func() {
		close(l.done)
		l.dev.mu.Lock()
		delete(l.dev.listens, l.id)
		l.dev.mu.Unlock()
		C.rdma_destroy_id(l.id)
	})
	return nil
}

type connRequest struct {
	dev  *Device
	id   *C.struct_rdma_cm_id
	priv []byte
}

func (r *connRequest) PrivateData() []byte { return r.priv }

func (r *connRequest) RemoteAddr() string {
	buf := (*C.char)(C.malloc(64))
	defer C.free(unsafe.Pointer(buf))
	p := C.peer_addr(r.id, buf, 64)
	if p < 0 {
		return ""
	}
	return net.JoinHostPort(C.GoString(buf), fmt.Sprint(int(p)))
}

// Accept implements rdma.ConnRequest: INIT and RTR, rdma_accept, then RTS once
// the connection is established.
func (r *connRequest) Accept(qp rdma.QueuePair, privateData []byte) error {
	q, ok := qp.(*queuePair)
	if !ok || q.dev != r.dev {
		return fmt.Errorf("verbs: accept: queue pair of another device: %w", rdma.ErrInvalidArgument)
	}
	if len(privateData) > rdma.MaxAcceptPrivateData {
		return fmt.Errorf("verbs: accept: %d bytes of private data: %w", len(privateData), rdma.ErrInvalidArgument)
	}
	events := r.dev.watch(r.id)
	for _, st := range []C.int{C.IBV_QPS_INIT, C.IBV_QPS_RTR} {
		if rc := C.to_state(r.id, q.qp, st); rc != 0 {
			r.dev.unwatch(r.id)
			C.rdma_reject(r.id, nil, 0)
			return fmt.Errorf("verbs: accept: qp to state %d: %w", st, syscall.Errno(rc))
		}
	}
	priv := C.CBytes(append([]byte{0}, privateData...))
	defer C.free(priv)
	if rc := C.do_accept(r.id, unsafe.Add(priv, 1), C.int(len(privateData)), q.qp.qp_num); rc != 0 {
		r.dev.unwatch(r.id)
		return fmt.Errorf("verbs: rdma_accept: %w", syscall.Errno(rc))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := waitEvent(ctx, events, C.RDMA_CM_EVENT_ESTABLISHED); err != nil {
		r.dev.unwatch(r.id)
		return fmt.Errorf("verbs: accept: %w", err)
	}
	if rc := C.to_state(r.id, q.qp, C.IBV_QPS_RTS); rc != 0 {
		r.dev.unwatch(r.id)
		return fmt.Errorf("verbs: accept: qp to RTS: %w", syscall.Errno(rc))
	}
	q.id, q.events, q.remote = r.id, events, r.RemoteAddr()
	go q.watchDisconnect()
	return nil
}

func (r *connRequest) Reject(privateData []byte) error {
	if len(privateData) > rdma.MaxAcceptPrivateData {
		privateData = privateData[:rdma.MaxAcceptPrivateData]
	}
	priv := C.CBytes(append([]byte{0}, privateData...))
	defer C.free(priv)
	rc, err := C.rdma_reject(r.id, unsafe.Add(priv, 1), C.uint8_t(len(privateData)))
	C.rdma_destroy_id(r.id)
	if rc != 0 {
		return fmt.Errorf("verbs: rdma_reject: %w", err)
	}
	return nil
}
