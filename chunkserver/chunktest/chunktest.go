// Package chunktest starts chunkservers for tests: in-process servers on free
// 127.0.0.1 ports, and real chunkd processes built from cmd/chunkd, together with
// clients connected to them. Everything it starts is stopped by test cleanup;
// processes are stopped by their PID.
package chunktest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rdmafs/rdmafs/chunkserver"
	"github.com/rdmafs/rdmafs/chunkserver/client"
	"github.com/rdmafs/rdmafs/chunkserver/store"
	"github.com/rdmafs/rdmafs/internal/cmdbuild"
	"github.com/rdmafs/rdmafs/rdma"
	"github.com/rdmafs/rdmafs/rdma/transport"
)

// Options configure an in-process chunkserver. Zero values take small test
// defaults.
type Options struct {
	Dir        string             // data dir (default a fresh t.TempDir())
	Mem        int                // registered memory (default 64 MiB)
	Secret     []byte             // cluster secret (default "chunktest secret")
	MaxLength  int                // largest version (default 16 MiB)
	Capacity   int64              // disk capacity bound (default none)
	Reserve    int64              // store.Options.Reserve (default store.DefaultReserve; negative: none)
	KeepIdle   time.Duration      // store.Options.KeepIdle (default store.DefaultKeepIdle)
	Config     chunkserver.Config // further settings; Device, Store, Addr, MemBytes, Secret are filled in
	Device     rdma.Device        // transport (default a new tcp device)
	Logger     *slog.Logger       // default: discards below Warn
	Registerer prometheus.Registerer
}

// DefaultSecret is the cluster secret tests use unless they set one.
var DefaultSecret = []byte("chunktest secret")

// Server is an in-process chunkserver.
type Server struct {
	*chunkserver.Server
	Dir    string
	Store  *store.Store
	Device rdma.Device
	Secret []byte
	cancel context.CancelFunc
	served chan error
}

// TransportEnv names the environment variable that selects the transport tests
// use (default "tcp"), so the whole suite can run on each transport.
const TransportEnv = "CHUNKTEST_TRANSPORT"

// TransportName returns the transport tests use.
func TransportName() string {
	if name := os.Getenv(TransportEnv); name != "" {
		return name
	}
	return "tcp"
}

// NewDevice opens a device of the test transport and closes it at cleanup.
func NewDevice(t testing.TB) rdma.Device {
	t.Helper()
	dev, err := transport.Open(TransportName(), nil)
	if err != nil {
		t.Fatalf("chunktest: open %s transport: %v", TransportName(), err)
	}
	t.Cleanup(func() { dev.Close() })
	return dev
}

// TestLogger returns a logger that shows warnings and errors in the test log.
func TestLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

// Start starts an in-process chunkserver on a free 127.0.0.1 port and stops it
// at cleanup.
func Start(t testing.TB, opts Options) *Server {
	t.Helper()
	if opts.Dir == "" {
		opts.Dir = t.TempDir()
	}
	if opts.Mem == 0 {
		opts.Mem = 64 << 20
	}
	if opts.Secret == nil {
		opts.Secret = DefaultSecret
	}
	if opts.Device == nil {
		opts.Device = NewDevice(t)
	}
	if opts.Logger == nil {
		opts.Logger = TestLogger(t)
	}
	st, err := store.Open(opts.Dir, store.Options{MaxLength: opts.MaxLength, Capacity: opts.Capacity,
		Reserve: opts.Reserve, KeepIdle: opts.KeepIdle, Logger: opts.Logger})
	if err != nil {
		t.Fatalf("chunktest: open store: %v", err)
	}
	cfg := opts.Config
	cfg.Device, cfg.Store, cfg.Addr, cfg.MemBytes, cfg.Secret = opts.Device, st, "127.0.0.1:0", opts.Mem, opts.Secret
	cfg.Logger, cfg.Registerer = opts.Logger, opts.Registerer
	ctx, cancel := context.WithCancel(context.Background())
	srv, err := chunkserver.New(ctx, cfg)
	if err != nil {
		cancel()
		st.Close()
		t.Fatalf("chunktest: start chunkserver: %v", err)
	}
	s := &Server{Server: srv, Dir: opts.Dir, Store: st, Device: opts.Device, Secret: opts.Secret, cancel: cancel, served: make(chan error, 1)}
	go func() { s.served <- srv.Serve(ctx) }()
	t.Cleanup(s.Stop)
	return s
}

