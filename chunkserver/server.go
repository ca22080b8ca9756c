package chunkserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rdmafs/rdmafs/chunkserver/chunk"
	"github.com/rdmafs/rdmafs/chunkserver/mempool"
	"github.com/rdmafs/rdmafs/chunkserver/proto"
	"github.com/rdmafs/rdmafs/chunkserver/store"
	"github.com/rdmafs/rdmafs/internal/ratelog"
	"github.com/rdmafs/rdmafs/rdma"
)

// Config configures a Server. Device and Store are required; zero values of the
// rest take the defaults documented on each field.
type Config struct {
	Device rdma.Device  // the rdma transport
	Store  *store.Store // the durable store; the caller closes it after the server
	// Addr is the address to listen on (default "127.0.0.1:0").
	Addr string
	// AdvertiseAddr is the address registered with the metadata service
	// (default: the address the listener is bound to).
	AdvertiseAddr string
	// MemBytes is the size of the registered memory pool (default 256 MiB).
	MemBytes int
	// Secret is the cluster secret clients must prove they hold. Empty means any
	// client that speaks the protocol may connect (a warning is logged).
	Secret []byte
	// Credits bounds the request messages a connection may have outstanding
	// (default 32): each is a posted receive buffer of MaxMsg bytes.
	Credits int
	// MaxBatch bounds the requests in one message (default 64).
	MaxBatch int
	// MaxMsg is the size of a control message buffer (default 4096).
	MaxMsg int
	// LeaseTTL is how long a read lease lasts without renewal (default 10s).
	LeaseTTL time.Duration
	// StagingTTL is how long a prepared write may wait for its commit (default 60s).
	StagingTTL time.Duration
	// WindowsPerConn is the number of memory windows allocated per connection at
	// connect time: the most leases plus staging grants it may hold (default 256).
	WindowsPerConn int
	// MaxStagingPerConn bounds the staging bytes one connection may hold
	// (default a quarter of MemBytes).
	MaxStagingPerConn int
	// SlabPerConn is the size of the staging slab a connection may ask for
	// (OpSlab), held for the connection's life: a patch that fits it is
	// written in one round trip. The slabs of all connections together take
	// at most an eighth of MemBytes. A multiple of 4 KiB; default 256 KiB;
	// negative: no slabs.
	SlabPerConn int
	// MaxConns bounds the connections (default 1024).
	MaxConns int
	// ReapInterval is how often expired leases and staging are revoked
	// (default 50ms).
	ReapInterval time.Duration
	// Now is the clock read leases and staging grants are timed by: a grant
	// made or renewed at Now() lasts until Now() passes it by its TTL
	// (default time.Now). Connect tokens are checked against time.Now
	// whatever Now is: they carry the client's wall clock.
	Now func() time.Time
	// NewTicker returns the ticker that wakes each connection's reaper,
	// asked for once per connection with ReapInterval, before the connection
	// serves its first request; at each tick the reaper revokes the leases
	// and staging grants expired by Now (default: a time.Ticker).
	NewTicker func(d time.Duration) Ticker
	// MaxClockSkew bounds the age of a connect token (default 5 minutes).
	MaxClockSkew time.Duration
	// Zone is the failure-domain label registered with the metadata service.
	Zone string
	// Membership registers with the metadata service; nil runs standalone.
	Membership Membership
	// HeartbeatInterval is the time between heartbeats (default 5s).
	HeartbeatInterval time.Duration
	// Repair configures the repair worker (off without a Planner).
	Repair RepairConfig
	// ScrubRate bounds the bytes per second scrubbing reads back from disk
	// (0: unlimited); the metadata service sets when it runs.
	ScrubRate int64
	// Logger receives the server's logs (default slog.Default()).
	Logger *slog.Logger
	// Registerer receives the server's metrics (nil: not exported).
	Registerer prometheus.Registerer
}

