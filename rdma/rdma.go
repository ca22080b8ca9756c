package rdma

import (
	"context"
	"errors"
	"time"
)

// Device is an open RDMA device: an ibv_context together with the connection
// manager (rdma_cm) that sets up its queue pairs. A Device is safe for concurrent use.
type Device interface {
	// Name returns the transport's name ("tcp", "shm", "verbs").
	Name() string
	// AllocPD allocates a protection domain (ibv_alloc_pd).
	AllocPD() (ProtectionDomain, error)
	// CreateCQ creates a completion queue with room for at least depth entries
	// (ibv_create_cq).
	CreateCQ(depth int) (CompletionQueue, error)
	// Listen starts accepting connection requests on addr (rdma_listen).
	Listen(ctx context.Context, addr string) (Listener, error)
	// Connect connects qp, which must be in state RESET or INIT, to the listener at
	// addr (rdma_connect), passing privateData (at most MaxConnectPrivateData bytes)
	// and returning the private data the peer accepted with. On return without
	// error the queue pair is in state RTS.
	Connect(ctx context.Context, qp QueuePair, addr string, privateData []byte) ([]byte, error)
	// Close releases the device. Objects created from it must be closed first.
	Close() error
}

// ProtectionDomain groups memory regions, memory windows and queue pairs: a remote
// access through a queue pair reaches only regions of the queue pair's domain.
type ProtectionDomain interface {
	// RegisterMemory registers the whole of mem with the given access rights
	// (ibv_reg_mr). Register once and reuse the region: never per I/O.
	RegisterMemory(mem *Memory, access AccessFlags) (MemoryRegion, error)
	// AllocMW allocates a type 2 memory window (ibv_alloc_mw), which a queue pair
	// binds to part of a memory region to grant one peer revocable remote access.
	AllocMW() (MemoryWindow, error)
	// CreateQP creates a reliable-connected queue pair (ibv_create_qp, IBV_QPT_RC).
	CreateQP(attr QPAttr) (QueuePair, error)
	// Close deallocates the domain (ibv_dealloc_pd).
	Close() error
}

// MemoryRegion is registered memory (struct ibv_mr).
type MemoryRegion interface {
	// Addr is the virtual address of the region's first byte.
	Addr() uint64
	// Len is the region's length in bytes.
	Len() int
	// LKey is the key local work requests name the region by.
	LKey() uint32
	// RKey is the key remote peers name the region by.
	RKey() uint32
	// Access returns the rights the region was registered with.
	Access() AccessFlags
	// Bytes returns the region's memory.
	Bytes() []byte
	// Deregister invalidates the region's keys (ibv_dereg_mr). It waits for remote
	// accesses in progress; later ones fail with REM_ACCESS_ERR. It fails while
	// memory windows are bound to the region.
	Deregister() error
}

// MemoryWindow is a type 2 memory window (struct ibv_mw): once bound by a queue pair
// to a range of a memory region it grants remote access to that range, with its own
// rights, through that queue pair only, until it is invalidated or rebound.
type MemoryWindow interface {
	// RKey returns the key of the current binding, or 0 when unbound.
	RKey() uint32
	// Close invalidates and deallocates the window (ibv_dealloc_mw).
	Close() error
}

// QPAttr are the attributes a queue pair is created with.
type QPAttr struct {
	SendCQ    CompletionQueue // completions of send work requests
	RecvCQ    CompletionQueue // completions of receive work requests
	MaxSendWR int             // send queue depth (default 128)
	MaxRecvWR int             // receive queue depth (default 128)
	MaxSGE    int             // scatter-gather entries per work request (default 16)
	SignalAll bool            // every send request completes, signaled or not (sq_sig_all)
	// RetryTimeout bounds how long requests stay outstanding while the peer sends
	// nothing before they fail with RETRY_EXC_ERR (default 10s).
	RetryTimeout time.Duration
	// RNRTimeout bounds how long a SEND this queue pair receives waits for a posted
	// receive before the sender's request fails with RNR_RETRY_EXC_ERR (default 1s).
	RNRTimeout time.Duration
}

// Defaults for the zero values of QPAttr.
const (
	DefaultMaxWR        = 128
	DefaultMaxSGE       = 16
	MaxSGELimit         = 32
	DefaultRetryTimeout = 10 * time.Second
	DefaultRNRTimeout   = time.Second
)

// WithDefaults returns a copy of a with zero fields set to their defaults.
func (a QPAttr) WithDefaults() QPAttr {
	if a.MaxSendWR <= 0 {
		a.MaxSendWR = DefaultMaxWR
	}
	if a.MaxRecvWR <= 0 {
		a.MaxRecvWR = DefaultMaxWR
	}
	if a.MaxSGE <= 0 {
		a.MaxSGE = DefaultMaxSGE
	}
	if a.RetryTimeout <= 0 {
		a.RetryTimeout = DefaultRetryTimeout
	}
	if a.RNRTimeout <= 0 {
		a.RNRTimeout = DefaultRNRTimeout
	}
	return a
}

