// Package etcdproc starts and stops a private, single-member etcd server: a
// child process of the caller listening on 127.0.0.1 on free ports, with its
// own data directory, started and stopped by process id. It is what
// `rdmafs bench meta --kv etcd` runs its etcd measurement on, and what the
// test helper etcdtest wraps; it does not import package testing, so that
// commands can link it.
//
// The server is configured for rdmafs: --max-txn-ops and --max-request-bytes
// raised so that a whole metadata transaction fits in one etcd transaction,
// a generous backend quota, revision-based auto-compaction, and fsync on (the
// etcd default), so that figures measured on it include the disk.
package etcdproc

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rdmafs/rdmafs/meta/auth"
)

// EnvBinary names the environment variable that may point at the etcd binary.
const EnvBinary = "RDMAFS_ETCD"

// MaxTxnOps is the --max-txn-ops the server is started with unless
// Options.MaxTxnOps says otherwise. rdmafs commits a whole metadata
// transaction (and, when batching, a group of them) as one etcd transaction
// with one compare per key read, so etcd's default of 128 is far too small;
// operators must raise it the same way.
const MaxTxnOps = 1 << 20

// MaxRequestBytes is the --max-request-bytes the server is started with.
const MaxRequestBytes = 64 << 20

// ReadyTimeout bounds how long Start waits for a started server to answer its
// health check, whatever the context allows.
const ReadyTimeout = 20 * time.Second

// StopGrace is how long Stop waits after SIGTERM before it kills the server.
const StopGrace = 5 * time.Second

// Binary returns the path of the etcd server binary: $RDMAFS_ETCD if set
// (an error if it names no file), else etcd on $PATH, else /usr/bin/etcd; an
// error saying how to install it if there is none.
func Binary() (string, error) {
	if p := os.Getenv(EnvBinary); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("etcdproc: %s=%s: %w", EnvBinary, p, err)
		}
		return p, nil
	}
	if p, err := exec.LookPath("etcd"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/bin/etcd"); err == nil {
		return "/usr/bin/etcd", nil
	}
	return "", errors.New("etcdproc: the etcd server binary is not installed: run `apt-get install etcd-server` " +
		"(make deps does) or set " + EnvBinary + " to its path")
}

// Options configures a server. The zero value is a server in a new temporary
// directory with its output discarded.
type Options struct {
	// Dir is the parent of the data directory (default: a new temporary
	// directory, removed by Stop).
	Dir string
	// Log receives the server's output (default: discarded, but its tail is
	// kept for error messages).
	Log *os.File
	// MaxTxnOps overrides the --max-txn-ops of the server (default MaxTxnOps).
	MaxTxnOps int
	// TLS, when set (auth.GenerateCerts made them), makes the server speak
	// TLS with the server certificate and require client certificates signed
	// by the CA; URL then names the CA and the client certificate.
	TLS *auth.Certs
}

// Server is a running etcd process. Its methods are safe for concurrent use.
type Server struct {
	cmd      *exec.Cmd
	tls      *auth.Certs
	dir      string
	ownDir   bool
	endpoint string
	out      *tailBuffer
	waited   chan struct{} // closed once the process has been reaped
	waitErr  error         // the process's exit, valid once waited is closed

	stopOnce sync.Once
	stopErr  error
}

// Start launches etcd and returns once it answers its health check on the
// client port. It fails if the binary is missing, the process cannot start,
// exits during startup, or is not healthy within ReadyTimeout or before ctx
// is done; on failure nothing is left running and a temporary data directory
// is removed. The caller must call Stop (or Shutdown) on the returned server.
func Start(ctx context.Context, opts Options) (*Server, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	ports, err := freePorts(2)
	if err != nil {
		return nil, err
	}
	dir, own := opts.Dir, false
	if dir == "" {
		if dir, err = os.MkdirTemp("", "rdmafs-etcd-"); err != nil {
			return nil, fmt.Errorf("etcdproc: temp dir: %w", err)
		}
		own = true
	}
	txnOps := opts.MaxTxnOps
	if txnOps <= 0 {
		txnOps = MaxTxnOps
	}
	scheme := "http"
	if opts.TLS != nil {
		scheme = "https"
	}
	client := fmt.Sprintf("%s://127.0.0.1:%d", scheme, ports[0])
	peer := fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	args := []string{
		"--name", "rdmafs",
		"--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "rdmafs=" + peer,
		"--initial-cluster-state", "new",
		"--max-txn-ops", fmt.Sprint(txnOps),
		"--max-request-bytes", fmt.Sprint(MaxRequestBytes),
		"--quota-backend-bytes", fmt.Sprint(int64(8) << 30),
		"--auto-compaction-mode", "revision", "--auto-compaction-retention", "100000",
		"--logger", "zap", "--log-level", "error",
	}
	if c := opts.TLS; c != nil {
		args = append(args, "--cert-file", c.ServerCert, "--key-file", c.ServerKey,
			"--trusted-ca-file", c.CA, "--client-cert-auth")
	}
	s := &Server{dir: dir, ownDir: own, tls: opts.TLS, endpoint: strings.TrimPrefix(client, scheme+"://"),
		out: &tailBuffer{max: 16 << 10}, waited: make(chan struct{})}
	s.cmd = exec.Command(bin, args...)
	s.cmd.Stdout, s.cmd.Stderr = s.out, s.out
	if opts.Log != nil {
		s.cmd.Stdout, s.cmd.Stderr = opts.Log, opts.Log
	}
	// Its own process group, so that a Ctrl-C aimed at the caller does not
	// kill it before Stop, and Stop signals exactly this process; killed if
	// the caller dies first.
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		err = fmt.Errorf("etcdproc: start %s: %w", bin, err)
		return nil, errors.Join(err, s.cleanup())
	}
	go func() {
		s.waitErr = s.cmd.Wait()
		close(s.waited)
	}()
	if err := s.waitReady(ctx); err != nil {
		return nil, errors.Join(err, s.Stop())
	}
	return s, nil
}

