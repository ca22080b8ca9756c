package fault

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// ---------------------------------------------------------------- recorder

// opErr is an error an application call returned.
type opErr struct {
	op, path string
	errno    syscall.Errno // 0: not an errno
	err      error
	took     time.Duration
	at       time.Time
}

func (e opErr) String() string {
	return fmt.Sprintf("%s %s after %v: %v (errno %d %s)", e.op, e.path, e.took.Round(time.Millisecond), e.err, int(e.errno), errnoName(e.errno))
}

func errnoName(e syscall.Errno) string {
	names := map[syscall.Errno]string{syscall.EIO: "EIO", syscall.ENOSPC: "ENOSPC", syscall.EINTR: "EINTR",
		syscall.ECONNREFUSED: "ECONNREFUSED", syscall.ECONNABORTED: "ECONNABORTED", syscall.ECONNRESET: "ECONNRESET",
		syscall.ETIMEDOUT: "ETIMEDOUT", syscall.ENOTCONN: "ENOTCONN", syscall.EHOSTDOWN: "EHOSTDOWN",
		syscall.EHOSTUNREACH: "EHOSTUNREACH", syscall.EDQUOT: "EDQUOT", syscall.ENOENT: "ENOENT", syscall.EAGAIN: "EAGAIN"}
	if n, ok := names[e]; ok {
		return n
	}
	return ""
}

// stall is the longest completed call of a kind.
type stall struct {
	took time.Duration
	what string
}

// recorder times every application call (write, fsync, read, create, ...)
// and keeps the errors they returned. Calls in flight count too: a hang
// shows before it ends.
type recorder struct {
	mu       sync.Mutex
	stalls   map[string]stall // by op
	okStall  stall            // the longest call that succeeded
	counts   map[string]int
	errs     []opErr
	inflight map[int64]inflightOp
	remote   map[string]inflightOp // the longest call in flight in each load process
	next     int64
	phase    string // a label (the fault in force) kept with errors and stalls
	// sink, in a load process, gets every finished call (see loadChild).
	sink func(op, path string, took time.Duration, err error)
}

type inflightOp struct {
	op, path string
	start    time.Time
}

func newRecorder() *recorder {
	return &recorder{stalls: map[string]stall{}, counts: map[string]int{}, inflight: map[int64]inflightOp{}, remote: map[string]inflightOp{}}
}

func (r *recorder) setPhase(p string) {
	r.mu.Lock()
	r.phase = p
	r.mu.Unlock()
}

// do runs fn as the application call op on path and records it.
func (r *recorder) do(op, path string, fn func() error) error {
	r.mu.Lock()
	id := r.next
	r.next++
	start := time.Now()
	r.inflight[id] = inflightOp{op, path, start}
	r.mu.Unlock()
	err := fn()
	took := time.Since(start)
	r.mu.Lock()
	delete(r.inflight, id)
	r.mu.Unlock()
	r.note(op, path, took, err)
	return err
}

// note records a call that took took and returned err (a call made
// elsewhere, e.g. by fio, whose report gives its latency).
func (r *recorder) note(op, path string, took time.Duration, err error) {
	r.noteAt(op, path, took, err, time.Now())
}

