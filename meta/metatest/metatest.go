// Package metatest starts metadata servers for tests: in-process on
// 127.0.0.1:0, or as a real `rdmafs meta` process that a test can kill -9 and
// restart. Tests of chunkd, the FUSE client and the end-to-end suite use it.
package metatest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rdmafs/rdmafs/internal/cmdbuild"
	"github.com/rdmafs/rdmafs/internal/stripe"
	"github.com/rdmafs/rdmafs/meta/auth"
	"github.com/rdmafs/rdmafs/meta/client"
	"github.com/rdmafs/rdmafs/meta/core"
	"github.com/rdmafs/rdmafs/meta/metapb"
	"github.com/rdmafs/rdmafs/meta/server"
)

// Options configures a test meta server. Zero values pick test-friendly
// defaults: layout 4+2 with 64 KiB units, 1s heartbeat timeout, 2s session TTL.
type Options struct {
	// DataDir is the data directory (default: a new t.TempDir()). If it is
	// already formatted it is reused.
	DataDir string
	// Layout is the format-time layout.
	Layout stripe.Layout
	// HeartbeatTimeout, SessionTTL and GrantTTL configure the service.
	HeartbeatTimeout time.Duration
	SessionTTL       time.Duration
	GrantTTL         time.Duration
	// Listen is the address (default 127.0.0.1:0).
	Listen string
	// Verbose sends the server's logs to the test log.
	Verbose bool
}

func (o *Options) defaults(t testing.TB) {
	if o.DataDir == "" {
		o.DataDir = t.TempDir()
	}
	if o.Layout == (stripe.Layout{}) {
		o.Layout = stripe.Layout{K: 4, M: 2, Unit: 64 << 10}
	}
	if o.HeartbeatTimeout == 0 {
		o.HeartbeatTimeout = time.Second
	}
	if o.SessionTTL == 0 {
		o.SessionTTL = 2 * time.Second
	}
	if o.Listen == "" {
		o.Listen = "127.0.0.1:0"
	}
}

// Meta is a metadata server started for a test.
type Meta struct {
	// Addr is the gRPC address (host:port).
	Addr string
	// Secret is the cluster secret; SecretFile holds it.
	Secret     string
	SecretFile string
	// DataDir is the server's data directory.
	DataDir string
	// Server is the in-process server (nil for a process).
	Server *server.Server
	// Registry holds the in-process server's metrics (Ops reads them).
	Registry *prometheus.Registry

	opts Options
}

// Format formats dataDir with layout unless it is already formatted and
// returns the secret file.
func Format(t testing.TB, dataDir string, layout stripe.Layout) string {
	t.Helper()
	secretFile := server.DefaultSecretFile(dataDir)
	if _, err := os.Stat(secretFile); err == nil {
		return secretFile
	}
	if _, err := server.Format(context.Background(), dataDir, secretFile, layout); err != nil {
		t.Fatalf("metatest: format %s: %v", dataDir, err)
	}
	// Deletes free space at once, as the tests of deletion expect; the
	// trash has tests of its own.
	if err := server.SetTrash(context.Background(), dataDir, "", 0); err != nil {
		t.Fatalf("metatest: %v", err)
	}
	return secretFile
}

// Start formats a data directory and starts an in-process meta server that
// is stopped when the test ends.
func Start(t testing.TB, opts Options) *Meta {
	t.Helper()
	opts.defaults(t)
	secretFile := Format(t, opts.DataDir, opts.Layout)
	secret, err := auth.ReadSecretFile(secretFile)
	if err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	if opts.Verbose {
		logger = slog.New(slog.NewTextHandler(testWriter{t}, nil))
	}
	reg := prometheus.NewRegistry()
	srv, err := server.Start(context.Background(), server.Config{DataDir: opts.DataDir, Listen: opts.Listen, Secret: secret,
		HeartbeatTimeout: opts.HeartbeatTimeout, SessionTTL: opts.SessionTTL, GrantTTL: opts.GrantTTL, Logger: logger, Registry: reg})
	if err != nil {
		t.Fatalf("metatest: start meta server: %v", err)
	}
	m := &Meta{Addr: srv.Addr(), Secret: secret, SecretFile: secretFile, DataDir: opts.DataDir, Server: srv, Registry: reg, opts: opts}
	t.Cleanup(func() { m.Stop(t) })
	return m
}

// Ops returns how many calls of method the in-process server has answered,
// whatever their outcome (the calls of batches included).
func (m *Meta) Ops(t testing.TB, method string) int {
	t.Helper()
	return OpsIn(t, m.Registry, method)
}

// OpsIn is Ops for a meta server whose metrics reg gathers.
func OpsIn(t testing.TB, reg prometheus.Gatherer, method string) int {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatalf("metatest: gather metrics: %v", err)
	}
	n := 0.0
	for _, f := range families {
		if f.GetName() != "rdmafs_meta_ops_total" {
			continue
		}
		for _, mt := range f.GetMetric() {
			for _, l := range mt.GetLabel() {
				if l.GetName() == "method" && l.GetValue() == method {
					n += mt.GetCounter().GetValue()
				}
			}
		}
	}
	return int(n)
}

