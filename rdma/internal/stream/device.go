// Package stream is software RDMA over byte streams, the engine of the tcp and shm
// transports: the role soft-iWARP plays in the kernel, in user space. Each queue
// pair is one connection, TCP or unix. The target's engine executes RDMA_READ and RDMA_WRITE against its
// table of registered memory — key, protection domain, window binding, access rights
// and bounds checked — without calling into the application; payloads are gathered
// from the SGEs with writev and received straight into the target memory.
//
// Errors follow verbs and iWARP: a request the target refuses completes on the
// initiator with the target's status (REM_ACCESS_ERR, REM_INV_REQ_ERR,
// RNR_RETRY_EXC_ERR, ...), and the connection terminates, moving both queue pairs to
// ERR and flushing what was outstanding with WR_FLUSH_ERR.
package stream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmafs/rdmafs/rdma"
	"github.com/rdmafs/rdmafs/rdma/internal/soft"
)

// Mode says which sockets a device uses.
type Mode int

// The modes.
const (
	// ModeTCP carries every queue pair over TCP.
	ModeTCP Mode = iota
	// ModeShm carries queue pairs over unix sockets and executes RDMA_READ and
	// RDMA_WRITE as checked copies through shared memory.
	ModeShm
	// ModeAuto listens on TCP and on a unix socket named after the TCP port, and
	// connects through shared memory when the peer is on this host, TCP otherwise.
	ModeAuto
)

// Options configure a device.
type Options struct {
	// Name is the transport's name, as Device.Name reports it.
	Name string
	// Mode selects the sockets.
	Mode Mode
	// HandshakeTimeout bounds connection setup when the context sets no deadline
	// (default 10s).
	HandshakeTimeout time.Duration
	// Logger receives one line per transport choice in ModeAuto (default: none).
	Logger *slog.Logger
}

// Device is a software RDMA device whose queue pairs are byte streams.
type Device struct {
	opts   Options
	keys   *soft.Keys
	qpn    atomic.Uint32
	logged sync.Map // transport choices already logged, by peer
}

// Open opens a device.
func Open(opts Options) (*Device, error) {
	if opts.HandshakeTimeout <= 0 {
		opts.HandshakeTimeout = 10 * time.Second
	}
	if opts.Name == "" {
		opts.Name = "tcp"
	}
	return &Device{opts: opts, keys: soft.NewKeys()}, nil
}

// Name implements rdma.Device.
func (d *Device) Name() string { return d.opts.Name }

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

// ShmAddr returns the unix socket name a ModeAuto listener on TCP port port
// also listens on.
func ShmAddr(port string) string { return "@rdmafs-shm/port-" + port }

// isUnixAddr reports whether addr names a unix socket (a path or @abstract name).
func isUnixAddr(addr string) bool {
	return strings.HasPrefix(addr, "@") || strings.HasPrefix(addr, "/")
}

// dial connects to addr with the socket the mode calls for.
func (d *Device) dial(ctx context.Context, addr string) (net.Conn, error) {
	var dialer net.Dialer
	switch {
	case isUnixAddr(addr):
		return dialer.DialContext(ctx, "unix", addr)
	case d.opts.Mode == ModeShm:
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		if !isLocalHost(host) {
			return nil, fmt.Errorf("shm transport: %s is not on this host", addr)
		}
		return dialer.DialContext(ctx, "unix", ShmAddr(port))
	case d.opts.Mode == ModeAuto:
		if host, port, err := net.SplitHostPort(addr); err == nil && isLocalHost(host) {
			if conn, err := dialer.DialContext(ctx, "unix", ShmAddr(port)); err == nil {
				d.logChoice(addr, "shm")
				return conn, nil
			}
		}
		d.logChoice(addr, "tcp")
	}
	return dialer.DialContext(ctx, "tcp", addr)
}

func (d *Device) logChoice(addr, transport string) {
	if d.opts.Logger == nil {
		return
	}
	if _, seen := d.logged.LoadOrStore(addr, transport); !seen {
		d.opts.Logger.Info("rdma transport chosen", "peer", addr, "transport", transport)
	}
}

// isLocalHost reports whether host names this machine: a loopback address or one
// of its interfaces' addresses.
func isLocalHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	if ip == nil {
		return false
	}
	if ip.IsLoopback() {
		return true
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return false
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.Equal(ip) {
			return true
		}
	}
	return false
}

// Connect implements rdma.Device.
func (d *Device) Connect(ctx context.Context, qp rdma.QueuePair, addr string, privateData []byte) ([]byte, error) {
	q, ok := qp.(*queuePair)
	if !ok || q.dev != d {
		return nil, fmt.Errorf("rdma: connect: queue pair of another device: %w", rdma.ErrInvalidArgument)
	}
	if len(privateData) > rdma.MaxConnectPrivateData {
		return nil, fmt.Errorf("rdma: connect: %d bytes of private data, max %d: %w", len(privateData), rdma.MaxConnectPrivateData, rdma.ErrInvalidArgument)
	}
	if st := q.State(); st != rdma.QPStateInit {
		return nil, fmt.Errorf("rdma: connect qp %d in state %v: %w", q.num, st, rdma.ErrInvalidState)
	}
	conn, err := d.dial(ctx, addr)
	if err != nil {
		return nil, fmt.Errorf("rdma: connect %s: %w", addr, err)
	}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()
	conn.SetDeadline(d.deadline(ctx))
	hello := handshake{kind: kindHello, qpn: q.num, rnrTimeoutMS: uint32(q.attr.RNRTimeout / time.Millisecond), private: privateData}
	if _, err := conn.Write(hello.encode()); err != nil {
		conn.Close()
		return nil, fmt.Errorf("rdma: connect %s: send hello: %w", addr, err)
	}
	reply, err := readHandshake(conn)
	if err == nil && reply.kind == kindAccept {
		err = q.receiveRegions(conn)
	}
	if err != nil {
		conn.Close()
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return nil, fmt.Errorf("rdma: connect %s: %w", addr, err)
	}
	switch reply.kind {
	case kindReject:
		conn.Close()
		return nil, &rejectError{addr: addr, RejectError: rdma.RejectError{PrivateData: reply.private}}
	case kindAccept:
	default:
		conn.Close()
		return nil, fmt.Errorf("rdma: connect %s: %w: unexpected handshake kind %d", addr, errBadFrame, reply.kind)
	}
	conn.SetDeadline(time.Time{})
	if err := q.start(conn, time.Duration(reply.rnrTimeoutMS)*time.Millisecond, false); err != nil {
		conn.Close()
		return nil, err
	}
	return reply.private, nil
}

