package stream

import (
	"io"
	"runtime"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// directThreshold is the size from which payload bytes are read from the socket
// straight into their destination. Smaller remainders are read through the frame
// buffer so that one system call can bring in many small frames.
const directThreshold = 8 << 10

// frameReader reads frames from a connection: headers through a buffer, payloads
// straight into registered memory (only bytes that arrived together with a header
// are copied out of the buffer).
//
// Reads are non-blocking system calls made through the connection's RawConn, so
// that the reader knows when it is about to wait for input: it calls idle when
// a read finds the socket empty, just before it parks, and otherwise after every
// idleBytes read, at the end of the stream and on errors. The queue pair
// delivers completion notifications there: the goroutine they wake runs on this
// thread as soon as the reader parks, and the completions of a burst of
// responses wake a waiter once rather than once per read.
type frameReader struct {
	raw      syscall.RawConn
	fd       int // a detached socket read with blocking reads (sock.go), or -1
	buf      []byte
	r, w     int
	progress *atomic.Uint64 // counts reads, for the retry watchdog
	idle     func()         // called before parking (may be nil); see above
	unidled  int            // bytes read since idle was last called

	// The read in progress, for readFn: destination, bytes the stream
	// still owes it (want), result.
	p      []byte
	want   int
	n      int
	err    error
	readFn func(fd uintptr) bool

	// yielded is when a reader of a detached socket last passed through the
	// scheduler (see yieldEvery).
	yielded time.Time

	// lowat is the socket's SO_RCVLOWAT: 1, or raised while a large
	// payload arrives so that the reader is woken once per lowat bytes
	// rather than once per loopback segment (64 KiB). 0 means the socket
	// refused it (not TCP): it is not tried again.
	lowat int
}

// Receive low-water marks for large payloads: a payload of at least
// lowatMin bytes still to come parks the reader until min(rest, lowatMax)
// bytes are there. Every bit of a payload that was announced arrives, so
// waiting for part of it cannot stall.
const (
	// idleBytes bounds how much a reader that never finds its socket empty
	// reads before it delivers completion notifications anyway.
	idleBytes = 256 << 10

	// yieldEvery is how often a reader of a detached socket, which never
	// parks, passes through the scheduler. The runtime's monitor takes a
	// goroutine that the scheduler has not switched for 10 ms for one that
	// hogs its processor: it interrupts the thread with a signal and takes
	// its processor away, and then polls every 20 µs for a millisecond. With
	// the reader asleep in recv(2) most of that time, that cost a chunkd
	// about one nanosleep per request under a 4 KiB random-read load. A
	// yield is not free either (it wakes an idle thread): every millisecond,
	// yields took 13% of a chunkd's CPU in that load.
	yieldEvery = 5 * time.Millisecond

	// waitAllMax bounds a detached reader's MSG_WAITALL receive, so that
	// the retry watchdog sees progress while a large payload trickles in.
	waitAllMax = 256 << 10

	lowatMin = 128 << 10
	lowatMax = 512 << 10
)

// newFrameReader returns a reader of raw through the network poller, or of the
// detached socket fd when fd >= 0 (then raw is unused).
func newFrameReader(raw syscall.RawConn, fd int, progress *atomic.Uint64, idle func()) *frameReader {
	rd := &frameReader{raw: raw, fd: fd, buf: make([]byte, 64<<10), progress: progress, idle: idle, lowat: 1}
	rd.readFn = rd.tryRead
	return rd
}

// read reads into p like net.Conn.Read: at least one byte, or an error. want
// is how many bytes the stream is known to hold for the reader (at least 1).
func (rd *frameReader) read(p []byte, want int) (int, error) {
	if rd.fd >= 0 {
		return rd.readDetached(p, want)
	}
	rd.p, rd.want, rd.n, rd.err = p, want, 0, nil
	err := rd.raw.Read(rd.readFn)
	rd.p = nil
	rd.progress.Add(1)
	if err != nil {
		return 0, err
	}
	return rd.n, rd.err
}

// readDetached is read for a detached socket: one recv(2) that sleeps until
// input arrives. The reader cannot tell beforehand whether it will sleep, so
// it delivers completion notifications before every read, which still wakes a
// waiter once per burst of responses that one read brought in.
//
// A read of bytes the stream owes in full (a payload read straight into its
// destination) waits for all of them, up to waitAllMax (MSG_WAITALL): a few
// system calls per payload. The receive low-water mark is not used here: a
// reader asleep in recv(2) that has already copied part of its target is
// woken only once the socket holds a whole low-water mark more, which the
// peer's window may never allow (seen: 1 MiB RDMA_WRITEs stalled for seconds).
func (rd *frameReader) readDetached(p []byte, want int) (int, error) {
	if rd.idle != nil {
		rd.idle()
	}
	if now := time.Now(); now.Sub(rd.yielded) >= yieldEvery {
		rd.yielded = now
		runtime.Gosched()
	}
	all := want >= len(p)
	if all && len(p) > waitAllMax {
		p = p[:waitAllMax]
	}
	for {
		n, err := recvBlocking(rd.fd, p, all)
		rd.progress.Add(1)
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return 0, err
		case n == 0:
			return 0, io.EOF
		}
		return n, nil
	}
}

