// Package etcdtest starts a real, single-member etcd server on 127.0.0.1 with
// free ports and a private data directory, for tests and benchmarks. The
// server is started and stopped by process id.
package etcdtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// EnvBinary names the environment variable that may point at the etcd binary.
const EnvBinary = "RDMAFS_ETCD"

// MaxTxnOps is the --max-txn-ops the server is started with. rdmafs commits a
// whole metadata transaction (and, when batching, a group of them) as one
// etcd transaction with one compare per key read, so the default of 128 is
// far too small; operators must raise it the same way.
const MaxTxnOps = 1 << 20

// MaxRequestBytes is the --max-request-bytes the server is started with.
const MaxRequestBytes = 64 << 20

// Binary returns the path of the etcd server binary: $RDMAFS_ETCD, else etcd
// on $PATH, else /usr/bin/etcd.
func Binary() (string, error) {
	if p := os.Getenv(EnvBinary); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("etcdtest: %s=%s: %w", EnvBinary, p, err)
		}
		return p, nil
	}
	if p, err := exec.LookPath("etcd"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/bin/etcd"); err == nil {
		return "/usr/bin/etcd", nil
	}
	return "", errors.New("etcdtest: the etcd server binary is not installed: run `apt-get install etcd-server` " +
		"(make deps does) or set " + EnvBinary + " to its path; the etcd backend tests need a real etcd")
}

// Options configures a server.
type Options struct {
	// Dir is the parent of the data directory (default: a new temporary
	// directory removed by Stop).
	Dir string
	// Log receives the server's output (default: discarded, but the tail is
	// kept for error messages).
	Log *os.File
	// MaxTxnOps overrides the --max-txn-ops of the server (default MaxTxnOps).
	MaxTxnOps int
}

// Server is a running etcd process.
type Server struct {
	cmd      *exec.Cmd
	dir      string
	ownDir   bool
	endpoint string
	out      *tailBuffer
	waited   chan struct{}
	waitErr  error
	stopOnce sync.Once
}

// Start launches etcd and waits until it answers on its client port.
func Start(ctx context.Context, opts Options) (*Server, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	dir, own := opts.Dir, false
	if dir == "" {
		if dir, err = os.MkdirTemp("", "rdmafs-etcd-"); err != nil {
			return nil, fmt.Errorf("etcdtest: temp dir: %w", err)
		}
		own = true
	}
	ports, err := freePorts(2)
	if err != nil {
		return nil, err
	}
	txnOps := opts.MaxTxnOps
	if txnOps <= 0 {
		txnOps = MaxTxnOps
	}
	client := fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	peer := fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	args := []string{
		"--name", "rdmafs-test",
		"--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "rdmafs-test=" + peer,
		"--initial-cluster-state", "new",
		"--max-txn-ops", fmt.Sprint(txnOps),
		"--max-request-bytes", fmt.Sprint(MaxRequestBytes),
		"--quota-backend-bytes", fmt.Sprint(int64(8) << 30),
		"--auto-compaction-mode", "revision", "--auto-compaction-retention", "100000",
		"--logger", "zap", "--log-level", "error",
	}
	s := &Server{dir: dir, ownDir: own, endpoint: strings.TrimPrefix(client, "http://"), out: &tailBuffer{max: 16 << 10}, waited: make(chan struct{})}
	s.cmd = exec.Command(bin, args...)
	s.cmd.Stdout, s.cmd.Stderr = s.out, s.out
	if opts.Log != nil {
		s.cmd.Stdout, s.cmd.Stderr = opts.Log, opts.Log
	}
	// Its own process group, so that a Ctrl-C aimed at the test does not
	// kill it before Stop, and Stop kills exactly this process.
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		s.cleanup()
		return nil, fmt.Errorf("etcdtest: start %s: %w", bin, err)
	}
	go func() {
		s.waitErr = s.cmd.Wait()
		close(s.waited)
	}()
	if err := s.waitReady(ctx); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

// StartT starts a server for a test and stops it when the test ends. A
// missing etcd binary fails the test: the etcd backend is part of the suite.
func StartT(tb testing.TB) *Server {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := Start(ctx, Options{})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.Stop() })
	return s
}

func (s *Server) waitReady(ctx context.Context) error {
	deadline := time.NewTimer(20 * time.Second)
	defer deadline.Stop()
	for {
		select {
		case <-s.waited:
			return fmt.Errorf("etcdtest: etcd exited during startup (%v): %s", s.waitErr, s.out.String())
		case <-deadline.C:
			return fmt.Errorf("etcdtest: etcd did not become ready in 20s: %s", s.out.String())
		case <-ctx.Done():
			return fmt.Errorf("etcdtest: waiting for etcd: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
		if healthy(ctx, s.endpoint) {
			return nil
		}
	}
}

// healthy asks the /health endpoint of the client port.
func healthy(ctx context.Context, endpoint string) bool {
	d := net.Dialer{Timeout: time.Second}
	c, err := d.DialContext(ctx, "tcp", endpoint)
	if err != nil {
		return false
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	fmt.Fprintf(c, "GET /health HTTP/1.0\r\nHost: %s\r\n\r\n", endpoint)
	var buf bytes.Buffer
	tmp := make([]byte, 512)
	for {
		n, err := c.Read(tmp)
		buf.Write(tmp[:n])
		if err != nil {
			break
		}
	}
	return bytes.Contains(buf.Bytes(), []byte(`"health":"true"`))
}

// Endpoint returns host:port of the client URL.
func (s *Server) Endpoint() string { return s.endpoint }

// URL returns the rdmafs --kv URL of this server with the given key prefix.
func (s *Server) URL(prefix string) string { return "etcd://" + s.endpoint + "/" + prefix }

// PID returns the etcd process id.
func (s *Server) PID() int { return s.cmd.Process.Pid }

// Stop kills the etcd process (by its pid), waits for it and removes its
// temporary data directory.
func (s *Server) Stop() error {
	s.stopOnce.Do(func() {
		select {
		case <-s.waited:
		default:
			s.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-s.waited:
			case <-time.After(5 * time.Second):
				s.cmd.Process.Kill()
				<-s.waited
			}
		}
		s.cleanup()
	})
	return nil
}

func (s *Server) cleanup() {
	if s.ownDir {
		os.RemoveAll(s.dir)
	}
}

// freePorts returns n distinct free TCP ports on 127.0.0.1.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var out []int
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("etcdtest: free port: %w", err)
		}
		ls = append(ls, l)
		out = append(out, l.Addr().(*net.TCPAddr).Port)
	}
	return out, nil
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
	max int
}

// Write implements io.Writer.
func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if len(b.buf) > b.max {
		b.buf = append([]byte(nil), b.buf[len(b.buf)-b.max:]...)
	}
	return len(p), nil
}

// String returns the kept output.
func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.TrimSpace(string(b.buf))
}
