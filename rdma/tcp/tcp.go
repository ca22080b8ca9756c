// Package tcp is software RDMA over TCP, the transport that runs anywhere: the role
// soft-iWARP plays in the kernel, in user space. Each queue pair is one TCP
// connection. The target's engine executes RDMA_READ and RDMA_WRITE against its
// table of registered memory — key, protection domain, window binding, access rights
// and bounds checked — without calling into the application; payloads are gathered
// from the SGEs with writev and received straight into the target memory.
//
// Errors follow verbs and iWARP: a request the target refuses completes on the
// initiator with the target's status (REM_ACCESS_ERR, REM_INV_REQ_ERR,
// RNR_RETRY_EXC_ERR, ...), and the connection terminates, moving both queue pairs to
// ERR and flushing what was outstanding with WR_FLUSH_ERR.
package tcp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmafs/rdmafs/rdma"
	"github.com/rdmafs/rdmafs/rdma/internal/soft"
)

// Options configure the transport.
type Options struct {
	// HandshakeTimeout bounds connection setup when the context sets no deadline
	// (default 10s).
	HandshakeTimeout time.Duration
}

// Device is the tcp transport's device.
type Device struct {
	opts Options
	keys *soft.Keys
	qpn  atomic.Uint32
}

// Open opens a tcp transport device.
func Open(opts Options) (*Device, error) {
	if opts.HandshakeTimeout <= 0 {
		opts.HandshakeTimeout = 10 * time.Second
	}
	return &Device{opts: opts, keys: soft.NewKeys()}, nil
}

// Name implements rdma.Device.
func (d *Device) Name() string { return "tcp" }

// AllocPD implements rdma.Device.
func (d *Device) AllocPD() (rdma.ProtectionDomain, error) {
	return soft.NewPD(d.keys, d.newQP), nil
}

// CreateCQ implements rdma.Device.
func (d *Device) CreateCQ(depth int) (rdma.CompletionQueue, error) {
	return soft.NewCQ(depth), nil
}

// Close implements rdma.Device.
func (d *Device) Close() error { return nil }

func (d *Device) deadline(ctx context.Context) time.Time {
	if dl, ok := ctx.Deadline(); ok {
		return dl
	}
	return time.Now().Add(d.opts.HandshakeTimeout)
}

// Connect implements rdma.Device.
func (d *Device) Connect(ctx context.Context, qp rdma.QueuePair, addr string, privateData []byte) ([]byte, error) {
	q, ok := qp.(*queuePair)
	if !ok || q.dev != d {
		return nil, fmt.Errorf("tcp: connect: queue pair of another device: %w", rdma.ErrInvalidArgument)
	}
	if len(privateData) > rdma.MaxConnectPrivateData {
		return nil, fmt.Errorf("tcp: connect: %d bytes of private data, max %d: %w", len(privateData), rdma.MaxConnectPrivateData, rdma.ErrInvalidArgument)
	}
	if st := q.State(); st != rdma.QPStateInit {
		return nil, fmt.Errorf("tcp: connect qp %d in state %v: %w", q.num, st, rdma.ErrInvalidState)
	}
	var dialer net.Dialer
	conn, err := dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("tcp: connect %s: %w", addr, err)
	}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()
	conn.SetDeadline(d.deadline(ctx))
	hello := handshake{kind: kindHello, qpn: q.num, rnrTimeoutMS: uint32(q.attr.RNRTimeout / time.Millisecond), private: privateData}
	if _, err := conn.Write(hello.encode()); err != nil {
		conn.Close()
		return nil, fmt.Errorf("tcp: connect %s: send hello: %w", addr, err)
	}
	reply, err := readHandshake(conn)
	if err != nil {
		conn.Close()
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return nil, fmt.Errorf("tcp: connect %s: %w", addr, err)
	}
	switch reply.kind {
	case kindReject:
		conn.Close()
		return nil, &rejectError{addr: addr, RejectError: rdma.RejectError{PrivateData: reply.private}}
	case kindAccept:
	default:
		conn.Close()
		return nil, fmt.Errorf("tcp: connect %s: %w: unexpected handshake kind %d", addr, errBadFrame, reply.kind)
	}
	conn.SetDeadline(time.Time{})
	if err := q.start(conn, time.Duration(reply.rnrTimeoutMS)*time.Millisecond); err != nil {
		conn.Close()
		return nil, err
	}
	return reply.private, nil
}

type rejectError struct {
	addr string
	rdma.RejectError
}

func (e *rejectError) Error() string { return "tcp: connect " + e.addr + ": " + e.RejectError.Error() }

// Unwrap exposes the *rdma.RejectError (and through it rdma.ErrRejected).
func (e *rejectError) Unwrap() error { return &e.RejectError }

