package perftest

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"time"
)

// The baseline: the same exchanges over a plain TCP socket in Go, written as well
// as we can write them. A request is a 16-byte header (op, size, sequence) followed,
// for write and send, by the payload; the answer is an 8-byte acknowledgement for
// write and send, the payload for read. The server coalesces answers: it flushes
// when no more requests are buffered, as the rdma target coalesces ACKs.
const baselineHeader = 16

const (
	baseWrite = 1
	baseRead  = 2
)

// ServeTCP answers baseline clients on ln until ctx ends.
func ServeTCP(ctx context.Context, ln net.Listener) error {
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("perftest: baseline accept: %w", err)
		}
		go serveTCPConn(conn)
	}
}

func serveTCPConn(conn net.Conn) {
	defer conn.Close()
	br := bufio.NewReaderSize(conn, 64<<10)
	bw := bufio.NewWriterSize(conn, 64<<10)
	buf := make([]byte, MaxSize)
	var hdr [baselineHeader]byte
	for {
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			return
		}
		op := binary.LittleEndian.Uint32(hdr[:])
		size := binary.LittleEndian.Uint32(hdr[4:])
		if size > MaxSize {
			return
		}
		switch op {
		case baseWrite:
			if _, err := io.ReadFull(br, buf[:size]); err != nil {
				return
			}
			bw.Write(hdr[8:16])
		case baseRead:
			bw.Write(buf[:size])
		default:
			return
		}
		if br.Buffered() == 0 {
			if err := bw.Flush(); err != nil {
				return
			}
		}
	}
}

// TCPClient is a connection to a baseline server.
type TCPClient struct {
	conn net.Conn
	br   *bufio.Reader
	buf  []byte
}

// DialTCP connects to a baseline server.
func DialTCP(ctx context.Context, addr string) (*TCPClient, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("perftest: baseline dial %s: %w", addr, err)
	}
	return &TCPClient{conn: conn, br: bufio.NewReaderSize(conn, 64<<10), buf: make([]byte, MaxSize)}, nil
}

// Close closes the connection.
func (c *TCPClient) Close() error { return c.conn.Close() }

// Run performs one measurement with the same window and batching as Client.Run:
// Depth requests outstanding, refilled Batch at a time with one write each.
func (c *TCPClient) Run(ctx context.Context, cfg Config) (Result, error) {
	if cfg.Size <= 0 || cfg.Size > MaxSize {
		return Result{}, fmt.Errorf("perftest: size %d outside 1..%d", cfg.Size, MaxSize)
	}
	cfg.Batch = max(1, min(cfg.Batch, cfg.Depth))
	op := uint32(baseWrite)
	if cfg.Op == OpRead {
		op = baseRead
	}
	if dl, ok := ctx.Deadline(); ok {
		c.conn.SetDeadline(dl)
		defer c.conn.SetDeadline(time.Time{})
	}
	hdrs := make([]byte, cfg.Depth*baselineHeader)
	iov := make([][]byte, 0, 2*cfg.Depth)
	var bufs net.Buffers
	w := newWindow(cfg)
	post := func(n int) error {
		iov = iov[:0]
		now := time.Now()
		for i := 0; i < n; i++ {
			seq := w.next(now)
			slot := int(seq % uint64(cfg.Depth))
			h := hdrs[slot*baselineHeader : (slot+1)*baselineHeader]
			binary.LittleEndian.PutUint32(h, op)
			binary.LittleEndian.PutUint32(h[4:], uint32(cfg.Size))
			binary.LittleEndian.PutUint64(h[8:], seq)
			iov = append(iov, h)
			if op == baseWrite {
				iov = append(iov, c.buf[:cfg.Size])
			}
		}
		bufs = iov
		_, err := bufs.WriteTo(c.conn)
		return err
	}
	resp := 8
	if op == baseRead {
		resp = cfg.Size
	}
	if err := w.begin(post); err != nil {
		return Result{}, err
	}
	for w.busy() {
		if _, err := io.ReadFull(c.br, c.buf[:resp]); err != nil {
			return Result{}, fmt.Errorf("perftest: baseline read: %w", err)
		}
		now := time.Now()
		if op == baseWrite && binary.LittleEndian.Uint64(c.buf) != w.done {
			return Result{}, fmt.Errorf("%w: ack %d, want %d", ErrBaseline, binary.LittleEndian.Uint64(c.buf), w.done)
		}
		w.complete(w.done, now)
		if err := w.refill(1, now); err != nil {
			return Result{}, err
		}
	}
	return w.result(), nil
}