// noteAt is note for a call that ended at end.
func (r *recorder) noteAt(op, path string, took time.Duration, err error, end time.Time) {
	if r.sink != nil {
		r.sink(op, path, took, err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.counts[op]++
	if took > r.stalls[op].took {
		r.stalls[op] = stall{took, fmt.Sprintf("%s %s, ended in phase %q", op, filepath.Base(path), r.phase)}
	}
	if err == nil && took > r.okStall.took {
		r.okStall = stall{took, fmt.Sprintf("%s %s, ended in phase %q", op, filepath.Base(path), r.phase)}
	}
	if err != nil {
		var en syscall.Errno
		errors.As(err, &en)
		r.errs = append(r.errs, opErr{op: op, path: path, errno: en, err: fmt.Errorf("[%s] %w", r.phase, err), took: took, at: end})
	}
}

// longestInFlight is the oldest call still running.
func (r *recorder) longestInFlight() (time.Duration, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var d time.Duration
	what := ""
	for _, op := range r.inflight {
		if t := time.Since(op.start); t > d {
			d, what = t, op.op+" "+op.path
		}
	}
	for name, op := range r.remote {
		if t := time.Since(op.start); t > d {
			d, what = t, op.op+" "+op.path+" (in "+name+")"
		}
	}
	return d, what
}

// remoteInFlight sets the longest call in flight in load process name
// (took so far; 0: none).
func (r *recorder) remoteInFlight(name, op, path string, took time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if took <= 0 {
		delete(r.remote, name)
		return
	}
	r.remote[name] = inflightOp{op, path, time.Now().Add(-took)}
}

// maxStall is the longest call of any kind, finished or not.
func (r *recorder) maxStall() (time.Duration, string) {
	d, what := r.longestInFlight()
	if d > 0 {
		what += " (still running)"
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.stalls {
		if s.took > d {
			d, what = s.took, s.what
		}
	}
	return d, what
}

// maxOKStall is the longest call that succeeded.
func (r *recorder) maxOKStall() (time.Duration, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.okStall.took, r.okStall.what
}

// summary is one line per op kind: count and longest call.
func (r *recorder) summary() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ops []string
	for op := range r.counts {
		ops = append(ops, op)
	}
	sort.Strings(ops)
	var b strings.Builder
	for _, op := range ops {
		fmt.Fprintf(&b, "  %-8s %6d calls, longest %v (%s)\n", op, r.counts[op], r.stalls[op].took.Round(time.Millisecond), r.stalls[op].what)
	}
	if len(r.errs) > 0 {
		fmt.Fprintf(&b, "  %d errors, by errno:", len(r.errs))
		byErrno := map[string]int{}
		for _, e := range r.errs {
			byErrno[fmt.Sprintf("%d %s", int(e.errno), errnoName(e.errno))]++
		}
		for k, n := range byErrno {
			fmt.Fprintf(&b, " [%s]×%d", k, n)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// errors returns the errors recorded so far.
func (r *recorder) errors() []opErr {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]opErr(nil), r.errs...)
}

// forbidden returns the first recorded error whose errno is not allowed.
func (r *recorder) forbidden(allowed ...syscall.Errno) *opErr {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, e := range r.errs {
		ok := false
		for _, a := range allowed {
			if e.errno == a {
				ok = true
			}
		}
		if !ok {
			return &r.errs[i]
		}
	}
	return nil
}

// check fails the test when an error other than allowed was recorded, or a
// call took longer than bound; it logs the summary either way.
func (r *recorder) check(t *testing.T, bound time.Duration, allowed ...syscall.Errno) {
	t.Helper()
	d, what := r.maxStall()
	t.Logf("application calls (longest stall %v: %s):\n%s", d.Round(time.Millisecond), what, r.summary())
	if e := r.forbidden(allowed...); e != nil {
		errs := r.errors()
		var lines []string
		for i, e := range errs {
			if i == 10 {
				lines = append(lines, fmt.Sprintf("... %d more", len(errs)-10))
				break
			}
			lines = append(lines, e.String())
		}
		t.Errorf("an application saw an error it must not (allowed: %v): %s\nall errors:\n%s", allowed, e, strings.Join(lines, "\n"))
	}
	if d > bound {
		t.Errorf("a call stalled %v (> %v): %s", d.Round(time.Millisecond), bound, what)
	}
}

// watch fails the case's context when a call has been in flight longer
// than hangBound, so waits end with the hang reported instead of blocking
// until the go test timeout. stop ends it.
func (r *recorder) watch(cancel context.CancelCauseFunc) (stop func()) {
	return every(time.Second, func() bool {
		if d, what := r.longestInFlight(); d > hangBound {
			cancel(fmt.Errorf("hang: %s in flight for %v", what, d.Round(time.Second)))
			return false
		}
		return true
	})
}

// every calls fn every period, in a goroutine of its own, until fn returns
// false or stop is called. stop returns at once (a call of fn may still be
// running) and is called once.
func every(period time.Duration, fn func() bool) (stop func()) {
	done := make(chan struct{})
	go func() {
		tick := time.NewTicker(period)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				if !fn() {
					return
				}
			}
		}
	}()
	return func() { close(done) }
}

// TestEvery: every calls fn once a period, again and again (here until fn
// returns false), and stop may be called after fn ended it.
func TestEvery(t *testing.T) {
	calls := make(chan int, 10)
	n := 0
	stop := every(time.Millisecond, func() bool {
		n++
		calls <- n
		return n < 3
	})
	defer stop()
	timeout := time.After(10 * time.Second)
	for want := 1; want <= 3; want++ {
		select {
		case got := <-calls:
			if got != want {
				t.Fatalf("call %d, want %d", got, want)
			}
		case <-timeout:
			t.Fatalf("fn called %d times in 10s, want 3", want-1)
		}
	}
}

// ---------------------------------------------------------------- data

// pattern fills b with the bytes of a file with seed from offset off on:
// the content of any range can be recomputed.
func pattern(b []byte, seed uint64, off int64) {
	const block = 4096
	for i := 0; i < len(b); {
		blk := (off + int64(i)) / block
		r := rand.New(rand.NewPCG(seed, uint64(blk)))
		start := int((off + int64(i)) % block)
		var word [8]byte
		for j := 0; j < block && i < len(b); j += 8 {
			v := r.Uint64()
			for k := 0; k < 8; k++ {
				word[k] = byte(v >> (8 * k))
			}
			for k := 0; k < 8 && i < len(b); k++ {
				if j+k >= start {
					b[i] = word[k]
					i++
				}
			}
		}
	}
}

// acked is what a successful fsync acknowledged of a file: its first size
// bytes, with their SHA-256.
type acked struct {
	path string
	size int64
	sum  [32]byte
	done bool // written completely and closed: never changes again
}

// ledger holds every acknowledgment.
type ledger struct {
	mu    sync.Mutex
	files map[string]*acked
	// sink, in a load process, gets every acknowledgment ("A") and
	// forgotten name ("F").
	sink  func(line string)
	bytes atomic.Int64 // bytes acknowledged in total
	count atomic.Int64 // files completed
}

func newLedger() *ledger { return &ledger{files: map[string]*acked{}} }

func (l *ledger) ack(path string, data []byte, done bool) {
	l.ackSum(path, int64(len(data)), sha256.Sum256(data), done)
}

func (l *ledger) ackSum(path string, size int64, sum [32]byte, done bool) {
	if l.sink != nil {
		l.sink(fmt.Sprintf("A %d %x %v %s", size, sum, done, path))
	}
	l.mu.Lock()
	prev := int64(0)
	if a := l.files[path]; a != nil {
		prev = a.size
	}
	l.files[path] = &acked{path: path, size: size, sum: sum, done: done}
	l.mu.Unlock()
	l.bytes.Add(size - prev)
	if done {
		l.count.Add(1)
	}
}

func (l *ledger) forget(path string) {
	if l.sink != nil {
		l.sink("F " + path)
	}
	l.mu.Lock()
	if a := l.files[path]; a != nil {
		l.bytes.Add(-a.size)
		if a.done {
			l.count.Add(-1)
		}
	}
	delete(l.files, path)
	l.mu.Unlock()
}

func (l *ledger) all() []acked {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]acked, 0, len(l.files))
	for _, a := range l.files {
		out = append(out, *a)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].path < out[j].path })
	return out
}