// Stop shuts the server down cleanly and closes its store. It may be called more
// than once.
func (s *Server) Stop() {
	if s.cancel == nil {
		return
	}
	s.cancel()
	<-s.served
	s.Server.Close()
	s.Store.Close()
	s.cancel = nil
}

// ClientEnv is a client-side transport: a device and a protection domain with a
// registered buffer for the test's data.
type ClientEnv struct {
	Dev rdma.Device
	PD  rdma.ProtectionDomain
	Mem *rdma.Memory
	MR  rdma.MemoryRegion
}

// NewClientEnv opens a device and a protection domain and registers bufSize bytes
// (default 32 MiB) for data; everything is released at cleanup.
func NewClientEnv(t testing.TB, bufSize int) *ClientEnv {
	t.Helper()
	if bufSize == 0 {
		bufSize = 32 << 20
	}
	dev := NewDevice(t)
	pd, err := dev.AllocPD()
	if err != nil {
		t.Fatalf("chunktest: alloc pd: %v", err)
	}
	mem, err := rdma.AllocMemory("chunktest-client", bufSize)
	if err != nil {
		t.Fatalf("chunktest: %v", err)
	}
	mr, err := pd.RegisterMemory(mem, rdma.AccessLocalWrite)
	if err != nil {
		t.Fatalf("chunktest: register: %v", err)
	}
	t.Cleanup(func() {
		mr.Deregister()
		mem.Free()
		pd.Close()
	})
	return &ClientEnv{Dev: dev, PD: pd, Mem: mem, MR: mr}
}

// SGE returns an SGE for n bytes at off of the env's buffer.
func (e *ClientEnv) SGE(off, n int) rdma.SGE {
	return rdma.SGE{Addr: e.MR.Addr() + uint64(off), Length: uint32(n), LKey: e.MR.LKey()}
}

// Bytes returns the env's buffer.
func (e *ClientEnv) Bytes() []byte { return e.MR.Bytes() }

