package fault

import (
	"context"
	"fmt"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/internal/devcluster"
)

// scene is a case in progress: its cluster, the application calls recorded,
// the acknowledged data, a deadline, and the load goroutines.
type scene struct {
	t      *testing.T
	c      *devcluster.Cluster
	rec    *recorder
	led    *ledger
	ctx    context.Context // the case's deadline; ends with the cause on a hang
	cancel context.CancelCauseFunc

	loadCtx  context.Context
	loadStop context.CancelFunc
	wg       sync.WaitGroup
	mu       sync.Mutex
	loadErrs []error
	procs    []*loadProc
	// tolerate, when set, excuses errors waitFor would fail on.
	tolerate func(opErr) bool
}

func newScene(t *testing.T, c *devcluster.Cluster, timeout time.Duration) *scene {
	ctx, cancel := context.WithCancelCause(context.Background())
	ctx, cancelT := context.WithTimeoutCause(ctx, timeout, fmt.Errorf("the case ran out of its %v", timeout))
	s := &scene{t: t, c: c, rec: newRecorder(), led: newLedger(), ctx: ctx, cancel: cancel}
	s.loadCtx, s.loadStop = context.WithCancel(ctx)
	stopWatch := s.rec.watch(cancel)
	t.Cleanup(func() {
		stopWatch()
		s.loadStop()
		s.mu.Lock()
		for _, p := range s.procs {
			p.stdin.Close()
			p.cmd.Process.Kill() // by PID; blocked on the mount, it dies with it
		}
		s.mu.Unlock()
		cancelT()
		cancel(nil)
		// Load goroutines blocked on the mount end when the cluster's
		// cleanup (after this one) kills it.
	})
	return s
}

// phase labels what follows (the fault in force) in the log and records.
func (s *scene) phase(format string, args ...any) {
	p := fmt.Sprintf(format, args...)
	s.rec.setPhase(p)
	s.t.Logf("-- %s", p)
}

// goLoad runs fn until the load is stopped; an error it returns is kept.
func (s *scene) goLoad(name string, fn func(ctx context.Context) error) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := fn(s.loadCtx); err != nil {
			s.mu.Lock()
			s.loadErrs = append(s.loadErrs, fmt.Errorf("%s: %w", name, err))
			s.mu.Unlock()
		}
	}()
}

// stopLoad stops the load (goroutines and processes) and waits for it,
// bounded: a call hung on the mount fails the case, and so does an error
// the load ended with.
func (s *scene) stopLoad() {
	s.t.Helper()
	s.loadStop()
	s.mu.Lock()
	procs := s.procs
	s.mu.Unlock()
	deadline := time.Now().Add(hangBound)
	for _, p := range procs {
		if err := p.stop(time.Until(deadline)); err != nil {
			d, what := s.rec.longestInFlight()
			s.t.Fatalf("%v: %s in flight for %v", err, what, d.Round(time.Second))
		}
	}
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Until(deadline)):
		d, what := s.rec.longestInFlight()
		s.t.Fatalf("the load did not stop within %v: %s in flight for %v", hangBound, what, d.Round(time.Second))
	}
	if err := s.loadErr(); err != nil {
		s.t.Errorf("load: %v", err)
	}
}

// loadErr is the first error the load ended with.
func (s *scene) loadErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.loadErrs) > 0 {
		return s.loadErrs[0]
	}
	for _, p := range s.procs {
		if err := p.Err(); err != nil {
			return fmt.Errorf("load %s: %w", p.name, err)
		}
	}
	return nil
}