// completed returns a random completed file, if any.
func (l *ledger) completed(r *rand.Rand) (acked, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var c []*acked
	for _, a := range l.files {
		if a.done {
			c = append(c, a)
		}
	}
	if len(c) == 0 {
		return acked{}, false
	}
	return *c[r.IntN(len(c))], true
}

// ---------------------------------------------------------------- writer

// writer writes files of fileSize bytes in calls of chunk bytes, with an
// fsync every syncEvery bytes and at the end, and acknowledges in the
// ledger what each successful fsync covered.
type writer struct {
	rec       *recorder
	led       *ledger
	dir       string
	name      string // file name prefix
	fileSize  int
	chunk     int
	syncEvery int
	seed      uint64
	// verifyEvery > 0: after every verifyEvery files, read back a random
	// completed file of the ledger (O_DIRECT) and compare its checksum.
	verifyEvery int
	// onErr decides what to do after a failed call: nil stops the writer.
	onErr func(err error) (retry bool)
}

// errTorn is a read that returned other bytes than were acknowledged.
var errTorn = errors.New("read back bytes that differ from the acknowledged ones (torn or lost)")

// run writes files until ctx ends or a call fails (and onErr says stop).
func (w *writer) run(ctx context.Context) error {
	rnd := rand.New(rand.NewPCG(w.seed, 7))
	for i := 0; ctx.Err() == nil; i++ {
		path := filepath.Join(w.dir, fmt.Sprintf("%s%05d", w.name, i))
		err := w.file(ctx, path, w.seed*1_000_003+uint64(i))
		if err == nil && w.verifyEvery > 0 && i%w.verifyEvery == 0 {
			if a, ok := w.led.completed(rnd); ok {
				var sum [32]byte
				if sum, err = readSum(w.rec, a.path, a.size, true); err == nil && sum != a.sum {
					err = fmt.Errorf("%s: %w", a.path, errTorn)
					w.rec.note("verify", a.path, 0, err)
				}
			}
		}
		if err != nil {
			if w.onErr == nil || !w.onErr(err) {
				return err
			}
		}
	}
	return nil
}

