package posixcheck

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime/debug"
	"testing"

	"golang.org/x/sys/unix"
)

// The checker's mmap operations run in a helper process, this test binary
// started again with helperEnv set: the FUSE server of the mount runs in
// the test process, and a thread of that process blocked in a page fault
// on the mount (or in munmap, which waits for the faults of the process)
// can hold up the server's own threads, through the garbage collector's
// stop of the world or the process's memory map lock: a deadlock of the
// test, not of the file system. The helper holds a duplicate of the
// checker's descriptor (passed with SCM_RIGHTS) from the first mmap
// operation after an open until the checker closes it, so that its mappings
// are of the very open file the checker uses and its close adds no flush
// of its own before the checker's.
const helperEnv = "RDMAFS_POSIXCHECK_MMAP_HELPER"

// helperFD is the helper's end of the socket (its first extra file).
const helperFD = 3

// Helper requests.
const (
	reqFD    = 1 // take the descriptor passed with the request
	reqClose = 2 // close it
	reqWrite = 3 // map, store the bytes that follow, msync if asked, unmap
	reqRead  = 4 // map, load the bytes, unmap; they follow the reply
)

// request is the fixed part of a request: op, the mapping's offset and
// length, where the bytes start in the mapping, how many, and whether to
// msync(MS_SYNC) before unmapping.
type request struct {
	op, moff, mlen, rel, n, sync uint64
}

const requestLen = 6 * 8

func (r request) bytes() []byte {
	b := make([]byte, requestLen)
	for i, v := range []uint64{r.op, r.moff, r.mlen, r.rel, r.n, r.sync} {
		binary.LittleEndian.PutUint64(b[8*i:], v)
	}
	return b
}

func parseRequest(b []byte) request {
	u := func(i int) uint64 { return binary.LittleEndian.Uint64(b[8*i:]) }
	return request{u(0), u(1), u(2), u(3), u(4), u(5)}
}

// TestMain runs the mmap helper when the binary is started as one.
func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "1" {
		os.Exit(helperMain())
	}
	os.Exit(m.Run())
}

// helperMain serves requests on helperFD until the checker closes its end.
// Each reply is a status (0, or the length of an error message that
// follows) and, for a read, the bytes.
func helperMain() int {
	fd := -1
	hdr := make([]byte, requestLen)
	oob := make([]byte, unix.CmsgSpace(4))
	for {
		n, oobn, _, _, err := unix.Recvmsg(helperFD, hdr, oob, 0)
		if err != nil || n == 0 {
			return 0
		}
		if n < requestLen {
			if err := readFull(helperFD, hdr[n:]); err != nil {
				return 0
			}
		}
		req := parseRequest(hdr)
		var data []byte
		if req.op == reqWrite {
			data = make([]byte, req.n)
			if err := readFull(helperFD, data); err != nil {
				return 0
			}
		}
		var rerr error
		switch req.op {
		case reqFD:
			fds, err := receivedFDs(oob[:oobn])
			if err != nil || len(fds) != 1 {
				rerr = fmt.Errorf("no descriptor received: %v", err)
				break
			}
			if fd >= 0 {
				unix.Close(fd)
			}
			fd = fds[0]
		case reqClose:
			if fd >= 0 {
				rerr = unix.Close(fd)
				fd = -1
			}
		case reqWrite, reqRead:
			if fd < 0 {
				rerr = errors.New("no descriptor")
				break
			}
			if req.op == reqRead {
				data = make([]byte, req.n)
			}
			rerr = mapAndCopy(fd, req, data)
		default:
			rerr = fmt.Errorf("unknown request %d", req.op)
		}
		reply := make([]byte, 8)
		if rerr != nil {
			msg := rerr.Error()
			binary.LittleEndian.PutUint64(reply, uint64(len(msg)))
			reply = append(reply, msg...)
		} else if req.op == reqRead {
			reply = append(reply, data...)
		}
		if err := writeFull(helperFD, reply); err != nil {
			return 0
		}
	}
}