func readHandshake(conn net.Conn) (handshake, error) {
	var m handshake
	fixed := make([]byte, handshakeFixed, handshakeFixed+maxPrivateData)
	if _, err := io.ReadFull(conn, fixed); err != nil {
		return m, fmt.Errorf("read handshake: %w", err)
	}
	n, err := m.decodeFixed(fixed)
	if err != nil {
		return m, err
	}
	if n > 0 {
		m.private = make([]byte, n)
		if _, err := io.ReadFull(conn, m.private); err != nil {
			return m, fmt.Errorf("read handshake private data: %w", err)
		}
	}
	return m, nil
}

// Listen implements rdma.Device.
func (d *Device) Listen(ctx context.Context, addr string) (rdma.Listener, error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("tcp: listen %s: %w", addr, err)
	}
	l := &listener{dev: d, ln: ln, reqs: make(chan *connRequest), done: make(chan struct{})}
	go l.acceptLoop()
	return l, nil
}

type listener struct {
	dev  *Device
	ln   net.Listener
	reqs chan *connRequest
	done chan struct{}
	once sync.Once
}

func (l *listener) acceptLoop() {
	for {
		conn, err := l.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			select {
			case <-l.done:
				return
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		go l.handshake(conn)
	}
}

// handshake reads a peer's hello and hands the request to Accept; a peer that
// does not complete its hello in time, or sends garbage, is dropped.
func (l *listener) handshake(conn net.Conn) {
	conn.SetDeadline(time.Now().Add(l.dev.opts.HandshakeTimeout))
	hello, err := readHandshake(conn)
	if err != nil || hello.kind != kindHello || len(hello.private) > rdma.MaxConnectPrivateData {
		conn.Close()
		return
	}
	conn.SetDeadline(time.Time{})
	req := &connRequest{l: l, conn: conn, hello: hello}
	select {
	case l.reqs <- req:
	case <-l.done:
		conn.Close()
	}
}

// Accept implements rdma.Listener.
func (l *listener) Accept(ctx context.Context) (rdma.ConnRequest, error) {
	select {
	case req := <-l.reqs:
		return req, nil
	case <-l.done:
		return nil, fmt.Errorf("tcp: accept: %w", rdma.ErrClosed)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Addr implements rdma.Listener.
func (l *listener) Addr() string { return l.ln.Addr().String() }

// Close implements rdma.Listener.
func (l *listener) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.ln.Close()
}

type connRequest struct {
	l     *listener
	conn  net.Conn
	hello handshake
	once  sync.Once
}

// PrivateData implements rdma.ConnRequest.
func (r *connRequest) PrivateData() []byte { return r.hello.private }

// RemoteAddr implements rdma.ConnRequest.
func (r *connRequest) RemoteAddr() string { return r.conn.RemoteAddr().String() }

// Accept implements rdma.ConnRequest.
func (r *connRequest) Accept(qp rdma.QueuePair, privateData []byte) error {
	q, ok := qp.(*queuePair)
	if !ok || q.dev != r.l.dev {
		return fmt.Errorf("tcp: accept: queue pair of another device: %w", rdma.ErrInvalidArgument)
	}
	if len(privateData) > rdma.MaxAcceptPrivateData {
		return fmt.Errorf("tcp: accept: %d bytes of private data, max %d: %w", len(privateData), rdma.MaxAcceptPrivateData, rdma.ErrInvalidArgument)
	}
	if st := q.State(); st != rdma.QPStateInit {
		return fmt.Errorf("tcp: accept on qp %d in state %v: %w", q.num, st, rdma.ErrInvalidState)
	}
	reply := handshake{kind: kindAccept, qpn: q.num, rnrTimeoutMS: uint32(q.attr.RNRTimeout / time.Millisecond), private: privateData}
	r.conn.SetWriteDeadline(time.Now().Add(r.l.dev.opts.HandshakeTimeout))
	if _, err := r.conn.Write(reply.encode()); err != nil {
		r.conn.Close()
		return fmt.Errorf("tcp: accept %s: %w", r.RemoteAddr(), err)
	}
	r.conn.SetWriteDeadline(time.Time{})
	return q.start(r.conn, time.Duration(r.hello.rnrTimeoutMS)*time.Millisecond)
}

// Reject implements rdma.ConnRequest.
func (r *connRequest) Reject(privateData []byte) error {
	if len(privateData) > rdma.MaxAcceptPrivateData {
		privateData = privateData[:rdma.MaxAcceptPrivateData]
	}
	reply := handshake{kind: kindReject, private: privateData}
	r.conn.SetWriteDeadline(time.Now().Add(r.l.dev.opts.HandshakeTimeout))
	_, err := r.conn.Write(reply.encode())
	r.conn.Close()
	if err != nil {
		return fmt.Errorf("tcp: reject %s: %w", r.RemoteAddr(), err)
	}
	return nil
}

var _ rdma.Device = (*Device)(nil)
