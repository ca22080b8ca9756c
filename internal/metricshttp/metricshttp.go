// Package metricshttp serves a process's Prometheus metrics and Go profiles
// over HTTP: the one server chunkd, the meta server and the mount start
// when given a metrics address (--metrics, --metrics-listen).
package metricshttp

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// readHeaderTimeout bounds how long a client may take to send a request's
// headers, so that idle connections cannot pile up.
const readHeaderTimeout = 10 * time.Second

// Option adds to what Start serves.
type Option func(*options)

type options struct {
	routes []route
	tls    *tls.Config
	tasks  []func(context.Context)
}

type route struct {
	pattern string
	h       http.Handler
}

// WithHandler serves h at pattern (http.ServeMux's patterns) beside the
// metrics and profiles, e.g. a dashboard at "/".
func WithHandler(pattern string, h http.Handler) Option {
	return func(o *options) { o.routes = append(o.routes, route{pattern, h}) }
}

// WithTask runs task in its own goroutine while the server runs: its
// context ends at Shutdown, which waits for it to return.
func WithTask(task func(ctx context.Context)) Option {
	return func(o *options) { o.tasks = append(o.tasks, task) }
}

// WithTLS serves HTTPS with cfg instead of plain HTTP (nil: plain).
func WithTLS(cfg *tls.Config) Option {
	return func(o *options) { o.tls = cfg }
}

// Server is a running metrics and profiling HTTP server.
type Server struct {
	hs        *http.Server
	lis       net.Listener
	done      chan struct{} // closed when Serve has returned
	stopTasks context.CancelFunc
	tasks     sync.WaitGroup
	err       error // what Serve failed with (nil after Shutdown); valid once done is closed
}

// Start listens on addr (host:port; port 0 picks a free one) and serves, in
// the background until Shutdown:
//
//   - /metrics: the metrics gathered from g, in the Prometheus text format;
//   - /debug/pprof/: the Go runtime's profiles (the index, cmdline,
//     profile, symbol, trace and every named profile such as heap or
//     goroutine), as net/http/pprof serves them;
//   - what opts add (WithHandler), over TLS with WithTLS.
//
// When it cannot listen it returns an error naming addr and serves nothing:
// a process asked to serve metrics should then fail to start, not run
// without them.
func Start(addr string, g prometheus.Gatherer, opts ...Option) (*Server, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: listen on %s: %w", addr, err)
	}
	if o.tls != nil {
		lis = tls.NewListener(lis, o.tls)
	}
	mux := http.NewServeMux()
	for _, r := range o.routes {
		mux.Handle(r.pattern, r.h)
	}
	mux.Handle("/metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	s := &Server{hs: &http.Server{Handler: mux, ReadHeaderTimeout: readHeaderTimeout}, lis: lis, done: make(chan struct{})}
	var tctx context.Context
	tctx, s.stopTasks = context.WithCancel(context.Background())
	for _, task := range o.tasks {
		s.tasks.Go(func() { task(tctx) })
	}
	go func() {
		defer close(s.done)
		if err := s.hs.Serve(lis); !errors.Is(err, http.ErrServerClosed) {
			s.err = fmt.Errorf("metrics: serve on %s: %w", lis.Addr(), err)
		}
	}()
	return s, nil
}

// Addr returns the address the server listens on, with the port it picked
// when asked for port 0; "" for a nil Server (metrics off).
func (s *Server) Addr() string {
	if s == nil {
		return ""
	}
	return s.lis.Addr().String()
}

// Shutdown stops listening, lets the requests being served finish until ctx
// ends and then closes their connections. It returns the error the server
// failed with while serving, if any, else ctx's error if requests had to be
// cut off, else nil. A nil Server (metrics off) returns nil at once. Call it
// once.
func (s *Server) Shutdown(ctx context.Context) error {
	if s == nil {
		return nil
	}
	s.stopTasks()
	s.tasks.Wait()
	err := s.hs.Shutdown(ctx)
	if err != nil {
		s.hs.Close()
		err = fmt.Errorf("metrics: shut down %s: %w", s.lis.Addr(), err)
	}
	<-s.done
	if s.err != nil {
		return s.err
	}
	return err
}

// Stop is Shutdown for a process that exits: requests being served get up
// to grace to finish (a CPU profile being taken is cut short), and an error
// is logged to log rather than returned. A nil Server does nothing.
func (s *Server) Stop(grace time.Duration, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		log.Warn("metrics server", "err", err)
	}
}
