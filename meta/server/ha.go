package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path"
	"sync"
	"time"

	"go.etcd.io/etcd/client/v3/concurrency"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/rdmafs/rdmafs/internal/datakey"
	"github.com/rdmafs/rdmafs/internal/metricshttp"
	"github.com/rdmafs/rdmafs/meta/auth"
	"github.com/rdmafs/rdmafs/meta/core"
	"github.com/rdmafs/rdmafs/meta/dashboard"
	"github.com/rdmafs/rdmafs/meta/kv/etcdkv"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// Several servers on one etcd: leader and standbys. Every server listens on
// its gRPC address. The one that wins the etcd election (a lease-backed
// leader key) loads the state from etcd and serves; the others answer every
// call with codes.Unavailable, so clients move on to the next address.
// Every commit of the leader is fenced on its leader key, so a server that
// lost its lease cannot write even before it notices. When the leader dies
// its lease expires after ElectionTTL and a standby takes over.

// cacheEntries is the value cache of a serving meta server's etcd store.
const cacheEntries = 1 << 18

func openEtcd(ctx context.Context, kvURL string, logger *slog.Logger, cache int, onCommit func(int, time.Duration)) (*etcdkv.Store, error) {
	ec, err := etcdkv.ParseURL(kvURL)
	if err != nil {
		return nil, err
	}
	tlsCfg, err := ec.TLSConfig()
	if err != nil {
		return nil, err
	}
	return etcdkv.Open(ctx, etcdkv.Options{Endpoints: ec.Endpoints, Prefix: ec.Prefix, Batch: true, Logger: logger, OnCommit: onCommit,
		CacheEntries: cache, TLS: tlsCfg})
}

type ha struct {
	cfg     Config
	m       *metrics
	store   *etcdkv.Store
	prefix  string
	mux     *connMux
	metrics *metricshttp.Server
	cancel  context.CancelFunc
	done    chan struct{}
	stopCtx chan context.Context // Stop's context, for the graceful stop of the leader term

	mu  sync.Mutex
	svc *core.Service // of the current leader term, nil when standing by
}

func startHA(ctx context.Context, cfg Config, m *metrics) (*Server, error) {
	ec, err := etcdkv.ParseURL(cfg.KV)
	if err != nil {
		return nil, err
	}
	if cfg.ElectionTTL <= 0 {
		cfg.ElectionTTL = 5 * time.Second
	}
	cfg.ElectionTTL = max(cfg.ElectionTTL, time.Second)
	store, err := openEtcd(ctx, cfg.KV, cfg.Logger, cacheEntries, m.observeCommit)
	if err != nil {
		return nil, err
	}
	lis, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		store.Close()
		return nil, fmt.Errorf("server: listen on %s: %w", cfg.Listen, err)
	}
	h := &ha{cfg: cfg, m: m, store: store, prefix: ec.Prefix, mux: newConnMux(lis), done: make(chan struct{}), stopCtx: make(chan context.Context, 1)}
	registerRepairMetrics(cfg.Registry, h.service)
	if h.metrics, err = startMetrics(cfg, h.status); err != nil {
		lis.Close()
		store.Close()
		return nil, err
	}
	go h.mux.run()
	runCtx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	go h.run(runCtx)
	cfg.Logger.Info("meta server started on etcd, campaigning for leadership", "listen", lis.Addr().String(), "kv", cfg.KV, "election_ttl", cfg.ElectionTTL)
	return &Server{cfg: cfg, store: store, ha: h}, nil
}

func (h *ha) service() *core.Service {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.svc
}

// IsLeader reports whether the server currently serves (etcd mode: won the
// election; bbolt mode: always).
func (s *Server) IsLeader() bool { return s.ha == nil || s.ha.service() != nil }

