// Package server runs the metadata service: it opens the bbolt store in the
// data directory, serves core.Service over gRPC behind the cluster secret,
// records Prometheus metrics and shuts down cleanly.
package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/rdmafs/rdmafs/internal/metricshttp"
	"github.com/rdmafs/rdmafs/internal/stripe"
	"github.com/rdmafs/rdmafs/meta/auth"
	"github.com/rdmafs/rdmafs/meta/core"
	"github.com/rdmafs/rdmafs/meta/dashboard"
	"github.com/rdmafs/rdmafs/meta/kv"
	"github.com/rdmafs/rdmafs/meta/kv/bolt"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// SecretFileName is the default name of the secret file in the data directory.
const SecretFileName = "secret"

// DefaultSecretFile returns the default secret file of a data directory.
func DefaultSecretFile(dataDir string) string { return filepath.Join(dataDir, SecretFileName) }

// Format initializes a new metadata data directory with the default layout
// and generates the cluster secret into secretFile (default: in dataDir).
// It returns the cluster id.
func Format(ctx context.Context, dataDir, secretFile string, layout stripe.Layout) (string, error) {
	return FormatStore(ctx, dataDir, "", secretFile, layout)
}

// FormatStore is Format for either store: bbolt in dataDir, or the etcd
// URL kvURL when it is set (then secretFile is required).
func FormatStore(ctx context.Context, dataDir, kvURL, secretFile string, layout stripe.Layout) (string, error) {
	if secretFile == "" {
		if dataDir == "" {
			return "", errors.New("server: format needs a secret file path (--secret-file) or a data directory")
		}
		secretFile = DefaultSecretFile(dataDir)
	}
	store, err := OpenStore(ctx, dataDir, kvURL, nil)
	if err != nil {
		return "", err
	}
	where := dataDir
	if kvURL != "" {
		where = kvURL
	}
	id, err := core.Format(ctx, store, layout, time.Now())
	if cerr := store.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		return "", err
	}
	if _, err := auth.GenerateSecretFile(secretFile); err != nil {
		return "", fmt.Errorf("formatted %s but: %w", where, err)
	}
	return id, nil
}

// SetTrash records in the formatted store of dataDir (or kvURL), while no
// server runs on it, how long deleted files are kept in the trash (0: no
// trash; format leaves the default, a day).
func SetTrash(ctx context.Context, dataDir, kvURL string, d time.Duration) error {
	store, err := OpenStore(ctx, dataDir, kvURL, nil)
	if err != nil {
		return err
	}
	err = core.SetTrashTime(ctx, store, d)
	if cerr := store.Close(); err == nil {
		err = cerr
	}
	return err
}

// OpenStore opens the metadata store: the etcd URL kvURL when set (with
// group commit, as the server uses it), else bbolt in dataDir. For tools
// (format, dump, load) that use the store while no server writes to it.
func OpenStore(ctx context.Context, dataDir, kvURL string, logger *slog.Logger) (kv.Store, error) {
	if logger == nil {
		logger = slog.Default()
	}
	if kvURL != "" {
		return openEtcd(ctx, kvURL, logger, 0, nil)
	}
	if dataDir == "" {
		return nil, errors.New("server: no metadata store: give a data directory (--data) or an etcd URL (--kv)")
	}
	return bolt.Open(dataDir, bolt.Options{Logger: logger})
}