// file writes one file; its acknowledged prefix is in the ledger whatever
// happens.
func (w *writer) file(ctx context.Context, path string, seed uint64) error {
	data := make([]byte, w.fileSize)
	pattern(data, seed, 0)
	var f *os.File
	err := w.rec.do("create", path, func() (err error) {
		f, err = os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		return err
	})
	if err != nil {
		return err
	}
	closed := false
	defer func() {
		if !closed {
			f.Close()
		}
	}()
	synced := 0
	for off := 0; off < len(data); {
		n := min(w.chunk, len(data)-off)
		if err := w.rec.do("write", path, func() error {
			_, err := f.WriteAt(data[off:off+n], int64(off))
			return err
		}); err != nil {
			return err
		}
		off += n
		if off-synced >= w.syncEvery || off == len(data) {
			if err := w.rec.do("fsync", path, f.Sync); err != nil {
				return err
			}
			synced = off
			w.led.ack(path, data[:off], false)
		}
		if ctx.Err() != nil && off < len(data) {
			return nil // stopped: the prefix is acknowledged
		}
	}
	closed = true
	if err := w.rec.do("close", path, f.Close); err != nil {
		return err
	}
	w.led.ack(path, data, true)
	return nil
}

// ---------------------------------------------------------------- verify

// alignedBuf is page-aligned memory for O_DIRECT reads.
func alignedBuf(n int) []byte {
	b, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		panic(err)
	}
	return b
}

// readSum reads the first size bytes of path (O_DIRECT when direct: past
// the page cache, to the chunkservers) in 1 MiB calls recorded as "read"
// and returns their SHA-256.
func readSum(rec *recorder, path string, size int64, direct bool) ([32]byte, error) {
	flags := os.O_RDONLY
	if direct {
		flags |= syscall.O_DIRECT
	}
	var f *os.File
	if err := rec.do("open", path, func() (err error) {
		f, err = os.OpenFile(path, flags, 0)
		return err
	}); err != nil {
		return [32]byte{}, err
	}
	defer f.Close()
	buf := alignedBuf(1 << 20)
	defer syscall.Munmap(buf)
	h := sha256.New()
	for off := int64(0); off < size; {
		var n int
		err := rec.do("read", path, func() (err error) {
			n, err = f.ReadAt(buf, off)
			if err == io.EOF {
				err = nil
			}
			return err
		})
		if err != nil {
			return [32]byte{}, err
		}
		if n == 0 {
			return [32]byte{}, fmt.Errorf("%s: %d bytes, %d were acknowledged", path, off, size)
		}
		n = int(min(int64(n), size-off))
		h.Write(buf[:n])
		off += int64(n)
	}
	var s [32]byte
	h.Sum(s[:0])
	return s, nil
}