// Stop stops an in-process server (idempotent).
func (m *Meta) Stop(t testing.TB) {
	if m.Server == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := m.Server.Stop(ctx); err != nil {
		t.Errorf("metatest: stop: %v", err)
	}
}

// Restart stops an in-process server and starts a new one on the same data
// directory and address.
func (m *Meta) Restart(t testing.TB) {
	t.Helper()
	m.Stop(t)
	opts := m.opts
	opts.Listen = m.Addr
	n := Start(t, opts)
	*m = *n
}

// Client returns a client connected to the server, closed when the test ends.
func (m *Meta) Client(t testing.TB) *client.Client {
	t.Helper()
	c, err := client.Dial(m.Addr, m.Secret)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// FakeChunkservers registers n chunkservers (ids cs0..cs(n-1), zones cycling
// through zones if given, 1 TiB each) and keeps them alive with heartbeats
// until the test ends, so that write grants can be placed without chunkd.
func FakeChunkservers(t testing.TB, c *client.Client, n int, interval time.Duration, zones ...string) []string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var ids []string
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("cs%d", i)
		zone := ""
		if len(zones) > 0 {
			zone = zones[i%len(zones)]
		}
		if _, err := c.Register(ctx, &metapb.RegisterRequest{Id: id, Address: fmt.Sprintf("127.0.0.1:%d", 9000+i),
			Transports: []string{"tcp"}, Zone: zone, Capacity: 1 << 40}); err != nil {
			cancel()
			t.Fatalf("metatest: register %s: %v", id, err)
		}
		ids = append(ids, id)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		tk := time.NewTicker(interval)
		defer tk.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tk.C:
			}
			for _, id := range ids {
				c.Heartbeat(ctx, &metapb.HeartbeatRequest{Id: id, Free: 1 << 40})
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return ids
}

// FreeAddr returns a 127.0.0.1 address with a port that was free a moment ago.
func FreeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// BuildRdmafs builds the rdmafs command into a temporary directory and
// returns the binary's path; in -short mode it skips the test
// (cmdbuild.ForTest).
func BuildRdmafs(t testing.TB) string {
	t.Helper()
	return filepath.Join(cmdbuild.ForTest(t, "./cmd/rdmafs"), "rdmafs")
}

// Process is a `rdmafs meta` process.
type Process struct {
	Meta
	Cmd *exec.Cmd
	bin string
	log *os.File
}

// StartProcess formats opts.DataDir if needed and starts `bin meta` on it,
// waiting until it answers. The process is killed when the test ends.
func StartProcess(t testing.TB, bin string, opts Options) *Process {
	t.Helper()
	opts.defaults(t)
	if opts.Listen == "127.0.0.1:0" {
		opts.Listen = FreeAddr(t)
	}
	secretFile := Format(t, opts.DataDir, opts.Layout)
	secret, err := auth.ReadSecretFile(secretFile)
	if err != nil {
		t.Fatal(err)
	}
	logf, err := os.OpenFile(filepath.Join(opts.DataDir, "meta.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "meta", "--data", opts.DataDir, "--listen", opts.Listen, "--secret-file", secretFile,
		"--heartbeat-timeout", opts.HeartbeatTimeout.String(), "--session-ttl", opts.SessionTTL.String())
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatalf("metatest: start %s meta: %v", bin, err)
	}
	p := &Process{Meta: Meta{Addr: opts.Listen, Secret: secret, SecretFile: secretFile, DataDir: opts.DataDir, opts: opts},
		Cmd: cmd, bin: bin, log: logf}
	t.Cleanup(func() { p.Kill(t) })
	if err := p.waitReady(20 * time.Second); err != nil {
		p.Kill(t)
		log, _ := os.ReadFile(logf.Name())
		t.Fatalf("metatest: meta process not ready: %v\n%s", err, log)
	}
	return p
}

func (p *Process) waitReady(timeout time.Duration) error {
	c, err := client.Dial(p.Addr, p.Secret)
	if err != nil {
		return err
	}
	defer c.Close()
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := c.GetAttr(ctx, &metapb.GetAttrRequest{Ino: core.RootIno})
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// PID returns the process id.
func (p *Process) PID() int { return p.Cmd.Process.Pid }

// Kill sends SIGKILL to the process (by PID) and reaps it; idempotent.
func (p *Process) Kill(t testing.TB) {
	if p.Cmd.ProcessState != nil {
		return
	}
	syscall.Kill(p.PID(), syscall.SIGKILL)
	p.Cmd.Wait()
	p.log.Close()
}

// Terminate sends SIGTERM and waits for a clean exit.
func (p *Process) Terminate(t testing.TB) error {
	if p.Cmd.ProcessState != nil {
		return nil
	}
	syscall.Kill(p.PID(), syscall.SIGTERM)
	err := p.Cmd.Wait()
	p.log.Close()
	return err
}

// Restart starts a new process on the same data directory and address.
func (p *Process) Restart(t testing.TB) {
	t.Helper()
	p.Kill(t)
	n := StartProcess(t, p.bin, p.opts)
	*p = *n
}

type testWriter struct{ t testing.TB }

// Write logs one line to the test.
func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}
