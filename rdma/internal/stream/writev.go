package stream

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// writevOnce makes one non-blocking writev of q.wIOV (at most IOV_MAX entries) and
// returns the bytes written; a socket that would block writes 0 without error.
// On a detached socket (q.fd >= 0) wait makes it sleep until the socket takes
// the bytes instead. The caller holds q.wmu. Nothing is allocated: the iovec
// array, the message header and the callback live in the queue pair.
func (q *queuePair) writevOnce(wait bool) (int, error) {
	iov := q.iovecs[:0]
	for _, b := range q.wIOV {
		if len(b) == 0 {
			continue
		}
		if len(iov) == 1024 {
			break
		}
		iov = append(iov, unix.Iovec{Base: unsafe.SliceData(b), Len: uint64(len(b))})
	}
	q.iovecs = iov
	if len(iov) == 0 {
		return 0, nil
	}
	if q.fd >= 0 {
		n, err := sendmsg(q.fd, &q.msg, iov, wait)
		clear(iov)
		return n, err
	}
	q.wn, q.werr = 0, nil
	err := q.raw.Write(q.writevFn)
	clear(iov) // drop the pointers into memory that may be freed
	if err != nil {
		return q.wn, err
	}
	return q.wn, q.werr
}

// writev is the raw-connection callback of writevOnce: one attempt, never a wait.
//
// It is a raw system call (no entersyscall/exitsyscall): the socket is
// non-blocking, so the call never waits, and a system call the runtime knows of
// wakes the runtime's monitor thread whenever the process was idle — in a
// chunkd serving one request at a time, that was a futex wake, a context switch
// and a 20 µs nanosleep per request (perf: about 7% of the machine's CPU in a 4
// KiB random read load).
func (q *queuePair) writev(fd uintptr) bool {
	r, _, errno := unix.RawSyscall(unix.SYS_WRITEV, fd, uintptr(unsafe.Pointer(unsafe.SliceData(q.iovecs))), uintptr(len(q.iovecs)))
	switch errno {
	case 0:
		q.wn = int(r)
	case unix.EAGAIN, unix.EINTR:
	default:
		q.werr = errno
	}
	return true
}
