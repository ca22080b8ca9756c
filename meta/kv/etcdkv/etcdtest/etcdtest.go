// Package etcdtest starts a real, single-member etcd server for tests: a thin
// wrapper over package etcdproc (127.0.0.1, free ports, a private data
// directory, started and stopped by process id) that ties the server's life to
// a test. Commands must use etcdproc directly: this package imports testing.
package etcdtest

import (
	"context"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/meta/kv/etcdkv/etcdproc"
)

// EnvBinary names the environment variable that may point at the etcd binary
// (etcdproc.EnvBinary).
const EnvBinary = etcdproc.EnvBinary

// MaxTxnOps is the --max-txn-ops servers are started with by default
// (etcdproc.MaxTxnOps).
const MaxTxnOps = etcdproc.MaxTxnOps

// MaxRequestBytes is the --max-request-bytes servers are started with
// (etcdproc.MaxRequestBytes).
const MaxRequestBytes = etcdproc.MaxRequestBytes

// StartTimeout bounds how long StartT waits for the server.
const StartTimeout = 30 * time.Second

// Options configures a server; see etcdproc.Options.
type Options = etcdproc.Options

// Server is a running etcd process; see etcdproc.Server.
type Server = etcdproc.Server

// Binary returns the path of the etcd server binary, as etcdproc.Binary.
func Binary() (string, error) { return etcdproc.Binary() }

// Start launches etcd and waits until it is healthy, as etcdproc.Start; the
// caller stops it.
func Start(ctx context.Context, opts Options) (*Server, error) { return etcdproc.Start(ctx, opts) }

// StartT starts a server for a test, within StartTimeout, and stops it when
// the test ends. A missing etcd binary fails the test rather than skipping
// it: the etcd backend is part of the suite.
func StartT(tb testing.TB) *Server {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), StartTimeout)
	defer cancel()
	s, err := etcdproc.Start(ctx, etcdproc.Options{})
	if err != nil {
		tb.Fatalf("etcdtest: %v", err)
	}
	tb.Cleanup(func() {
		if err := s.Stop(); err != nil {
			tb.Errorf("etcdtest: stop etcd (pid %d): %v", s.PID(), err)
		}
	})
	return s
}