// Config configures a Server.
type Config struct {
	// DataDir holds the bbolt database (unless KV is set).
	DataDir string
	// KV, when set, is an etcd://host:port[,host:port]/prefix URL: the
	// state lives in etcd and several servers may run on it, one serving
	// (the elected leader) and the others standing by (see ha.go).
	KV string
	// ElectionTTL is the lease of the leader in an etcd election: how long
	// a dead leader blocks its successor (default 5s, at least 1s).
	ElectionTTL time.Duration
	// Listen is the gRPC address, e.g. "127.0.0.1:7400" (":0" picks a port).
	Listen string
	// Secret is the cluster secret clients must present.
	Secret string
	// TLS, when set, makes the server speak gRPC over TLS only (see
	// auth.TLSFiles.ServerConfig); failed handshakes are logged and counted
	// as refused calls are.
	TLS *tls.Config
	// MetricsListen, when set, serves Prometheus metrics at /metrics, Go
	// profiles at /debug/pprof/ (metricshttp.Start) and the web dashboard
	// at / (package dashboard), over TLS when TLS is set; Start fails when
	// it cannot listen there.
	MetricsListen string
	// DashboardInterval is the time between samples of the dashboard's
	// graphs (default 10 s).
	DashboardInterval time.Duration
	// HeartbeatTimeout, SessionTTL and GrantTTL are passed to core.Config.
	HeartbeatTimeout time.Duration
	SessionTTL       time.Duration
	GrantTTL         time.Duration
	// RepairGrace, RepairTaskTimeout and ScrubInterval are passed to
	// core.Config.
	RepairGrace       time.Duration
	RepairTaskTimeout time.Duration
	ScrubInterval     time.Duration
	// DurableReplies is passed to core.Config (bbolt only: etcd answers
	// once a transaction is durable in any case).
	DurableReplies bool
	// Logger receives logs (default slog.Default()).
	Logger *slog.Logger
	// Registry receives the metrics (default: a new registry).
	Registry *prometheus.Registry
}

// Server is a running metadata server.
type Server struct {
	cfg     Config
	store   kv.Store
	svc     *core.Service
	ha      *ha // etcd mode only
	grpc    *grpc.Server
	lis     net.Listener
	metrics *metricshttp.Server
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	once    sync.Once
}

// Start opens the store and starts serving. The server runs until Stop.
func Start(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.Secret == "" {
		return nil, errors.New("server: no cluster secret")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	m := newMetrics(cfg.Registry)
	if cfg.KV != "" {
		return startHA(ctx, cfg, m)
	}
	store, err := bolt.Open(cfg.DataDir, bolt.Options{Logger: cfg.Logger, OnCommit: m.observeCommit})
	if err != nil {
		return nil, err
	}
	// A restarted server presumes its registered chunkservers up until they
	// miss a heartbeat timeout (Takeover), as a new etcd leader does: their
	// heartbeats resume within an interval, and placing writes in the
	// meantime must not fail. One really down is excluded by the writers
	// that fail to reach it, and by the heartbeat sweep.
	svc, err := core.New(ctx, core.Config{Store: store, Logger: cfg.Logger, HeartbeatTimeout: cfg.HeartbeatTimeout,
		SessionTTL: cfg.SessionTTL, GrantTTL: cfg.GrantTTL, OnRetry: m.retries.Inc,
		RepairGrace: cfg.RepairGrace, RepairTaskTimeout: cfg.RepairTaskTimeout, ScrubInterval: cfg.ScrubInterval, Takeover: true,
		DurableReplies: cfg.DurableReplies})
	if err != nil {
		store.Close()
		return nil, err
	}
	registerRepairMetrics(cfg.Registry, func() *core.Service { return svc })
	lis, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		store.Close()
		return nil, fmt.Errorf("server: listen on %s: %w", cfg.Listen, err)
	}
	s := &Server{cfg: cfg, store: store, svc: svc, lis: lis}
	s.grpc = newGRPC(cfg, m, svc)
	metapb.RegisterMetaServer(s.grpc, newBatchService(svc, m))
	if s.metrics, err = startMetrics(cfg, func(ctx context.Context) (*metapb.StatusReply, error) {
		return svc.Status(ctx, &metapb.StatusRequest{Brief: true})
	}); err != nil {
		lis.Close()
		store.Close()
		return nil, err
	}
	runCtx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		svc.Run(runCtx)
	}()
	go func() {
		defer s.wg.Done()
		if err := s.grpc.Serve(lis); err != nil {
			cfg.Logger.Error("grpc server", "err", err)
		}
	}()
	cfg.Logger.Info("meta server started", "listen", lis.Addr().String(), "data", cfg.DataDir,
		"cluster", svc.ClusterID(), "layout", svc.DefaultLayout().String(), "metrics", s.MetricsAddr())
	return s, nil
}

// Addr returns the gRPC listen address.
func (s *Server) Addr() string {
	if s.ha != nil {
		return s.ha.mux.Addr().String()
	}
	return s.lis.Addr().String()
}