// ---------------------------------------------------------------- fio

// fioJob is one fio job of a run: its error and its longest calls.
type fioJob struct {
	Name      string
	Error     int
	MaxWrite  time.Duration // completion latency of the longest write
	MaxRead   time.Duration
	MaxSync   time.Duration
	ReadBytes int64
}

// runFio runs fio with args (one or more jobs) and returns its jobs as its
// JSON report gives them, and an error when fio failed or a job did.
func runFio(ctx context.Context, dir string, args ...string) ([]fioJob, string, error) {
	cmd := exec.CommandContext(ctx, "fio", append([]string{"--output-format=json"}, args...)...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, runErr := cmd.Output()
	text := string(out) + stderr.String()
	js := out
	if i := bytes.IndexByte(js, '{'); i >= 0 {
		js = js[i:]
	}
	var rep struct {
		Jobs []struct {
			Jobname string `json:"jobname"`
			Error   int    `json:"error"`
			Read    struct {
				IOBytes int64 `json:"io_bytes"`
				Clat    struct {
					Max float64 `json:"max"`
				} `json:"clat_ns"`
			} `json:"read"`
			Write struct {
				Clat struct {
					Max float64 `json:"max"`
				} `json:"clat_ns"`
			} `json:"write"`
			Sync struct {
				Lat struct {
					Max float64 `json:"max"`
				} `json:"lat_ns"`
			} `json:"sync"`
		} `json:"jobs"`
	}
	var jobs []fioJob
	if err := json.Unmarshal(js, &rep); err == nil {
		for _, j := range rep.Jobs {
			jobs = append(jobs, fioJob{Name: j.Jobname, Error: j.Error, MaxWrite: time.Duration(j.Write.Clat.Max),
				MaxRead: time.Duration(j.Read.Clat.Max), MaxSync: time.Duration(j.Sync.Lat.Max), ReadBytes: j.Read.IOBytes})
		}
	} else if runErr == nil {
		return nil, text, fmt.Errorf("fio: reading its JSON report: %w", err)
	}
	if strings.Contains(text, "verify: bad") || strings.Contains(text, "bad magic") {
		return jobs, text, fmt.Errorf("fio verify failed")
	}
	for _, j := range jobs {
		if j.Error != 0 {
			return jobs, text, fmt.Errorf("fio job %s: error %d (%s)", j.Name, j.Error, syscall.Errno(j.Error))
		}
	}
	if runErr != nil {
		return jobs, text, fmt.Errorf("fio: %v", runErr)
	}
	return jobs, text, nil
}

// ---------------------------------------------------------------- child

// childEnv makes the test binary a helper process: "write PATH BYTES"
// writes BYTES to a new file PATH in 1 MiB calls and fsyncs it, printing
// "start" first and "done ERRNO" (0 on success) at the end.
const childEnv = "RDMAFS_FAULT_CHILD"

func runChild(spec string) int {
	if strings.HasPrefix(spec, "load ") {
		return loadChild(strings.TrimPrefix(spec, "load "))
	}
	f := strings.Fields(spec)
	if len(f) != 3 || f[0] != "write" {
		fmt.Fprintln(os.Stderr, "bad child spec", spec)
		return 2
	}
	size, _ := strconv.Atoi(f[2])
	out := bufio.NewWriter(os.Stdout)
	fmt.Fprintln(out, "start")
	out.Flush()
	errno := func(err error) int {
		var en syscall.Errno
		if errors.As(err, &en) {
			return int(en)
		}
		if err != nil {
			return -1
		}
		return 0
	}
	file, err := os.OpenFile(f[1], os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err == nil {
		buf := make([]byte, 1<<20)
		pattern(buf, 99, 0)
		for off := 0; off < size && err == nil; off += len(buf) {
			_, err = file.Write(buf)
		}
		if err == nil {
			err = file.Sync()
		}
		if cerr := file.Close(); err == nil {
			err = cerr
		}
	}
	fmt.Fprintf(out, "done %d\n", errno(err))
	out.Flush()
	return 0
}

// count is how many calls of op finished.
func (r *recorder) count(op string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.counts[op]
}