// tryRead is the RawConn callback of read: one non-blocking read(2). It reports
// false, making the caller wait for input, when the socket is empty.
func (rd *frameReader) tryRead(fd uintptr) bool {
	for {
		n, err := rawRead(fd, rd.p)
		if rd.idle != nil {
			if n > 0 {
				rd.unidled += n
			}
			if n <= 0 || rd.unidled >= idleBytes {
				rd.unidled = 0
				rd.idle()
			}
		}
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			rd.setLowat(int(fd))
			return false
		case err != nil:
			rd.err = err
		case n == 0:
			rd.err = io.EOF
		default:
			rd.n = n
		}
		return true
	}
}

// setLowat sets the socket's receive low-water mark for the read about to
// park: raised for a large payload, back to 1 otherwise.
func (rd *frameReader) setLowat(fd int) {
	if rd.lowat == 0 {
		return
	}
	v := 1
	if rd.want >= lowatMin {
		v = min(rd.want, lowatMax)
	}
	if v == rd.lowat {
		return
	}
	if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVLOWAT, v) != nil {
		rd.lowat = 0
		return
	}
	rd.lowat = v
}

func (rd *frameReader) buffered() int { return rd.w - rd.r }

// header returns the next headerSize bytes; they stay valid until the next call.
func (rd *frameReader) header() ([]byte, error) {
	if rd.w-rd.r < headerSize {
		if rd.r == rd.w {
			rd.r, rd.w = 0, 0
		} else if len(rd.buf)-rd.r < headerSize {
			rd.w = copy(rd.buf, rd.buf[rd.r:rd.w])
			rd.r = 0
		}
		for rd.w-rd.r < headerSize {
			n, err := rd.read(rd.buf[rd.w:], 1)
			rd.w += n
			if err != nil && rd.w-rd.r < headerSize {
				return nil, err
			}
		}
	}
	b := rd.buf[rd.r : rd.r+headerSize]
	rd.r += headerSize
	return b, nil
}

// readInto fills dst with the next len(dst) bytes of the stream.
func (rd *frameReader) readInto(dst []byte) error {
	n := copy(dst, rd.buf[rd.r:rd.w])
	rd.r += n
	dst = dst[n:]
	for len(dst) > 0 {
		if len(dst) >= directThreshold {
			m, err := rd.read(dst, len(dst))
			dst = dst[m:]
			if err != nil && len(dst) > 0 {
				return err
			}
			continue
		}
		rd.r, rd.w = 0, 0
		m, err := rd.read(rd.buf, len(dst))
		rd.w = m
		c := copy(dst, rd.buf[:m])
		rd.r = c
		dst = dst[c:]
		if err != nil && len(dst) > 0 {
			return err
		}
	}
	return nil
}

// scatter fills the segments in order with n bytes of the stream; the segments
// hold at least n bytes.
func (rd *frameReader) scatter(segs [][]byte, n uint32) error {
	left := int(n)
	for _, s := range segs {
		if left == 0 {
			break
		}
		if len(s) > left {
			s = s[:left]
		}
		if err := rd.readInto(s); err != nil {
			return err
		}
		left -= len(s)
	}
	return nil
}

// discard skips n bytes of the stream.
func (rd *frameReader) discard(n uint32) error {
	left := int(n)
	for left > 0 {
		if rd.r == rd.w {
			rd.r, rd.w = 0, 0
			m, err := rd.read(rd.buf, min(left, len(rd.buf)))
			rd.w = m
			if err != nil && m == 0 {
				return err
			}
		}
		k := min(left, rd.w-rd.r)
		rd.r += k
		left -= k
	}
	return nil
}

// rawRead is read(2) as a raw system call, for a non-blocking socket: see
// sockWriter.writev for why.
func rawRead(fd uintptr, p []byte) (int, error) {
	r, _, errno := unix.RawSyscall(unix.SYS_READ, fd, uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)))
	if errno != 0 {
		return -1, errno
	}
	return int(r), nil
}