func (c *Config) setDefaults() error {
	if c.Device == nil || c.Store == nil {
		return errors.New("chunkserver: config needs a Device and a Store")
	}
	def := func(p *int, v int) {
		if *p <= 0 {
			*p = v
		}
	}
	defd := func(p *time.Duration, v time.Duration) {
		if *p <= 0 {
			*p = v
		}
	}
	if c.Addr == "" {
		c.Addr = "127.0.0.1:0"
	}
	def(&c.MemBytes, 256<<20)
	def(&c.Credits, 32)
	def(&c.MaxBatch, 64)
	def(&c.MaxMsg, 4096)
	def(&c.WindowsPerConn, 256)
	def(&c.MaxStagingPerConn, c.MemBytes/4)
	def(&c.MaxConns, 1024)
	switch {
	case c.SlabPerConn == 0:
		c.SlabPerConn = 256 << 10
	case c.SlabPerConn < 0:
		c.SlabPerConn = 0
	}
	defd(&c.LeaseTTL, 10*time.Second)
	defd(&c.StagingTTL, 60*time.Second)
	defd(&c.ReapInterval, 50*time.Millisecond)
	defd(&c.MaxClockSkew, 5*time.Minute)
	defd(&c.HeartbeatInterval, 5*time.Second)
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.NewTicker == nil {
		c.NewTicker = newRealTicker
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Credits > 0xffff || c.MaxBatch > 0xffff {
		return fmt.Errorf("chunkserver: credits %d or batch %d over 65535", c.Credits, c.MaxBatch)
	}
	if proto.RequestsSize(c.MaxBatch) > c.MaxMsg || proto.HeaderLen+c.MaxBatch*proto.ReplyLen > c.MaxMsg {
		return fmt.Errorf("chunkserver: a batch of %d does not fit messages of %d bytes", c.MaxBatch, c.MaxMsg)
	}
	if c.SlabPerConn%proto.SlabAlign != 0 || c.SlabPerConn > proto.MaxSlab {
		return fmt.Errorf("chunkserver: slab of %d bytes: a multiple of %d up to %d", c.SlabPerConn, proto.SlabAlign, proto.MaxSlab)
	}
	return nil
}

// ErrNotRegistered is returned by Membership.Heartbeat when the metadata service
// does not know the chunkserver; chunkd registers again.
var ErrNotRegistered = errors.New("chunkserver: not registered with the metadata service")

const numOps = int(proto.LastOp) + 1
const numStatus = int(proto.StatusShuttingDown) + 1

// Server is a running chunkd: a listener, a registered memory pool and the
// connections it serves.
type Server struct {
	cfg     Config
	log     *slog.Logger
	audit   *ratelog.Logger // refused handshakes and malformed messages: a peer can repeat them at will
	store   *store.Store
	pd      rdma.ProtectionDomain
	pool    *mempool.Pool
	cache   *cache
	ln      rdma.Listener
	metrics *Metrics
	opCount [numOps][numStatus]prometheus.Counter
	opLat   [numOps]prometheus.Observer

	nextLease atomic.Uint64
	slabBytes atomic.Int64  // the connections' slabs (grantSlab)
	requests  atomic.Uint64 // requests served, for the heartbeat's load
	full      atomic.Bool   // the last claim of disk room was refused for want of space

	mu     sync.Mutex
	conns  map[*conn]struct{}
	staged map[chunk.Key]*conn // versions being written, and by which connection
	nonces map[[8]byte]time.Time
	// corrupt holds stored versions that failed their checksum, reported to
	// the repair planner until they are deleted.
	corrupt map[chunk.Key]struct{}
	rep     *repairer // nil: repair off
	scrub   *scrubber
	closed  bool
	wg      sync.WaitGroup // connections and background loops

	closeOnce sync.Once
	stop      chan struct{}
}

// New allocates and registers the memory pool and starts listening. Serve then
// accepts connections.
func New(ctx context.Context, cfg Config) (*Server, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	s := &Server{
		cfg: cfg, log: cfg.Logger, store: cfg.Store,
		audit:   ratelog.New(cfg.Logger, time.Second, 20, nil),
		metrics: NewMetrics(cfg.Registerer),
		conns:   make(map[*conn]struct{}),
		staged:  make(map[chunk.Key]*conn),
		nonces:  make(map[[8]byte]time.Time),
		corrupt: make(map[chunk.Key]struct{}),
		stop:    make(chan struct{}),
	}
	for op := 1; op < numOps; op++ {
		name := proto.Op(op).String()
		s.opLat[op] = s.metrics.Latency.WithLabelValues(name)
		for st := 0; st < numStatus; st++ {
			s.opCount[op][st] = s.metrics.Ops.WithLabelValues(name, proto.Status(st).String())
		}
	}
	if len(cfg.Secret) == 0 {
		s.log.Warn("chunkd: no cluster secret configured: any client may connect")
	}
	pd, err := cfg.Device.AllocPD()
	if err != nil {
		return nil, fmt.Errorf("chunkserver: alloc pd: %w", err)
	}
	s.pd = pd
	pool, err := mempool.New(pd, "chunkd", cfg.MemBytes)
	if err != nil {
		pd.Close()
		return nil, fmt.Errorf("chunkserver: memory pool of %d bytes: %w", cfg.MemBytes, err)
	}
	s.pool = pool
	s.cache = newCache(pool, cfg.Store, s.metrics)
	s.cache.onCorrupt = s.noteCorrupt
	s.scrub = newScrubber(s, cfg.ScrubRate)
	if cfg.Repair.Planner != nil {
		if s.rep, err = newRepairer(s, cfg.Repair); err != nil {
			pool.Close()
			pd.Close()
			return nil, err
		}
	}
	ln, err := cfg.Device.Listen(ctx, cfg.Addr)
	if err != nil {
		if s.rep != nil {
			s.rep.close()
		}
		pool.Close()
		pd.Close()
		return nil, fmt.Errorf("chunkserver: listen on %s: %w", cfg.Addr, err)
	}
	s.ln = ln
	s.updateStoreGauges()
	return s, nil
}

// Addr returns the address the server listens on.
func (s *Server) Addr() string { return s.ln.Addr() }

// ID returns the chunkserver's stable id.
func (s *Server) ID() string { return s.store.ID() }

// Metrics returns the server's metrics.
func (s *Server) Metrics() *Metrics { return s.metrics }

// Serve accepts and serves connections until ctx ends or Close is called, then
// shuts down cleanly: connections are closed, leases revoked, staging freed. It
// returns nil after a requested shutdown.
func (s *Server) Serve(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-ctx.Done():
		case <-s.stop:
		}
		cancel()
		s.ln.Close()
	}()
	if s.cfg.Membership != nil {
		s.wg.Add(2)
		go s.membershipLoop(ctx)
		go s.scrub.loop(ctx)
	}
	if s.rep != nil {
		s.wg.Add(1)
		go s.rep.loop(ctx)
	}
	s.log.Info("chunkd: serving", "addr", s.Addr(), "id", s.ID(), "transport", s.cfg.Device.Name(),
		"mem", s.pool.Size(), "credits", s.cfg.Credits)
	var err error
	for {
		req, aerr := s.ln.Accept(ctx)
		if aerr != nil {
			if ctx.Err() != nil {
				break
			}
			s.log.Warn("chunkd: accept", "err", aerr)
			if errors.Is(aerr, rdma.ErrClosed) {
				err = aerr
				break
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.handshake(ctx, req)
		}()
	}
	cancel()
	s.shutdown()
	return err
}

