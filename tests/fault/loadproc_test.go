package fault

import (
	"bufio"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// The load runs in child processes (the test binary again), never in the
// test process: the test process forks and execs chunkd, meta and fio
// while the load runs, and at exec the kernel closes every close-on-exec
// descriptor of the child, sending FUSE_FLUSH for each file open on the
// mount. While meta is down that flush waits for meta, which the exec is
// about to start: a deadlock. The test process therefore holds no file of
// the mount open while anything can exec.
//
// A load process writes one line per event to stdout:
//
//	O OP TOOK_NS ERRNO END_UNIX_NS PATH\tMESSAGE   a finished call
//	A SIZE SHA256HEX DONE PATH                     an acknowledgment
//	F PATH                                         a name no longer acknowledged (renamed)
//	I TOOK_NS OP PATH                              the longest call in flight (0: none), every 250 ms
//	E MESSAGE                                      the load ended with an error
//
// and stops (ending its current file) when its stdin closes.

// loadSpec is what a load process does.
type loadSpec struct {
	Kind      string // "writer", "meta" (create/write/fsync/rename workers) or "reader"
	Dir       string
	Name      string // file name prefix
	FileSize  int
	Chunk     int
	SyncEvery int
	Seed      uint64
	// VerifyEvery: a writer reads back a random completed file of its own
	// after every VerifyEvery files.
	VerifyEvery int
	// Continue: after a failed call, wait 100 ms and go on with a new file
	// (the test decides which errors it tolerates); else the load ends.
	Continue bool
	// Files a reader reads (O_DIRECT) and checks, over and over.
	Files []fileSum
}

type fileSum struct {
	Path string
	Size int64
	Sum  string // hex SHA-256
}

func loadChild(js string) int {
	var spec loadSpec
	if err := json.Unmarshal([]byte(js), &spec); err != nil {
		fmt.Println("E bad spec:", err)
		return 2
	}
	var outMu sync.Mutex
	out := bufio.NewWriter(os.Stdout)
	emit := func(line string) {
		outMu.Lock()
		out.WriteString(line)
		out.WriteByte('\n')
		out.Flush()
		outMu.Unlock()
	}
	rec := newRecorder()
	rec.sink = func(op, path string, took time.Duration, err error) {
		var en syscall.Errno
		msg := ""
		if err != nil {
			errors.As(err, &en)
			msg = strings.NewReplacer("\n", " ", "\t", " ").Replace(err.Error())
		}
		emit(fmt.Sprintf("O %s %d %d %d %s\t%s", op, took.Nanoseconds(), int(en), time.Now().UnixNano(), path, msg))
	}
	led := newLedger()
	led.sink = emit
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		io.Copy(io.Discard, os.Stdin) // the test closes stdin to stop the load
		cancel()
	}()
	// Report the longest call in flight four times a second.
	stopReports := every(250*time.Millisecond, func() bool {
		d, what := rec.longestInFlight()
		op, path, _ := strings.Cut(what, " ")
		emit(fmt.Sprintf("I %d %s %s", d.Nanoseconds(), op, path))
		return true
	})
	var onErr func(error) bool
	if spec.Continue {
		onErr = func(error) bool {
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
			return true
		}
	}
	var err error
	switch spec.Kind {
	case "writer":
		w := &writer{rec: rec, led: led, dir: spec.Dir, name: spec.Name, fileSize: spec.FileSize, chunk: spec.Chunk,
			syncEvery: spec.SyncEvery, seed: spec.Seed * 100, verifyEvery: spec.VerifyEvery, onErr: onErr}
		err = w.run(ctx)
	case "meta":
		err = metaWorker(rec, led, spec.Dir, spec.Name, spec.Seed*100, onErr)(ctx)
	case "reader":
		err = reader(ctx, rec, spec.Files, onErr)
	default:
		err = fmt.Errorf("unknown load kind %q", spec.Kind)
	}
	stopReports()
	if err != nil {
		emit("E " + strings.ReplaceAll(err.Error(), "\n", " "))
	}
	return 0
}

