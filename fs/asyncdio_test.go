package fs_test

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rdmafs/rdmafs/meta/metapb"
)

// pairedReads is a file I/O engine whose every file is fileSize bytes of
// byte(offset) and whose reads wait until another read is in flight too, up
// to a timeout: it tells whether the kernel sent two reads at once.
type pairedReads struct {
	mu       sync.Mutex
	inFlight int
	maxSeen  int
	paired   chan struct{}
}

const (
	fileSize    = 1 << 20
	pairTimeout = 3 * time.Second
)

func (d *pairedReads) Read(ctx context.Context, ino uint64, p []byte, off int64) (int, error) {
	d.mu.Lock()
	d.inFlight++
	d.maxSeen = max(d.maxSeen, d.inFlight)
	if d.inFlight == 2 {
		close(d.paired)
	}
	d.mu.Unlock()
	select {
	case <-d.paired:
	case <-time.After(pairTimeout):
	}
	d.mu.Lock()
	d.inFlight--
	d.mu.Unlock()
	n := max(0, min(len(p), int(fileSize-off)))
	for i := range p[:n] {
		p[i] = byte(off + int64(i))
	}
	return n, nil
}

func (d *pairedReads) Open(context.Context, uint64) error { return nil }
func (d *pairedReads) Created(uint64, *metapb.Layout)     {}
func (d *pairedReads) Write(context.Context, uint64, []byte, int64) (int, error) {
	return 0, syscall.EROFS
}
func (d *pairedReads) Flush(context.Context, uint64) error                                   { return nil }
func (d *pairedReads) Sync(context.Context, uint64) error                                    { return nil }
func (d *pairedReads) Truncate(context.Context, uint64, uint64) error                        { return nil }
func (d *pairedReads) Truncated(uint64)                                                      {}
func (d *pairedReads) Size(uint64) (int64, bool)                                             { return fileSize, true }
func (d *pairedReads) Forget(uint64)                                                         {}
func (d *pairedReads) WriteErrors(uint64) (uint64, error)                                    { return 0, nil }
func (d *pairedReads) ObserveCommits(func(uint64), func(uint64, *metapb.CommitStripesReply)) {}

// iocb and ioEvent are the kernel's struct iocb and struct io_event (linux/aio_abi.h).
type iocb struct {
	data   uint64
	_      uint32 // aio_key
	_      int32  // aio_rw_flags
	opcode uint16
	_      int16 // aio_reqprio
	fd     uint32
	buf    uint64
	nbytes uint64
	offset int64
	_      uint64 // aio_reserved2
	_      uint32 // aio_flags
	_      uint32 // aio_resfd
}

type ioEvent struct {
	data, obj uint64
	res, res2 int64
}

const iocbCmdPread = 0

// TestAsyncDirectIO submits two O_DIRECT reads of one file with a single
// io_submit(2) and checks that the mount served them at the same time. A mount
// without asynchronous direct I/O gets them one after the other, each waiting
// out the engine's pairing timeout alone.
func TestAsyncDirectIO(t *testing.T) {
	data := &pairedReads{paired: make(chan struct{})}
	dir := mountData(t, data)
	name := filepath.Join(dir, "f")
	if err := os.WriteFile(name, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(name, unix.O_RDONLY|unix.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	// O_DIRECT wants aligned buffers: a fresh mapping is page-aligned.
	buf, err := unix.Mmap(-1, 0, 2*4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(buf)

	var ctxID uintptr
	if _, _, e := unix.Syscall(unix.SYS_IO_SETUP, 2, uintptr(unsafe.Pointer(&ctxID)), 0); e != 0 {
		t.Fatalf("io_setup: %v", e)
	}
	defer unix.Syscall(unix.SYS_IO_DESTROY, ctxID, 0, 0)
	offsets := []int64{0, 256 << 10} // far apart, so the kernel cannot merge them
	cbs := make([]iocb, len(offsets))
	ptrs := make([]*iocb, len(offsets))
	for i, off := range offsets {
		cbs[i] = iocb{data: uint64(i), opcode: iocbCmdPread, fd: uint32(fd),
			buf: uint64(uintptr(unsafe.Pointer(&buf[i*4096]))), nbytes: 4096, offset: off}
		ptrs[i] = &cbs[i]
	}
	n, _, e := unix.Syscall(unix.SYS_IO_SUBMIT, ctxID, uintptr(len(ptrs)), uintptr(unsafe.Pointer(&ptrs[0])))
	if e != 0 || int(n) != len(ptrs) {
		t.Fatalf("io_submit: %d submitted, %v", n, e)
	}
	events := make([]ioEvent, len(ptrs))
	timeout := unix.NsecToTimespec(int64(4 * pairTimeout))
	got := 0
	for got < len(events) {
		n, _, e := unix.Syscall6(unix.SYS_IO_GETEVENTS, ctxID, 1, uintptr(len(events)-got),
			uintptr(unsafe.Pointer(&events[got])), uintptr(unsafe.Pointer(&timeout)), 0)
		if e == unix.EINTR {
			continue
		}
		if e != 0 || n == 0 {
			t.Fatalf("io_getevents: %d events, %v", n, e)
		}
		got += int(n)
	}
	for _, ev := range events {
		if ev.res != 4096 {
			t.Fatalf("read %d returned %d, want 4096", ev.data, ev.res)
		}
		off := offsets[ev.data]
		b := buf[ev.data*4096 : (ev.data+1)*4096]
		for i, c := range b {
			if c != byte(off+int64(i)) {
				t.Fatalf("read %d at %d: byte %d is %d, want %d", ev.data, off, i, c, byte(off+int64(i)))
			}
		}
	}
	data.mu.Lock()
	defer data.mu.Unlock()
	if data.maxSeen != 2 {
		t.Fatalf("the mount served the two submitted reads one at a time (at most %d in flight): no asynchronous direct I/O", data.maxSeen)
	}
}