// waitFor polls cond until it holds. It fails the case after d, when the
// case's context ends (a hang, its deadline), or when an application call
// returned an error not in allowed.
func (s *scene) waitFor(what string, d time.Duration, cond func() bool, allowed ...syscall.Errno) {
	s.t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if e := s.bad(allowed...); e != nil {
			s.t.Fatalf("waiting for %s: an application saw %s\n%s", what, e, s.rec.summary())
		}
		if time.Now().After(deadline) {
			st, stWhat := s.rec.longestInFlight()
			s.t.Fatalf("waiting for %s: not within %v (longest call in flight: %v %s; load: %v)\n%s", what, d,
				st.Round(time.Millisecond), stWhat, s.loadErr(), s.rec.summary())
		}
		select {
		case <-s.ctx.Done():
			s.t.Fatalf("waiting for %s: %v", what, context.Cause(s.ctx))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// bad is the first recorded error whose errno is not allowed and that
// tolerate (if set) does not excuse.
func (s *scene) bad(allowed ...syscall.Errno) *opErr {
	if s.tolerate == nil {
		return s.rec.forbidden(allowed...)
	}
	for _, e := range s.rec.errors() {
		ok := s.tolerate(e)
		for _, a := range allowed {
			ok = ok || e.errno == a
		}
		if !ok {
			return &e
		}
	}
	return nil
}

// progress waits until the ledger has grown by bytes and at least minDur
// has passed (so a fault is in force for a while under load).
func (s *scene) progress(what string, bytes int64, minDur, d time.Duration, allowed ...syscall.Errno) {
	s.t.Helper()
	base, start := s.led.bytes.Load(), time.Now()
	s.waitFor(what, d, func() bool {
		return s.led.bytes.Load() >= base+bytes && time.Since(start) >= minDur
	}, allowed...)
	s.t.Logf("%s: %.1f MiB acknowledged in %v", what, float64(s.led.bytes.Load()-base)/(1<<20), time.Since(start).Round(time.Millisecond))
}

// kill kills chunkserver i with SIGKILL.
func (s *scene) kill(i int) {
	s.t.Helper()
	if err := s.c.KillChunkd(i); err != nil {
		s.t.Fatal(err)
	}
}

// restart restarts chunkservers and waits until meta has up of them up.
func (s *scene) restart(up int, idx ...int) {
	s.t.Helper()
	for _, i := range idx {
		if err := s.c.RestartChunkd(s.ctx, i); err != nil {
			s.t.Fatal(err)
		}
	}
	if err := s.c.WaitUp(s.ctx, up, 30*time.Second); err != nil {
		s.t.Fatal(err)
	}
}

// mkdir makes a directory on the mount.
func (s *scene) mkdir(path string) {
	s.t.Helper()
	if err := s.rec.do("mkdir", path, func() error { return os.Mkdir(path, 0o755) }); err != nil {
		s.t.Fatal(err)
	}
}

// guard runs fn (application calls made by the test process itself) and
// returns its error, failing the case if the calls hang (the watchdog ends
// the case's context): the test ends instead of blocking with them.
func (s *scene) guard(what string, fn func() error) error {
	s.t.Helper()
	ch := make(chan error, 1)
	go func() { ch <- fn() }()
	select {
	case err := <-ch:
		return err
	case <-s.ctx.Done():
		s.t.Fatalf("%s: %v\n%s", what, context.Cause(s.ctx), s.rec.summary())
		return nil
	}
}

// verify reads back every acknowledged byte (O_DIRECT: from the
// chunkservers) and fails the case on a difference or a read error.
func (s *scene) verify() {
	s.t.Helper()
	files := s.led.all()
	var total int64
	for _, a := range files {
		var sum [32]byte
		err := s.guard("read back "+a.path, func() (err error) {
			sum, err = readSum(s.rec, a.path, a.size, true)
			return err
		})
		if err != nil {
			s.t.Fatalf("reading back acknowledged data: %v", err)
		}
		if sum != a.sum {
			s.t.Fatalf("%s: the %d acknowledged bytes read back with a different checksum", a.path, a.size)
		}
		total += a.size
	}
	s.t.Logf("every acknowledged byte read back: %d files, %.1f MiB", len(files), float64(total)/(1<<20))
}