// MetricsAddr returns the metrics listen address, or "" without metrics.
func (s *Server) MetricsAddr() string {
	if s.ha != nil {
		return s.ha.metrics.Addr()
	}
	return s.metrics.Addr()
}

// startMetrics starts the metrics server of cfg.MetricsListen, if set (nil
// if not), with the dashboard of the cluster status returns, or returns why
// it cannot listen.
func startMetrics(cfg Config, status func(context.Context) (*metapb.StatusReply, error)) (*metricshttp.Server, error) {
	if cfg.MetricsListen == "" {
		return nil, nil
	}
	d := dashboard.New(dashboard.Config{Status: status, Gatherer: cfg.Registry, Secret: cfg.Secret,
		Interval: cfg.DashboardInterval, Logger: cfg.Logger})
	ms, err := metricshttp.Start(cfg.MetricsListen, cfg.Registry, metricshttp.WithHandler("/", d.Handler()),
		metricshttp.WithTask(d.Run), metricshttp.WithTLS(httpTLS(cfg.TLS)))
	if err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	return ms, nil
}

// httpTLS is the TLS of the HTTP listener, given the gRPC listener's (nil:
// none): the same certificate, with client certificates verified when
// given but not required, so that a browser without one can open the
// dashboard with the cluster secret.
func httpTLS(grpcTLS *tls.Config) *tls.Config {
	if grpcTLS == nil {
		return nil
	}
	c := grpcTLS.Clone()
	if c.ClientAuth == tls.RequireAndVerifyClientCert {
		c.ClientAuth = tls.VerifyClientCertIfGiven
	}
	return c
}

// Service returns the service the server runs (in etcd mode: the service of
// the current leadership term, nil on a standby).
func (s *Server) Service() *core.Service {
	if s.ha != nil {
		return s.ha.service()
	}
	return s.svc
}

// Stop stops accepting calls, waits for running calls up to ctx's deadline
// (then cancels them), stops background work and closes the store.
func (s *Server) Stop(ctx context.Context) error {
	var err error
	if s.ha != nil {
		s.once.Do(func() { err = s.ha.stop(ctx) })
		return err
	}
	s.once.Do(func() {
		done := make(chan struct{})
		go func() {
			s.grpc.GracefulStop()
			close(done)
		}()
		select {
		case <-done:
		case <-ctx.Done():
			s.grpc.Stop()
			<-done
		}
		if err := s.metrics.Shutdown(ctx); err != nil {
			s.cfg.Logger.Error("metrics server", "err", err)
		}
		s.cancel()
		s.wg.Wait()
		err = s.svc.Close(ctx)
		if cerr := s.store.Close(); err == nil {
			err = cerr
		}
		s.cfg.Logger.Info("meta server stopped")
	})
	return err
}

type metrics struct {
	ops           *prometheus.CounterVec
	latency       *prometheus.HistogramVec
	retries       prometheus.Counter
	groupCommit   prometheus.Histogram
	commitSeconds prometheus.Histogram
	authRejected  *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		ops: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "rdmafs", Subsystem: "meta", Name: "ops_total",
			Help: "Metadata RPCs by method and gRPC code."}, []string{"method", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "rdmafs", Subsystem: "meta", Name: "op_seconds",
			Help: "Metadata RPC latency by method.", Buckets: prometheus.ExponentialBuckets(50e-6, 2, 16)}, []string{"method"}),
		retries: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "rdmafs", Subsystem: "meta", Name: "txn_retries_total",
			Help: "Transactions run again after a conflict."}),
		groupCommit: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "rdmafs", Subsystem: "meta", Name: "group_commit_txns",
			Help: "Transactions per durable group commit.", Buckets: prometheus.ExponentialBuckets(1, 2, 11)}),
		commitSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "rdmafs", Subsystem: "meta", Name: "commit_seconds",
			Help: "Duration of a group commit (bbolt: the write and its fsync; etcd: the transaction).", Buckets: prometheus.ExponentialBuckets(50e-6, 2, 16)}),
		authRejected: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "rdmafs", Subsystem: "meta", Name: "auth_rejected_total",
			Help: "Calls and TLS handshakes refused, by reason (no_secret, wrong_secret, bad_token, token_scope, tls_handshake)."}, []string{"reason"}),
	}
	for _, r := range []string{auth.RejectNoSecret, auth.RejectWrongSecret, auth.RejectBadToken, auth.RejectTokenScope, auth.RejectTLS} {
		m.authRejected.WithLabelValues(r)
	}
	reg.MustRegister(m.ops, m.latency, m.retries, m.groupCommit, m.commitSeconds, m.authRejected)
	return m
}