// QueuePair is a reliable-connected queue pair: a send queue and a receive queue
// whose work requests complete in the order they were posted, each queue on its
// completion queue.
type QueuePair interface {
	// Num is the queue pair number, unique within the device.
	Num() uint32
	// State returns the current state.
	State() QPState
	// PostSend posts send work requests in order (ibv_post_send). It fails without
	// posting anything when a request is malformed or the send queue lacks room.
	// Requests posted on a queue pair in state ERR complete with WR_FLUSH_ERR.
	PostSend(wrs []SendWR) error
	// PostRecv posts receive work requests in order (ibv_post_recv).
	PostRecv(wrs []RecvWR) error
	// BindMW binds mw to [addr, addr+length) of mr with the given remote rights for
	// use through this queue pair only, and returns the window's new rkey. A
	// previous binding of mw is invalidated first.
	BindMW(mw MemoryWindow, mr MemoryRegion, addr uint64, length uint64, access AccessFlags) (uint32, error)
	// InvalidateMW revokes mw's current binding (IBV_WR_LOCAL_INV): it waits for
	// remote accesses in progress, and later ones fail with REM_ACCESS_ERR.
	InvalidateMW(mw MemoryWindow) error
	// Disconnected is closed when the queue pair leaves RTS: the peer disconnected,
	// the connection failed, or an error moved it to ERR.
	Disconnected() <-chan struct{}
	// RemoteAddr returns the peer's address once connected.
	RemoteAddr() string
	// Close disconnects (rdma_disconnect) and destroys the queue pair; outstanding
	// work requests complete with WR_FLUSH_ERR.
	Close() error
}

// CompletionQueue collects work completions (struct ibv_cq with its completion
// channel). One goroutine at a time should Wait on a queue.
type CompletionQueue interface {
	// Poll moves up to len(wcs) completions into wcs and returns how many
	// (ibv_poll_cq). It never blocks.
	Poll(wcs []WorkCompletion) int
	// Wait blocks until the queue holds at least one completion or ctx ends
	// (ibv_req_notify_cq + ibv_get_cq_event).
	Wait(ctx context.Context) error
	// Close destroys the queue (ibv_destroy_cq).
	Close() error
}

// Listener accepts connection requests (an rdma_cm listening id).
type Listener interface {
	// Accept waits for the next connection request.
	Accept(ctx context.Context) (ConnRequest, error)
	// Addr returns the address the listener is bound to.
	Addr() string
	// Close stops listening.
	Close() error
}

// ConnRequest is a connection request received by a Listener
// (RDMA_CM_EVENT_CONNECT_REQUEST). Answer it with Accept or Reject.
type ConnRequest interface {
	// PrivateData returns the private data the peer connected with.
	PrivateData() []byte
	// RemoteAddr returns the peer's address.
	RemoteAddr() string
	// Accept connects qp, in state RESET or INIT, to the peer (rdma_accept) with
	// privateData (at most MaxAcceptPrivateData bytes). On success qp is in RTS.
	Accept(qp QueuePair, privateData []byte) error
	// Reject refuses the request (rdma_reject); the peer's Connect fails with
	// ErrRejected and the private data.
	Reject(privateData []byte) error
}

// Errors returned by the verbs calls. Work request failures are reported through
// completions with a WCStatus, not through these.
var (
	// ErrRejected is returned by Connect when the peer rejected the request. A
	// *RejectError carries the peer's private data.
	ErrRejected = errors.New("rdma: connection rejected by peer")
	// ErrQueueFull is returned by PostSend/PostRecv when a queue lacks room.
	ErrQueueFull = errors.New("rdma: work queue full")
	// ErrInvalidWR is returned for a malformed work request.
	ErrInvalidWR = errors.New("rdma: invalid work request")
	// ErrInvalidState is returned for an operation the queue pair's state forbids.
	ErrInvalidState = errors.New("rdma: invalid queue pair state")
	// ErrClosed is returned for an operation on a closed object.
	ErrClosed = errors.New("rdma: closed")
	// ErrBusy is returned when a resource is still in use, such as a memory
	// region with bound windows.
	ErrBusy = errors.New("rdma: resource busy")
	// ErrInvalidArgument is returned for an argument out of range.
	ErrInvalidArgument = errors.New("rdma: invalid argument")
)

// RejectError is the error Connect returns when the peer rejected the request.
type RejectError struct {
	PrivateData []byte
}

func (e *RejectError) Error() string { return ErrRejected.Error() }

// Unwrap lets errors.Is(err, ErrRejected) match.
func (e *RejectError) Unwrap() error { return ErrRejected }