func (h *ha) run(ctx context.Context) {
	defer close(h.done)
	standby := h.serveStandby()
	for ctx.Err() == nil {
		var err error
		standby, err = h.term(ctx, standby)
		if err != nil && ctx.Err() == nil {
			h.cfg.Logger.Error("meta leadership term ended", "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
	standby.Stop()
}

// serveStandby makes new connections go to a server that refuses every
// call with Unavailable.
func (h *ha) serveStandby() *grpc.Server {
	opts := []grpc.ServerOption{grpc.UnknownServiceHandler(func(srv any, stream grpc.ServerStream) error {
		return status.Error(codes.Unavailable, "rdmafs meta: this server is a standby (not the elected leader); use another meta address")
	})}
	if h.cfg.TLS != nil {
		// Clients must not send their secret in clear to a standby either.
		guard := auth.NewGuard(h.cfg.Secret, h.cfg.Logger, func(reason string) { h.m.authRejected.WithLabelValues(reason).Inc() })
		opts = append(opts, grpc.Creds(guard.TLS(h.cfg.TLS)))
	}
	g := grpc.NewServer(opts...)
	sub := h.mux.next()
	go g.Serve(sub)
	return g
}

// term campaigns, serves while leader and returns the standby server that
// serves afterwards.
func (h *ha) term(ctx context.Context, standby *grpc.Server) (*grpc.Server, error) {
	log := h.cfg.Logger
	sess, err := concurrency.NewSession(h.store.Client(), concurrency.WithTTL(int((h.cfg.ElectionTTL+time.Second-1)/time.Second)), concurrency.WithContext(ctx))
	if err != nil {
		return standby, fmt.Errorf("server: etcd session: %w", err)
	}
	// Closing the session revokes the lease: after a clean stop a standby
	// takes over at once instead of after the TTL.
	defer sess.Close()
	el := concurrency.NewElection(sess, etcdkv.LeaderPrefix(h.prefix))
	if err := el.Campaign(ctx, h.mux.Addr().String()); err != nil {
		return standby, fmt.Errorf("server: campaign: %w", err)
	}
	h.store.SetFence(el.Key(), el.Rev())
	svc, err := core.New(ctx, core.Config{Store: h.store, Logger: log, HeartbeatTimeout: h.cfg.HeartbeatTimeout,
		SessionTTL: h.cfg.SessionTTL, GrantTTL: h.cfg.GrantTTL, OnRetry: h.m.retries.Inc, Takeover: true,
		RepairGrace: h.cfg.RepairGrace, RepairTaskTimeout: h.cfg.RepairTaskTimeout, ScrubInterval: h.cfg.ScrubInterval})
	if err != nil {
		return standby, fmt.Errorf("server: load state as new leader: %w", err)
	}
	g := newGRPC(h.cfg, h.m, svc)
	metapb.RegisterMetaServer(g, newBatchService(svc, h.m))
	sub := h.mux.next()
	go g.Serve(sub)
	standby.Stop()
	runCtx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		svc.Run(runCtx)
	}()
	h.mu.Lock()
	h.svc = svc
	h.mu.Unlock()
	log.Info("elected meta leader: serving", "listen", h.mux.Addr().String(), "cluster", svc.ClusterID(), "leader_key", el.Key())

	var lost error
	select {
	case <-ctx.Done():
	case <-sess.Done():
		// The session also ends when Stop cancels ctx: that is a clean
		// stop, not a lost lease.
		if ctx.Err() == nil {
			lost = errors.New("lost the etcd leader lease; standing by")
		}
	}
	h.mu.Lock()
	h.svc = nil
	h.mu.Unlock()
	standby = h.serveStandby()
	if lost != nil {
		g.Stop()
	} else {
		gracefulStop(g, <-h.stopCtx)
	}
	cancel()
	wg.Wait()
	if lost == nil {
		// Let a standby take over now.
		rctx, rcancel := context.WithTimeout(context.Background(), 2*time.Second)
		el.Resign(rctx)
		rcancel()
	}
	return standby, lost
}

func gracefulStop(g *grpc.Server, ctx context.Context) {
	done := make(chan struct{})
	go func() {
		g.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		g.Stop()
		<-done
	}
}

func (h *ha) stop(ctx context.Context) error {
	h.stopCtx <- ctx
	h.cancel()
	<-h.done
	h.mux.Close()
	if err := h.metrics.Shutdown(ctx); err != nil {
		h.cfg.Logger.Error("metrics server", "err", err)
	}
	err := h.store.Close()
	h.cfg.Logger.Info("meta server stopped")
	return err
}

// newGRPC is the gRPC server of a serving meta server for svc.
func newGRPC(cfg Config, m *metrics, svc *core.Service) *grpc.Server {
	guard := auth.NewGuard(cfg.Secret, cfg.Logger, func(reason string) { m.authRejected.WithLabelValues(reason).Inc() })
	opts := []grpc.ServerOption{
		// Metrics first: calls a mount token is refused count in ops_total.
		grpc.ChainUnaryInterceptor(m.unaryInterceptor, guard.Unary(), restrictTokens(svc, guard, []byte(cfg.Secret))),
		grpc.ChainStreamInterceptor(guard.Stream()),
		// Static flow-control windows: metadata messages are small, and
		// the dynamic window's bandwidth probe (a PING and a WINDOW_UPDATE
		// after most messages received) doubled the frames, syscalls and
		// wake-ups of every call.
		grpc.StaticStreamWindowSize(streamWindow), grpc.StaticConnWindowSize(connWindow),
		// Calls run on long-lived goroutines whose stacks have grown
		// already, instead of a new goroutine each (busy workers: a new
		// goroutine as before).
		grpc.NumStreamWorkers(streamWorkers),
	}
	if cfg.TLS != nil {
		opts = append(opts, grpc.Creds(guard.TLS(cfg.TLS)))
	}
	return grpc.NewServer(opts...)
}

// Flow-control windows for what clients send (as meta/client's for what
// the server sends).
const (
	streamWindow = 1 << 20
	connWindow   = 8 << 20
)

// streamWorkers is the number of goroutines kept to run calls.
const streamWorkers = 64

// connMux hands the connections of one listener to whichever server
// currently serves: the standby server or the leader's.
type connMux struct {
	l   net.Listener
	mu  sync.Mutex
	cur *subListener
}

func newConnMux(l net.Listener) *connMux { return &connMux{l: l} }

// Addr returns the shared listener's address.
func (m *connMux) Addr() net.Addr { return m.l.Addr() }

func (m *connMux) run() {
	for {
		c, err := m.l.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return
		}
		m.mu.Lock()
		cur := m.cur
		m.mu.Unlock()
		if cur == nil || !cur.deliver(c) {
			c.Close()
		}
	}
}

// next makes a new sub-listener the receiver of new connections.
func (m *connMux) next() *subListener {
	s := &subListener{conns: make(chan net.Conn), done: make(chan struct{}), addr: m.l.Addr()}
	m.mu.Lock()
	m.cur = s
	m.mu.Unlock()
	return s
}

// Close closes the shared listener.
func (m *connMux) Close() error { return m.l.Close() }

type subListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
	addr  net.Addr
}