type rejectError struct {
	addr string
	rdma.RejectError
}

func (e *rejectError) Error() string { return "rdma: connect " + e.addr + ": " + e.RejectError.Error() }

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

// Listen implements rdma.Device. In ModeAuto it listens on TCP addr and on the
// unix socket ShmAddr(port); in ModeShm on that unix socket only (or on addr
// itself when it names a unix socket).
func (d *Device) Listen(ctx context.Context, addr string) (rdma.Listener, error) {
	var lc net.ListenConfig
	l := &listener{dev: d, reqs: make(chan *connRequest), done: make(chan struct{})}
	listen := func(network, a string) error {
		ln, err := lc.Listen(ctx, network, a)
		if err != nil {
			return fmt.Errorf("rdma: listen %s %s: %w", network, a, err)
		}
		l.lns = append(l.lns, ln)
		return nil
	}
	var err error
	switch {
	case isUnixAddr(addr):
		err = listen("unix", addr)
	case d.opts.Mode == ModeShm:
		// Bind a TCP port only to reserve a unique number for the socket name.
		if err = listen("tcp", addr); err == nil {
			_, port, _ := net.SplitHostPort(l.lns[0].Addr().String())
			err = listen("unix", ShmAddr(port))
		}
	case d.opts.Mode == ModeAuto:
		if err = listen("tcp", addr); err == nil {
			_, port, _ := net.SplitHostPort(l.lns[0].Addr().String())
			err = listen("unix", ShmAddr(port))
		}
	default:
		err = listen("tcp", addr)
	}
	if err != nil {
		l.Close()
		return nil, err
	}
	for _, ln := range l.lns {
		go l.acceptLoop(ln)
	}
	return l, nil
}

type listener struct {
	dev  *Device
	lns  []net.Listener
	reqs chan *connRequest
	done chan struct{}
	once sync.Once
}

func (l *listener) acceptLoop(ln net.Listener) {
	for {
		conn, err := ln.Accept()
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
		return nil, fmt.Errorf("rdma: accept: %w", rdma.ErrClosed)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Addr implements rdma.Listener: the TCP address where there is one, so that a
// peer can connect with any mode.
func (l *listener) Addr() string { return l.lns[0].Addr().String() }

// Close implements rdma.Listener.
func (l *listener) Close() error {
	l.once.Do(func() { close(l.done) })
	var err error
	for _, ln := range l.lns {
		if cerr := ln.Close(); err == nil {
			err = cerr
		}
	}
	return err
}

type connRequest struct {
	l     *listener
	conn  net.Conn
	hello handshake
}

// PrivateData implements rdma.ConnRequest.
func (r *connRequest) PrivateData() []byte { return r.hello.private }

// RemoteAddr implements rdma.ConnRequest.
func (r *connRequest) RemoteAddr() string { return r.conn.RemoteAddr().String() }

// Accept implements rdma.ConnRequest.
func (r *connRequest) Accept(qp rdma.QueuePair, privateData []byte) error {
	q, ok := qp.(*queuePair)
	if !ok || q.dev != r.l.dev {
		return fmt.Errorf("rdma: accept: queue pair of another device: %w", rdma.ErrInvalidArgument)
	}
	if len(privateData) > rdma.MaxAcceptPrivateData {
		return fmt.Errorf("rdma: accept: %d bytes of private data, max %d: %w", len(privateData), rdma.MaxAcceptPrivateData, rdma.ErrInvalidArgument)
	}
	if st := q.State(); st != rdma.QPStateInit {
		return fmt.Errorf("rdma: accept on qp %d in state %v: %w", q.num, st, rdma.ErrInvalidState)
	}
	reply := handshake{kind: kindAccept, qpn: q.num, rnrTimeoutMS: uint32(q.attr.RNRTimeout / time.Millisecond), private: privateData}
	r.conn.SetWriteDeadline(time.Now().Add(r.l.dev.opts.HandshakeTimeout))
	if _, err := r.conn.Write(reply.encode()); err != nil {
		r.conn.Close()
		return fmt.Errorf("rdma: accept %s: %w", r.RemoteAddr(), err)
	}
	if err := q.sendRegions(r.conn); err != nil {
		r.conn.Close()
		return fmt.Errorf("rdma: accept %s: %w", r.RemoteAddr(), err)
	}
	r.conn.SetWriteDeadline(time.Time{})
	return q.start(r.conn, time.Duration(r.hello.rnrTimeoutMS)*time.Millisecond, true)
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
		return fmt.Errorf("rdma: reject %s: %w", r.RemoteAddr(), err)
	}
	return nil
}

var _ rdma.Device = (*Device)(nil)