// reader reads files (O_DIRECT) until ctx ends and checks their checksums.
func reader(ctx context.Context, rec *recorder, files []fileSum, onErr func(error) bool) error {
	for ctx.Err() == nil {
		for _, f := range files {
			if ctx.Err() != nil {
				return nil
			}
			sum, err := readSum(rec, f.Path, f.Size, true)
			if err == nil && hex.EncodeToString(sum[:]) != f.Sum {
				err = fmt.Errorf("%s: %w", f.Path, errTorn)
				rec.note("verify", f.Path, 0, err)
			}
			if err != nil && (onErr == nil || !onErr(err)) {
				return err
			}
		}
	}
	return nil
}

// loadProc is a running load process.
type loadProc struct {
	name  string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	done  chan struct{} // its output is read and it is reaped
	mu    sync.Mutex
	err   error // its E line, or how it exited
}

// startLoad starts a load process whose calls and acknowledgments go to
// the scene's recorder and ledger.
func (s *scene) startLoad(name string, spec loadSpec) *loadProc {
	s.t.Helper()
	js, _ := json.Marshal(spec)
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), childEnv+"=load "+string(js))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		s.t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		s.t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	p := &loadProc{name: name, cmd: cmd, stdin: stdin, done: make(chan struct{})}
	s.mu.Lock()
	s.procs = append(s.procs, p)
	s.mu.Unlock()
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<16), 1<<20)
		for sc.Scan() {
			if err := s.loadLine(p, sc.Text()); err != nil {
				p.setErr(err)
			}
		}
		s.rec.remoteInFlight(name, "", "", 0)
		if err := cmd.Wait(); err != nil {
			p.setErr(fmt.Errorf("exited: %w", err))
		}
	}()
	return p
}

func (p *loadProc) setErr(err error) {
	p.mu.Lock()
	if p.err == nil {
		p.err = err
	}
	p.mu.Unlock()
}

func (p *loadProc) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// stop closes the process's stdin (it ends its current file) and waits.
func (p *loadProc) stop(timeout time.Duration) error {
	p.stdin.Close()
	select {
	case <-p.done:
		return nil
	case <-time.After(timeout):
		return fmt.Errorf("load %s did not stop within %v", p.name, timeout)
	}
}

// loadLine takes one line of a load process's output.
func (s *scene) loadLine(p *loadProc, line string) error {
	kind, rest, _ := strings.Cut(line, " ")
	switch kind {
	case "O":
		head, msg, _ := strings.Cut(rest, "\t")
		f := strings.SplitN(head, " ", 5)
		if len(f) != 5 {
			return fmt.Errorf("bad line %q", line)
		}
		took, _ := strconv.ParseInt(f[1], 10, 64)
		en, _ := strconv.Atoi(f[2])
		end, _ := strconv.ParseInt(f[3], 10, 64)
		var err error
		if msg != "" {
			if en != 0 {
				err = fmt.Errorf("%s: %w", msg, syscall.Errno(en))
			} else {
				err = errors.New(msg)
			}
		}
		s.rec.noteAt(f[0], p.name+":"+f[4], time.Duration(took), err, time.Unix(0, end))
	case "A":
		f := strings.SplitN(rest, " ", 4)
		if len(f) != 4 {
			return fmt.Errorf("bad line %q", line)
		}
		size, _ := strconv.ParseInt(f[0], 10, 64)
		var sum [32]byte
		if b, err := hex.DecodeString(f[1]); err != nil || len(b) != 32 {
			return fmt.Errorf("bad line %q", line)
		} else {
			copy(sum[:], b)
		}
		s.led.ackSum(f[3], size, sum, f[2] == "true")
	case "F":
		s.led.forget(rest)
	case "I":
		f := strings.SplitN(rest, " ", 3)
		took, _ := strconv.ParseInt(f[0], 10, 64)
		op, path := "", ""
		if len(f) == 3 {
			op, path = f[1], f[2]
		}
		s.rec.remoteInFlight(p.name, op, path, time.Duration(took))
	case "E":
		return errors.New(rest)
	default:
		return fmt.Errorf("bad line %q", line)
	}
	return nil
}
