package stream

import (
	"net"
	"sync/atomic"
)

// directThreshold is the size from which payload bytes are read from the socket
// straight into their destination. Smaller remainders are read through the frame
// buffer so that one system call can bring in many small frames.
const directThreshold = 8 << 10

// frameReader reads frames from a connection: headers through a buffer, payloads
// straight into registered memory (only bytes that arrived together with a header
// are copied out of the buffer).
type frameReader struct {
	conn     net.Conn
	buf      []byte
	r, w     int
	progress *atomic.Uint64 // counts reads, for the retry watchdog
}

func newFrameReader(conn net.Conn, progress *atomic.Uint64) *frameReader {
	return &frameReader{conn: conn, buf: make([]byte, 64<<10), progress: progress}
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
			n, err := rd.conn.Read(rd.buf[rd.w:])
			rd.w += n
			rd.progress.Add(1)
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
			m, err := rd.conn.Read(dst)
			rd.progress.Add(1)
			dst = dst[m:]
			if err != nil && len(dst) > 0 {
				return err
			}
			continue
		}
		rd.r, rd.w = 0, 0
		m, err := rd.conn.Read(rd.buf)
		rd.progress.Add(1)
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
			m, err := rd.conn.Read(rd.buf)
			rd.progress.Add(1)
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