func (s *subListener) deliver(c net.Conn) bool {
	select {
	case s.conns <- c:
		return true
	case <-s.done:
		return false
	}
}

// Accept implements net.Listener.
func (s *subListener) Accept() (net.Conn, error) {
	select {
	case c := <-s.conns:
		return c, nil
	case <-s.done:
		return nil, net.ErrClosed
	}
}

// Close implements net.Listener; the shared listener stays open.
func (s *subListener) Close() error {
	s.once.Do(func() { close(s.done) })
	return nil
}

// Addr implements net.Listener.
func (s *subListener) Addr() net.Addr { return s.addr }

// restrictTokens enforces the mount token of a call admitted with one
// (core.Service.Restrict before, Admitted after) and gives the token a
// capability for every chunk its reply names (the shards of files it may
// use); calls made with the cluster secret pass untouched.
func restrictTokens(svc *core.Service, guard *auth.Guard, secret []byte) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		t, ok := auth.TokenFrom(ctx)
		if !ok {
			return h(ctx, req)
		}
		msg, ok := req.(proto.Message)
		if !ok {
			return nil, status.Errorf(codes.Internal, "request of %s is not a protobuf message", info.FullMethod)
		}
		method := path.Base(info.FullMethod)
		if err := svc.Restrict(ctx, t, method, msg); err != nil {
			guard.Refused(ctx, auth.RejectTokenScope, info.FullMethod, "token", fmt.Sprintf("%x", t.ID), "err", err)
			return nil, err
		}
		resp, err := h(ctx, req)
		r, ok := resp.(proto.Message)
		if err != nil || !ok {
			return resp, err
		}
		// A reply this changes (the session's root, the shards'
		// capabilities) is copied first: the service may share its
		// messages (cached stripes, exactly-once records). The others are
		// only read.
		_, changed := r.(*metapb.OpenSessionReply)
		metapb.EachShard(r, func(*metapb.Shard) { changed = true })
		if changed {
			r = proto.Clone(r)
		}
		svc.Admitted(t, r)
		// Write capabilities only where meta grants a write (a commit's
		// reply names shards only in the next grants it makes).
		write := !t.ReadOnly && (method == "GrantWrite" || method == "ReplaceShards" || method == "CommitStripes")
		metapb.EachShard(r, func(sh *metapb.Shard) {
			sh.Cap, sh.CapWrite = datakey.Capability(secret, t.ID, sh.ChunkId, write), write
		})
		return r, nil
	}
}

// status is the dashboard's brief status of the current leader term's
// service, or dashboard.ErrStandby.
func (h *ha) status(ctx context.Context) (*metapb.StatusReply, error) {
	svc := h.service()
	if svc == nil {
		return nil, dashboard.ErrStandby
	}
	return svc.Status(ctx, &metapb.StatusRequest{Brief: true})
}