// mapAndCopy maps [req.moff, req.moff+req.mlen) of fd shared, copies data
// into it at req.rel (reqWrite) or out of it into data (reqRead), msyncs
// when asked and unmaps it. A fault (SIGBUS: a page the file system cannot
// provide) is an error.
func mapAndCopy(fd int, req request, data []byte) (err error) {
	mem, err := unix.Mmap(fd, int64(req.moff), int(req.mlen), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("mmap: %w", err)
	}
	defer func() {
		if uerr := unix.Munmap(mem); uerr != nil && err == nil {
			err = fmt.Errorf("munmap: %w", uerr)
		}
	}()
	fault := func() (fault any) {
		old := debug.SetPanicOnFault(true)
		defer func() {
			debug.SetPanicOnFault(old)
			fault = recover()
		}()
		if req.op == reqWrite {
			copy(mem[req.rel:req.rel+req.n], data)
		} else {
			copy(data, mem[req.rel:req.rel+req.n])
		}
		return nil
	}()
	if fault != nil {
		return fmt.Errorf("memory fault in the mapping: %v", fault)
	}
	if req.sync != 0 {
		if err := unix.Msync(mem, unix.MS_SYNC); err != nil {
			return fmt.Errorf("msync: %w", err)
		}
	}
	return nil
}

func receivedFDs(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, err
	}
	var fds []int
	for _, m := range msgs {
		f, err := unix.ParseUnixRights(&m)
		if err != nil {
			return nil, err
		}
		fds = append(fds, f...)
	}
	return fds, nil
}

func readFull(fd int, b []byte) error {
	for len(b) > 0 {
		n, err := unix.Read(fd, b)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return errors.New("unexpected end of stream")
		}
		b = b[n:]
	}
	return nil
}

func writeFull(fd int, b []byte) error {
	for len(b) > 0 {
		n, err := unix.Write(fd, b)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// mmapHelper is the checker's side of a helper process.
type mmapHelper struct {
	sock int
	cmd  *exec.Cmd
	has  bool // the helper holds a duplicate of the checker's descriptor
}

// startHelper starts a helper process.
func startHelper() (*mmapHelper, error) {
	sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	child := os.NewFile(uintptr(sp[1]), "posixcheck-helper")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=1")
	cmd.ExtraFiles = []*os.File{child}
	cmd.Stderr = os.Stderr
	err = cmd.Start()
	child.Close()
	if err != nil {
		unix.Close(sp[0])
		return nil, err
	}
	return &mmapHelper{sock: sp[0], cmd: cmd}, nil
}

// stop ends the helper (it exits when its socket closes).
func (h *mmapHelper) stop() {
	unix.Close(h.sock)
	h.cmd.Wait()
}

// call sends a request (with fd passed along when fd >= 0, with payload
// after it) and returns the bytes of a read.
func (h *mmapHelper) call(req request, fd int, payload []byte) ([]byte, error) {
	var rights []byte
	if fd >= 0 {
		rights = unix.UnixRights(fd)
	}
	if err := unix.Sendmsg(h.sock, req.bytes(), rights, nil, 0); err != nil {
		return nil, fmt.Errorf("helper: send: %w", err)
	}
	if payload != nil {
		if err := writeFull(h.sock, payload); err != nil {
			return nil, fmt.Errorf("helper: send: %w", err)
		}
	}
	st := make([]byte, 8)
	if err := readFull(h.sock, st); err != nil {
		return nil, fmt.Errorf("helper: reply: %w", err)
	}
	if n := binary.LittleEndian.Uint64(st); n != 0 {
		msg := make([]byte, n)
		if err := readFull(h.sock, msg); err != nil {
			return nil, fmt.Errorf("helper: reply: %w", err)
		}
		return nil, errors.New(string(msg))
	}
	if req.op != reqRead {
		return nil, nil
	}
	data := make([]byte, req.n)
	if err := readFull(h.sock, data); err != nil {
		return nil, fmt.Errorf("helper: reply: %w", err)
	}
	return data, nil
}

// use makes sure the helper holds a duplicate of fd.
func (h *mmapHelper) use(fd int) error {
	if h.has {
		return nil
	}
	if _, err := h.call(request{op: reqFD}, fd, nil); err != nil {
		return err
	}
	h.has = true
	return nil
}

// release makes the helper close its duplicate, before the checker closes
// the descriptor.
func (h *mmapHelper) release() error {
	if !h.has {
		return nil
	}
	h.has = false
	_, err := h.call(request{op: reqClose}, -1, nil)
	return err
}