func (m *metrics) unaryInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	start := time.Now()
	resp, err := h(ctx, req)
	m.observe(filepath.Base(info.FullMethod), start, err)
	return resp, err
}

// observeCommit records a group commit of n transactions that took d.
func (m *metrics) observeCommit(n int, d time.Duration) {
	m.groupCommit.Observe(float64(n))
	m.commitSeconds.Observe(d.Seconds())
}

// observe counts a call of method that began at start and ended with err.
func (m *metrics) observe(method string, start time.Time, err error) {
	m.latency.WithLabelValues(method).Observe(time.Since(start).Seconds())
	m.ops.WithLabelValues(method, status.Code(err).String()).Inc()
}

// registerRepairMetrics exports the state of repair of the service svc
// returns: the queue, stripes by health (as of the last scan) and the tasks
// done and failed. On a standby (svc returns nil) they are 0; a new leader
// term counts from 0.
func registerRepairMetrics(reg prometheus.Registerer, svc func() *core.Service) {
	const ns, sub = "rdmafs", "meta"
	stats := func() core.RepairStats {
		if s := svc(); s != nil {
			return s.RepairStats()
		}
		return core.RepairStats{}
	}
	gauge := func(name, help string, f func(core.RepairStats) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help},
			func() float64 { return f(stats()) })
	}
	counter := func(name, help string, f func(core.RepairStats) float64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help},
			func() float64 { return f(stats()) })
	}
	health := func(h string, f func(core.Health) uint64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "stripes",
			Help: "Stripes by health as of the last repair scan.", ConstLabels: prometheus.Labels{"health": h}},
			func() float64 { return float64(f(stats().Health)) })
	}
	reg.MustRegister(
		gauge("repair_queue", "Shards waiting to be rebuilt or moved.", func(r core.RepairStats) float64 { return float64(r.Queued) }),
		gauge("repair_in_flight", "Repair tasks assigned to chunkservers.", func(r core.RepairStats) float64 { return float64(r.InFlight) }),
		gauge("repair_bytes_per_second", "Recent repair throughput (bytes of rebuilt shards committed).", func(r core.RepairStats) float64 { return r.BytesPerSecond }),
		counter("repairs_done_total", "Repair tasks committed.", func(r core.RepairStats) float64 { return float64(r.Done) }),
		counter("repairs_failed_total", "Repair tasks failed or timed out.", func(r core.RepairStats) float64 { return float64(r.Failed) }),
		counter("repairs_stale_total", "Repair results rejected because the stripe changed.", func(r core.RepairStats) float64 { return float64(r.Stale) }),
		counter("repair_bytes_total", "Bytes of rebuilt shards committed.", func(r core.RepairStats) float64 { return float64(r.BytesRebuilt) }),
		health("healthy", func(h core.Health) uint64 { return h.Healthy }),
		health("degraded", func(h core.Health) uint64 { return h.Degraded }),
		health("lost", func(h core.Health) uint64 { return h.Lost }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "file_bytes",
			Help: "Bytes of file data in stripes as of the last repair scan, shared with a snapshot (each referencing stripe counted) or not.", ConstLabels: prometheus.Labels{"sharing": "shared"}},
			func() float64 { return float64(stats().Space.SharedBytes) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "file_bytes",
			Help: "Bytes of file data in stripes as of the last repair scan, shared with a snapshot (each referencing stripe counted) or not.", ConstLabels: prometheus.Labels{"sharing": "unshared"}},
			func() float64 { return float64(stats().Space.UniqueBytes) }),
		gauge("trash_files", "Deleted files kept in the trash, as of the last repair scan.", func(r core.RepairStats) float64 { return float64(r.Space.TrashFiles) }),
		gauge("trash_bytes", "Bytes of file data kept in the trash, as of the last repair scan.", func(r core.RepairStats) float64 { return float64(r.Space.TrashBytes) }),
	)
}