// Close stops Serve; it returns once every connection is closed and the memory is
// released.
func (s *Server) Close() error {
	s.closeOnce.Do(func() { close(s.stop) })
	s.ln.Close()
	s.shutdown()
	return nil
}

func (s *Server) shutdown() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.wg.Wait()
		return
	}
	s.closed = true
	for c := range s.conns {
		c.fail()
	}
	s.mu.Unlock()
	s.wg.Wait()
	if s.rep != nil {
		s.rep.close()
	}
	if err := s.pool.Close(); err != nil {
		s.log.Error("chunkd: release memory", "err", err)
	}
	if err := s.pd.Close(); err != nil {
		s.log.Error("chunkd: close pd", "err", err)
	}
	s.log.Info("chunkd: stopped")
}

// handshake authenticates a connection request and, if it passes, serves it.
func (s *Server) handshake(ctx context.Context, req rdma.ConnRequest) {
	log := s.log.With("peer", req.RemoteAddr())
	reject := func(kind, reason string) {
		s.metrics.Errors.WithLabelValues(kind).Inc()
		s.audit.Warn("chunkd: connection rejected", "peer", req.RemoteAddr(), "kind", kind, "reason", reason)
		if len(reason) > rdma.MaxAcceptPrivateData {
			reason = reason[:rdma.MaxAcceptPrivateData]
		}
		req.Reject([]byte(reason))
	}
	cd, err := proto.DecodeConnect(s.cfg.Secret, req.PrivateData(), time.Now(), s.cfg.MaxClockSkew)
	if err != nil {
		reject("auth", "chunkd: not authorized: "+err.Error())
		return
	}
	if !s.checkNonce(cd.Nonce) {
		reject("auth", "chunkd: not authorized: connect token replayed")
		return
	}
	c, err := s.newConn(ctx, log, req.RemoteAddr())
	if err != nil {
		reject("busy", "chunkd: busy: "+err.Error())
		return
	}
	// The connection takes its place before it is accepted: a client may
	// connect again the moment it has our accept, and must find it counted.
	s.mu.Lock()
	full := len(s.conns) >= s.cfg.MaxConns
	closed := s.closed
	if !full && !closed {
		s.conns[c] = struct{}{}
		s.metrics.Connections.Set(float64(len(s.conns)))
	}
	s.mu.Unlock()
	if closed || full {
		c.destroy()
		if closed {
			reject("shutdown", "chunkd: shutting down")
		} else {
			reject("busy", fmt.Sprintf("chunkd: busy: %d connections", s.cfg.MaxConns))
		}
		return
	}
	c.token = cd.Token
	accept := proto.EncodeAccept(cd.Key(s.cfg.Secret), req.PrivateData(), proto.AcceptData{
		Credits: s.cfg.Credits, MaxBatch: s.cfg.MaxBatch, MaxMsg: s.cfg.MaxMsg,
		MaxLength: s.store.MaxLength(), LeaseTTL: s.cfg.LeaseTTL, Slab: s.cfg.SlabPerConn,
	})
	if err := req.Accept(c.qp, accept); err != nil {
		log.Warn("chunkd: accept", "err", err)
		s.mu.Lock()
		delete(s.conns, c)
		s.metrics.Connections.Set(float64(len(s.conns)))
		s.mu.Unlock()
		c.destroy()
		return
	}
	log.Debug("chunkd: connected")
	c.run()
	s.mu.Lock()
	delete(s.conns, c)
	s.metrics.Connections.Set(float64(len(s.conns)))
	s.mu.Unlock()
	log.Debug("chunkd: disconnected")
}