// waitReady polls the health check until it passes, the process exits,
// ReadyTimeout passes or ctx is done.
func (s *Server) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeoutCause(ctx, ReadyTimeout, fmt.Errorf("not healthy within %v", ReadyTimeout))
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-s.waited:
			return fmt.Errorf("etcdproc: etcd (pid %d) exited during startup (%v): %s", s.PID(), s.waitErr, s.out.String())
		case <-ctx.Done():
			return fmt.Errorf("etcdproc: waiting for etcd (pid %d) on %s to become healthy: %w: %s",
				s.PID(), s.endpoint, context.Cause(ctx), s.out.String())
		case <-tick.C:
		}
		if s.healthy(ctx) {
			return nil
		}
	}
}

// healthy reports whether the /health endpoint of the client port answers
// that the member is healthy.
func (s *Server) healthy(ctx context.Context) bool {
	endpoint := s.endpoint
	d := net.Dialer{Timeout: time.Second}
	c, err := d.DialContext(ctx, "tcp", endpoint)
	if err != nil {
		return false
	}
	defer c.Close()
	if s.tls != nil {
		cfg, err := s.tls.Client().ClientConfig()
		if err != nil {
			return false
		}
		cfg.ServerName, _, _ = net.SplitHostPort(endpoint)
		tc := tls.Client(c, cfg)
		defer tc.Close()
		c = tc
	}
	if err := c.SetDeadline(time.Now().Add(2 * time.Second)); err != nil {
		return false
	}
	if _, err := fmt.Fprintf(c, "GET /health HTTP/1.0\r\nHost: %s\r\n\r\n", endpoint); err != nil {
		return false
	}
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

// Endpoint returns host:port of the server's client URL.
func (s *Server) Endpoint() string { return s.endpoint }

// URL returns the rdmafs --kv URL of this server with the given key prefix
// (with TLS: its CA and the client certificate as parameters).
func (s *Server) URL(prefix string) string {
	u := "etcd://" + s.endpoint + "/" + prefix
	if s.tls != nil {
		u += "?" + url.Values{"cacert": {s.tls.CA}, "cert": {s.tls.ClientCert}, "key": {s.tls.ClientKey}}.Encode()
	}
	return u
}

// PID returns the etcd process id.
func (s *Server) PID() int { return s.cmd.Process.Pid }

// Stop is Shutdown with StopGrace for SIGTERM to take effect.
func (s *Server) Stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), StopGrace)
	defer cancel()
	return s.Shutdown(ctx)
}

// Shutdown sends the etcd process SIGTERM (by its pid), waits for it to exit
// until ctx is done and then kills it with SIGKILL, reaps it and removes a
// temporary data directory. It returns once the process is gone; its error
// reports only a data directory that could not be removed (a server killed
// for want of time is not an error). Later calls return the first call's
// result without doing anything.
func (s *Server) Shutdown(ctx context.Context) error {
	s.stopOnce.Do(func() {
		select {
		case <-s.waited:
		default:
			// Errors mean the process has already exited: waited closes.
			_ = s.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-s.waited:
			case <-ctx.Done():
				_ = s.cmd.Process.Kill()
				<-s.waited
			}
		}
		s.stopErr = s.cleanup()
	})
	return s.stopErr
}

// cleanup removes the data directory if Start made it.
func (s *Server) cleanup() error {
	if !s.ownDir {
		return nil
	}
	if err := os.RemoveAll(s.dir); err != nil {
		return fmt.Errorf("etcdproc: remove data directory: %w", err)
	}
	return nil
}

// freePorts returns n distinct free TCP ports on 127.0.0.1. They are free
// when it returns; nothing reserves them until etcd binds them.
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
			return nil, fmt.Errorf("etcdproc: free port: %w", err)
		}
		ls = append(ls, l)
		out = append(out, l.Addr().(*net.TCPAddr).Port)
	}
	return out, nil
}

// tailBuffer keeps the last max bytes written to it. It is safe for
// concurrent use.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
	max int
}

// Write implements io.Writer: it keeps p's bytes, dropping the oldest beyond
// max, and never fails.
func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if len(b.buf) > b.max {
		b.buf = append([]byte(nil), b.buf[len(b.buf)-b.max:]...)
	}
	return len(p), nil
}

// String returns the kept output, trimmed of surrounding white space.
func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.TrimSpace(string(b.buf))
}