// Dial connects a client to addr with secret; it is closed at cleanup.
func (e *ClientEnv) Dial(t testing.TB, addr string, secret []byte) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, e.Dev, e.PD, addr, client.Options{Secret: secret})
	if err != nil {
		t.Fatalf("chunktest: dial %s: %v", addr, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// Dial connects a new client (on its own client env) to s.
func (s *Server) Dial(t testing.TB) (*client.Client, *ClientEnv) {
	t.Helper()
	env := NewClientEnv(t, 0)
	return env.Dial(t, s.Addr(), s.Secret), env
}

// BuildChunkd builds cmd/chunkd into a temporary directory and returns the binary's
// path. Set CHUNKD_BIN to use a prebuilt binary instead. In -short mode it
// skips the test, with or without CHUNKD_BIN (see cmdbuild.ForTest).
func BuildChunkd(t testing.TB) string {
	t.Helper()
	if bin := os.Getenv("CHUNKD_BIN"); bin != "" && !testing.Short() {
		return bin
	}
	return filepath.Join(cmdbuild.ForTest(t, "./cmd/chunkd"), "chunkd")
}

// ProcOptions configure a chunkd process.
type ProcOptions struct {
	Bin    string   // chunkd binary (default BuildChunkd)
	Dir    string   // data dir (default a fresh t.TempDir())
	Addr   string   // listen address (default 127.0.0.1:0)
	Mem    string   // --mem (default 64MiB)
	Secret []byte   // cluster secret (default DefaultSecret)
	Args   []string // more flags
	Stderr io.Writer
}

// Process is a running chunkd process.
type Process struct {
	Cmd     *exec.Cmd
	Addr    string // the address it listens on
	Dir     string
	Secret  []byte
	opts    ProcOptions
	exited  chan struct{} // closed when the process has exited
	exitErr error         // valid once exited is closed
}

// StartProcess starts a chunkd process and waits until it serves; it is killed at
// cleanup if still running.
func StartProcess(t testing.TB, opts ProcOptions) *Process {
	t.Helper()
	if opts.Bin == "" {
		opts.Bin = BuildChunkd(t)
	}
	if opts.Dir == "" {
		opts.Dir = t.TempDir()
	}
	if opts.Addr == "" {
		opts.Addr = "127.0.0.1:0"
	}
	if opts.Mem == "" {
		opts.Mem = "64MiB"
	}
	if opts.Secret == nil {
		opts.Secret = DefaultSecret
	}
	aux := t.TempDir()
	secretFile := filepath.Join(aux, "secret")
	if err := os.WriteFile(secretFile, opts.Secret, 0o600); err != nil {
		t.Fatal(err)
	}
	ready := filepath.Join(aux, "ready")
	args := append([]string{"--transport", TransportName(), "--data", opts.Dir, "--listen", opts.Addr, "--mem", opts.Mem,
		"--secret-file", secretFile, "--ready-file", ready, "--metrics", ""}, opts.Args...)
	cmd := exec.Command(opts.Bin, args...)
	cmd.Stdout = opts.Stderr
	cmd.Stderr = opts.Stderr
	if cmd.Stderr == nil {
		cmd.Stderr = testWriter{t}
		cmd.Stdout = testWriter{t}
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("chunktest: start chunkd: %v", err)
	}
	p := &Process{Cmd: cmd, Dir: opts.Dir, Secret: opts.Secret, opts: opts, exited: make(chan struct{})}
	go func() {
		p.exitErr = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() { p.Kill() })
	deadline := time.Now().Add(30 * time.Second)
	for {
		if b, err := os.ReadFile(ready); err == nil && len(b) > 0 && b[len(b)-1] == '\n' {
			p.Addr = strings.TrimSpace(string(b))
			return p
		}
		select {
		case <-p.exited:
			t.Fatalf("chunktest: chunkd exited before serving: %v", p.exitErr)
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("chunktest: chunkd did not start serving within 30s")
		}
	}
}

// PID returns the process id.
func (p *Process) PID() int { return p.Cmd.Process.Pid }

// Kill sends SIGKILL to the process (by PID) and waits for it to exit.
func (p *Process) Kill() {
	select {
	case <-p.exited:
		return
	default:
	}
	syscall.Kill(p.PID(), syscall.SIGKILL)
	p.wait(10 * time.Second)
}

// Stop sends SIGTERM and waits for a clean exit, returning its error.
func (p *Process) Stop() error {
	if err := syscall.Kill(p.PID(), syscall.SIGTERM); err != nil {
		return fmt.Errorf("chunktest: SIGTERM %d: %w", p.PID(), err)
	}
	return p.wait(30 * time.Second)
}

func (p *Process) wait(d time.Duration) error {
	select {
	case <-p.exited:
		return p.exitErr
	case <-time.After(d):
		return errors.New("chunktest: chunkd did not exit")
	}
}

// Restart starts a new chunkd process on the same data dir and options.
func (p *Process) Restart(t testing.TB) *Process {
	t.Helper()
	p.Kill()
	opts := p.opts
	return StartProcess(t, opts)
}

// StartN starts n in-process chunkservers with the same options (each with its
// own data dir and port) and zone labels zone0, zone1, ... unless opts.Config
// names a zone.
func StartN(t testing.TB, n int, opts Options) []*Server {
	t.Helper()
	out := make([]*Server, n)
	for i := range out {
		o := opts
		o.Dir = ""
		if o.Config.Zone == "" {
			o.Config.Zone = fmt.Sprintf("zone%d", i)
		}
		out[i] = Start(t, o)
	}
	return out
}

// StartProcesses starts n chunkd processes with the same options (each with its
// own data dir and port).
func StartProcesses(t testing.TB, n int, opts ProcOptions) []*Process {
	t.Helper()
	if opts.Bin == "" {
		opts.Bin = BuildChunkd(t)
	}
	out := make([]*Process, n)
	for i := range out {
		o := opts
		o.Dir = ""
		out[i] = StartProcess(t, o)
	}
	return out
}