// checkNonce records a connect nonce and reports whether it is fresh.
func (s *Server) checkNonce(n [8]byte) bool {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.nonces) > 4096 {
		for k, exp := range s.nonces {
			if now.After(exp) {
				delete(s.nonces, k)
			}
		}
	}
	if exp, ok := s.nonces[n]; ok && now.Before(exp) {
		return false
	}
	s.nonces[n] = now.Add(2 * s.cfg.MaxClockSkew)
	return true
}

// Stats returns the chunkserver's current state, as heartbeats report it. Its
// Capacity and Free are what the store offers new shards (store.Space.Offered):
// the file system's size (or the configured capacity, if smaller) and its free
// space plus the kept slots of deleted versions, both less the reserve.
func (s *Server) Stats() Stats {
	sp := s.store.Space()
	capacity, free := sp.Offered()
	st := Stats{ID: s.ID(), Capacity: capacity, Free: free, Used: sp.Used, Versions: sp.Versions,
		ResidentBytes: s.cache.residentBytes(), MemInUse: int64(s.pool.InUse())}
	s.mu.Lock()
	st.Connections = len(s.conns)
	for c := range s.conns {
		c.mu.Lock()
		st.Leases += len(c.leases)
		c.mu.Unlock()
	}
	s.mu.Unlock()
	return st
}

func (s *Server) updateStoreGauges() {
	used, n := s.store.Usage()
	s.metrics.StoredBytes.Set(float64(used))
	s.metrics.StoredVersion.Set(float64(n))
}

// deleteVersion deletes a stored version and forgets its resident copy; leases on
// it keep reading the resident copy until they end.
func (s *Server) deleteVersion(key chunk.Key) error {
	err := s.store.Delete(key)
	s.cache.drop(key)
	s.mu.Lock()
	delete(s.corrupt, key)
	s.mu.Unlock()
	s.updateStoreGauges()
	return err
}

func (s *Server) membershipLoop(ctx context.Context) {
	defer s.wg.Done()
	m := s.cfg.Membership
	addr := s.cfg.AdvertiseAddr
	if addr == "" {
		addr = s.Addr()
	}
	interval := s.cfg.HeartbeatInterval
	registered := false
	var deleted []chunk.Key // garbage deleted, not yet reported
	lastOps, lastBeat := s.requests.Load(), time.Now()
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !registered {
			capacity, free := s.store.Space().Offered()
			info := Info{ID: s.ID(), Addr: addr, Transport: s.cfg.Device.Name(), Zone: s.cfg.Zone,
				Capacity: capacity, Used: capacity - free, MaxLength: s.store.MaxLength()}
			if err := m.Register(ctx, info); err != nil {
				s.log.Warn("chunkd: register with metadata service", "err", err)
			} else {
				registered = true
				s.log.Info("chunkd: registered", "id", info.ID, "addr", info.Addr, "zone", info.Zone, "heartbeat", interval)
			}
		} else {
			st := s.Stats()
			now, ops := time.Now(), s.requests.Load()
			st.Load = float64(ops-lastOps) / now.Sub(lastBeat).Seconds()
			lastOps, lastBeat = ops, now
			st.Deleted = deleted
			st.Scrub = s.scrub.report()
			reply, err := m.Heartbeat(ctx, st)
			switch {
			case errors.Is(err, ErrNotRegistered):
				registered = false
				t.Reset(0)
				continue
			case err != nil:
				s.log.Warn("chunkd: heartbeat", "err", err)
			default:
				s.scrub.schedule(reply.ScrubInterval, reply.ScrubRequested)
				deleted = nil
				for _, k := range reply.Garbage {
					err := s.deleteVersion(k)
					if err == nil || errors.Is(err, store.ErrNotFound) {
						deleted = append(deleted, k)
					} else {
						s.log.Warn("chunkd: delete garbage", "chunk", k, "err", err)
					}
				}
			}
		}
		t.Reset(interval)
	}
}
