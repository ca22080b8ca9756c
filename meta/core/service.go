// Package core is the metadata service proper: the namespace with Linux
// semantics, layouts, the stripe table with write grants and compare-and-set
// commits, client sessions and open-unlinked files, chunkserver membership,
// placement and garbage collection. Service implements metapb.MetaServer on
// top of a kv.Store; every namespace operation is one KV transaction.
package core

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/rdmafs/rdmafs/internal/stripe"
	"github.com/rdmafs/rdmafs/meta/keys"
	"github.com/rdmafs/rdmafs/meta/kv"
	"github.com/rdmafs/rdmafs/meta/metaerr"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// RootIno is the inode number of the root directory.
const RootIno = 1

// FirstCookie is the readdir cookie of the first entry created in a
// directory; cookies 1 and 2 are left to the client for "." and "..".
const FirstCookie = 3

// Limits of the namespace.
const (
	NameMax       = 255
	SymlinkMax    = 4095
	LinkMax       = 65000
	XattrNameMax  = 255
	XattrValueMax = 65536
)

// StandardLayout returns the layout format uses when given none: 4+2 with
// 1 MiB units, files up to 64 KiB inline.
func StandardLayout() stripe.Layout {
	return stripe.Layout{K: 4, M: 2, Unit: 1 << 20, Inline: stripe.DefaultInline}
}

// Config configures a Service.
type Config struct {
	// Store holds the state; the Service does not close it.
	Store kv.Store
	// Logger receives structured logs (default: slog.Default()).
	Logger *slog.Logger
	// Now returns the current time (default: time.Now).
	Now func() time.Time
	// HeartbeatTimeout marks a chunkserver down when it has not sent a
	// heartbeat for this long (default 10s).
	HeartbeatTimeout time.Duration
	// SessionTTL is the default client session lifetime without keepalive
	// (default 30s).
	SessionTTL time.Duration
	// GrantTTL is how long an uncommitted write grant is kept before its
	// chunks are collected (default 10m).
	GrantTTL time.Duration
	// RepairGrace is how long a chunkserver may be down before the shards it
	// holds are rebuilt elsewhere (default 10m).
	RepairGrace time.Duration
	// ScrubInterval is how long a chunkserver spreads one pass of reading
	// back and checking every chunk it stores over (default a week; see
	// scrub.go).
	ScrubInterval time.Duration
	// RepairInterval is the time between scans of the stripe table for
	// repair work (default a quarter of RepairGrace, between 200ms and 30s).
	RepairInterval time.Duration
	// RepairTaskTimeout fails a repair task its chunkserver has not reported
	// within this time (default 2m).
	RepairTaskTimeout time.Duration
	// RepairBackoff is how long a stripe whose repair failed waits before it
	// is tried again (default 5s).
	RepairBackoff time.Duration
	// OnRetry, when set, is called whenever a transaction is run again after
	// a conflict (for metrics).
	OnRetry func()
	// RequestTTL is how long the outcome of a mutating request with a
	// request id is kept for retries (default 5m; clients retry for at most
	// client.DefaultFailoverTimeout, 2m, by default).
	RequestTTL time.Duration
	// DurableReplies makes every operation wait until its transaction is
	// durable before the reply. Without it, on a store that can answer a
	// transaction once it is logged (bbolt), the operations of clients are
	// answered then: they survive a crash of the metadata server's process
	// at once and one of its machine after the next fdatasync, which the
	// Sync call (a client's fsync) waits for, as on a local file system.
	DurableReplies bool
	// Takeover says that the store was being served by another metadata
	// server until now (etcd, after winning the election): the registered
	// chunkservers count as up until they miss one heartbeat timeout,
	// because their recent heartbeats went to the previous server. Without
	// it liveness is learnt afresh from heartbeats.
	Takeover bool
	// ReserveTTL is how long a Lookup with reserve holds a missing name for
	// the caller's session (default 100ms; see reserve.go).
	ReserveTTL time.Duration
	// ReserveGrace is how long, after a start with live sessions, calls that
	// could conflict with a create answered before the restart wait for its
	// replay (default 2s).
	ReserveGrace time.Duration
	// LeaseRecallTimeout is how long a call waits for the holder of a
	// directory lease to give it back before meta takes it back (default
	// 5s; longer than LeaseSilence, so that a holder cut off while a
	// Recalls call of its seemed in flight has stopped using the lease
	// too); LeaseSilence how long a holder may go without calling Recalls
	// before its leases are void (default 3s: a mount stops using them,
	// and the kernel's entries under them expire, two thirds of it after
	// the last answer, RecallsReply.silence_ms); LeasePollWait how long a
	// Recalls call waits for a recall (default 500ms); LeaseBackoff how
	// long after a recall the directory is not leased again (default 1s).
	// See lease.go.
	LeaseRecallTimeout, LeaseSilence, LeasePollWait, LeaseBackoff time.Duration
}

// Service implements metapb.MetaServer.
type Service struct {
	metapb.UnimplementedMetaServer

	store   kv.Store
	logged  loggedStore // nil: every reply waits for durability
	log     *slog.Logger
	now     func() time.Time
	cfg     Config
	cluster *metapb.ClusterRecord
	def     stripe.Layout

	inodes  atomic.Int64 // number of inodes, for statfs
	trashNs atomic.Int64 // how long deleted files are kept (trash.go)
	quotas  quotaSet     // the quotas that exist (quota.go)

	members members
	scrub   scrubState // under members.mu

	repMu   sync.Mutex // after members.mu
	rep     repairState
	repKick chan struct{}
	relKick chan struct{} // plan conversions (relayout.go) without a repair scan

	sessMu   sync.Mutex
	sessions map[uint64]time.Time // session -> last keepalive
	sessTTL  map[uint64]time.Duration

	lockMu sync.Mutex
	locks  lockState

	tokens tokenStates // mount tokens seen (restrict.go)

	reserved reservations // names held for creates answered early (reserve.go)
}

// loggedStore is a store that can answer a transaction once it is logged,
// before it is durable, and wait for durability later (the bbolt backend).
type loggedStore interface {
	UpdateLogged(ctx context.Context, fn func(kv.Txn) error) error
	Sync(ctx context.Context) error
}

// inoGapAtStart is how far the inode counter is moved on at a start after a
// server that answered before durability did not stop cleanly: a create
// acknowledged but lost in a crash of the machine must not see its number
// given to another file, which its client may still use.
const inoGapAtStart = 1 << 20

// counterServing marks a store served with replies before durability; Close
// removes it.
const counterServing = "serving"

// ErrNotFormatted is returned by New for a store that was never formatted.
var ErrNotFormatted = errors.New("core: the metadata store is not formatted (run rdmafs format)")

// ErrFormatted is returned by Format for a store that is already formatted.
var ErrFormatted = errors.New("core: the metadata store is already formatted")

// Format initializes an empty store: the cluster record with the default
// layout and the root directory. It returns the new cluster id.
func Format(ctx context.Context, store kv.Store, layout stripe.Layout, now time.Time) (string, error) {
	if err := layout.Validate(); err != nil {
		return "", err
	}
	var idb [16]byte
	if _, err := rand.Read(idb[:]); err != nil {
		return "", fmt.Errorf("core: cluster id: %w", err)
	}
	id := hex.EncodeToString(idb[:])
	err := store.Update(ctx, func(t kv.Txn) error {
		if _, ok, err := t.Get(keys.Cluster()); err != nil {
			return err
		} else if ok {
			return ErrFormatted
		}
		cl := &metapb.ClusterRecord{ClusterId: id, DefaultLayout: metapb.LayoutOf(layout), CreatedNs: now.UnixNano()}
		if err := putMsg(t, keys.Cluster(), cl); err != nil {
			return err
		}
		ns := now.UnixNano()
		root := &metapb.InodeRecord{
			Attr: &metapb.Attr{Ino: RootIno, Mode: syscall.S_IFDIR | 0o755, Nlink: 2,
				AtimeNs: ns, MtimeNs: ns, CtimeNs: ns, Generation: 1},
			Parent: RootIno, NextCookie: FirstCookie,
		}
		if err := putMsg(t, keys.Inode(RootIno), root); err != nil {
			return err
		}
		return t.Put(keys.Counter(counterIno), keys.EncodeUint64(RootIno+1))
	})
	if err != nil {
		return "", fmt.Errorf("core: format: %w", err)
	}
	return id, nil
}

// New opens the service on a formatted store.
func New(ctx context.Context, cfg Config) (*Service, error) {
	if cfg.Store == nil {
		return nil, errors.New("core: no store")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.HeartbeatTimeout <= 0 {
		cfg.HeartbeatTimeout = 10 * time.Second
	}
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = 30 * time.Second
	}
	if cfg.GrantTTL <= 0 {
		cfg.GrantTTL = 10 * time.Minute
	}
	if cfg.ScrubInterval <= 0 {
		cfg.ScrubInterval = 7 * 24 * time.Hour
	}
	if cfg.RepairGrace <= 0 {
		cfg.RepairGrace = 10 * time.Minute
	}
	if cfg.RepairInterval <= 0 {
		cfg.RepairInterval = min(max(cfg.RepairGrace/4, 200*time.Millisecond), 30*time.Second)
	}
	if cfg.RepairTaskTimeout <= 0 {
		cfg.RepairTaskTimeout = 2 * time.Minute
	}
	if cfg.RepairBackoff <= 0 {
		cfg.RepairBackoff = 5 * time.Second
	}
	if cfg.RequestTTL <= 0 {
		cfg.RequestTTL = 5 * time.Minute
	}
	if cfg.ReserveTTL <= 0 {
		cfg.ReserveTTL = 100 * time.Millisecond
	}
	if cfg.ReserveGrace <= 0 {
		cfg.ReserveGrace = 2 * time.Second
	}
	if cfg.LeaseRecallTimeout <= 0 {
		cfg.LeaseRecallTimeout = 5 * time.Second
	}
	if cfg.LeaseSilence <= 0 {
		cfg.LeaseSilence = 3 * time.Second
	}
	if cfg.LeasePollWait <= 0 {
		cfg.LeasePollWait = 500 * time.Millisecond
	}
	if cfg.LeaseBackoff <= 0 {
		cfg.LeaseBackoff = time.Second
	}
	s := &Service{store: cfg.Store, log: cfg.Logger, now: cfg.Now, cfg: cfg,
		sessions: map[uint64]time.Time{}, sessTTL: map[uint64]time.Duration{}, repKick: make(chan struct{}, 1), relKick: make(chan struct{}, 1),
		locks: lockState{wake: map[uint64]chan struct{}{}, waitsFor: map[metapb.LockOwner][]metapb.LockOwner{}}}
	s.members.init()
	s.rep.init()
	start := s.now()
	var inodes int64
	err := s.store.View(ctx, func(r kv.Reader) error {
		cl := &metapb.ClusterRecord{}
		if ok, err := getMsg(r, keys.Cluster(), cl); err != nil {
			return err
		} else if !ok {
			return ErrNotFormatted
		}
		s.cluster = cl
		s.def = cl.DefaultLayout.Stripe()
		s.loadTrashTime(cl)
		if err := s.loadQuotas(r); err != nil {
			return err
		}
		if err := r.Scan([]byte{keys.PrefixChunkserver}, []byte{keys.PrefixChunkserver + 1}, 0, func(k, v []byte) error {
			rec := &metapb.ChunkserverRecord{}
			if err := proto.Unmarshal(v, rec); err != nil {
				return fmt.Errorf("chunkserver record %q: %w", k, err)
			}
			s.members.load(rec, cfg.Takeover, start)
			return nil
		}); err != nil {
			return err
		}
		if err := r.Scan([]byte{keys.PrefixSession}, []byte{keys.PrefixSession + 1}, 0, func(k, v []byte) error {
			id, err := keys.ParseSession(k)
			if err != nil {
				return err
			}
			rec := &metapb.SessionRecord{}
			if err := proto.Unmarshal(v, rec); err != nil {
				return fmt.Errorf("session record %d: %w", id, err)
			}
			// Sessions survive a restart: their clients get a full TTL to
			// reconnect and renew them.
			s.sessions[id] = start
			s.sessTTL[id] = time.Duration(rec.TtlMs) * time.Millisecond
			return nil
		}); err != nil {
			return err
		}
		return r.Scan(keys.InodePrefix(), []byte{keys.PrefixInode + 1}, 0, func(k, v []byte) error {
			inodes++
			return nil
		})
	})
	if errors.Is(err, ErrNotFormatted) {
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("core: load state: %w", err)
	}
	s.inodes.Store(inodes)
	var grace time.Time
	if len(s.sessions) > 0 {
		grace = start.Add(cfg.ReserveGrace)
	}
	s.reserved.init(grace)
	if ls, ok := cfg.Store.(loggedStore); ok && !cfg.DurableReplies {
		unclean := false
		if err := s.update(ctx, func(t kv.Txn) error {
			_, found, err := t.Get(keys.Counter(counterServing))
			if err != nil {
				return err
			}
			if unclean = found; found {
				if _, err := nextID(t, counterIno, inoGapAtStart); err != nil {
					return err
				}
			}
			return t.Put(keys.Counter(counterServing), keys.EncodeUint64(1))
		}); err != nil {
			return nil, fmt.Errorf("core: mark the store served: %w", err)
		}
		if unclean {
			s.log.Warn("the last server of this store did not stop cleanly: new inode numbers continue past a gap", "gap", inoGapAtStart)
		}
		s.logged = ls
	}
	return s, nil
}

// Close ends the service's use of the store: it waits until every answered
// operation is durable and clears the mark that makes the next start skip
// inode numbers. Nothing may call the service afterwards.
func (s *Service) Close(ctx context.Context) error {
	if s.logged == nil {
		return nil
	}
	return s.update(ctx, func(t kv.Txn) error { return t.Delete(keys.Counter(counterServing)) })
}

// ClusterID returns the id generated at format time.
func (s *Service) ClusterID() string { return s.cluster.ClusterId }

// DefaultLayout returns the format-time layout.
func (s *Service) DefaultLayout() stripe.Layout { return s.def }

// Run performs the background work until ctx ends: expiring sessions and
// write grants, and tracking chunkservers that stop sending heartbeats.
func (s *Service) Run(ctx context.Context) error {
	tick := min(s.cfg.HeartbeatTimeout, s.cfg.SessionTTL) / 4
	tick = max(tick, 10*time.Millisecond)
	t := time.NewTicker(tick)
	defer t.Stop()
	lastGrantScan := time.Time{}
	lastRepair := time.Time{}
	lastRequestScan := time.Now()
	var lastTrashScan time.Time
	for {
		kicked := false
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-s.repKick:
			kicked = true
		case <-s.relKick:
			if err := s.planRelayouts(ctx); err != nil && ctx.Err() == nil {
				s.log.Error("relayout: plan", "err", err)
			}
			continue
		}
		if kicked || time.Since(lastRepair) >= s.cfg.RepairInterval {
			s.members.sweep(s.now(), s.cfg.HeartbeatTimeout, s.log)
			lastRepair = time.Now()
			s.runRepair(ctx)
			if kicked {
				continue
			}
		}
		if s.members.sweep(s.now(), s.cfg.HeartbeatTimeout, s.log) > 0 {
			s.kickRepair() // stripe health (status, dashboard) reflects it at once
		}
		if err := s.expireSessions(ctx); err != nil && ctx.Err() == nil {
			s.log.Error("expire sessions", "err", err)
		}
		if time.Since(lastGrantScan) > min(s.cfg.GrantTTL/4, time.Minute) {
			lastGrantScan = time.Now()
			if err := s.expireGrants(ctx); err != nil && ctx.Err() == nil {
				s.log.Error("expire grants", "err", err)
			}
		}
		if time.Since(lastTrashScan) > trashSweepEvery {
			lastTrashScan = time.Now()
			if err := s.expireTrash(ctx); err != nil && ctx.Err() == nil {
				s.log.Error("purge expired trash", "err", err)
			}
		}
		if time.Since(lastRequestScan) > s.requestSweepEvery() {
			lastRequestScan = time.Now()
			if err := s.expireRequests(ctx); err != nil && ctx.Err() == nil {
				s.log.Error("expire request records", "err", err)
			}
		}
	}
}

// update runs fn in a read-write transaction, converting storage failures
// into EIO errors and counting retries.
func (s *Service) update(ctx context.Context, fn func(t kv.Txn) error) error {
	if err := waitChain(ctx); err != nil {
		return err
	}
	return wrapErr(s.store.Update(ctx, s.countRetries(fn)))
}

// updateLogged is update answered once the transaction is logged, before
// it is durable, when the store can (see Config.DurableReplies). Under
// Chained it runs in the chain and does not wait.
func (s *Service) updateLogged(ctx context.Context, fn func(t kv.Txn) error) error {
	if s.logged == nil {
		return s.update(ctx, fn)
	}
	if st, ok := ctx.Value(chainKey{}).(*chainState); ok {
		return wrapErr(st.c.Update(ctx, s.countRetries(fn)))
	}
	return wrapErr(s.logged.UpdateLogged(ctx, s.countRetries(fn)))
}

// chainStore is a store that runs transactions in chains (the bbolt
// backend).
type chainStore interface {
	NewChain() kv.Chain
}

// chainKey is the context key of the chain Chained starts.
type chainKey struct{}

// chainState is a chain and what is to run once its transactions are
// logged.
type chainState struct {
	c     kv.Chain
	after []func()
}

// wait waits until the chain's transactions are logged (or known not
// applied), then runs what waited for that. The wait ignores ctx's
// cancellation: what it releases must not be released before the
// transactions are readable, and the writer logs them regardless.
func (st *chainState) wait(ctx context.Context) error {
	err := st.c.Wait(context.WithoutCancel(ctx))
	after := st.after
	st.after = nil
	for _, fn := range after {
		fn()
	}
	return wrapErr(err)
}

// afterLogged runs fn once the transactions ctx's operation ran are
// readable by every reader: at once, or, under Chained, when the chain is
// logged. What an operation holds in memory (a name, acquireName) is
// released with it: another client must not act on it before it can read
// the change.
func afterLogged(ctx context.Context, fn func()) {
	if st, ok := ctx.Value(chainKey{}).(*chainState); ok {
		st.after = append(st.after, fn)
		return
	}
	fn()
}

// Chained returns a context under which the operations called with it (the
// calls of one client batch, one after another) do not wait for their
// transactions to be logged: they share a group commit instead of one each.
// An operation that reads, or waits for durability, first waits for those
// before it. The caller must call wait before it answers; wait returns an
// error (Unavailable: retry) if a transaction of the chain could not be
// applied, and then none after it was. Without a store that logs before it
// syncs, ctx is returned as it is.
func (s *Service) Chained(ctx context.Context) (chained context.Context, wait func(context.Context) error) {
	cs, ok := s.logged.(chainStore)
	if !ok {
		return ctx, func(context.Context) error { return nil }
	}
	st := &chainState{c: cs.NewChain()}
	return context.WithValue(ctx, chainKey{}, st), st.wait
}

// waitChain waits until the transactions of ctx's chain, if any, are
// logged: a read must see them, and a wait for durability cover them.
func waitChain(ctx context.Context) error {
	if st, ok := ctx.Value(chainKey{}).(*chainState); ok {
		return st.wait(ctx)
	}
	return nil
}

// countRetries wraps a transaction function so that every run after the
// first (a conflict) calls Config.OnRetry.
func (s *Service) countRetries(fn func(t kv.Txn) error) func(t kv.Txn) error {
	attempts := 0
	return func(t kv.Txn) error {
		attempts++
		if attempts > 1 && s.cfg.OnRetry != nil {
			s.cfg.OnRetry()
		}
		return fn(t)
	}
}

// sync waits until every transaction answered before the call is durable.
func (s *Service) sync(ctx context.Context) error {
	if s.logged == nil {
		return nil
	}
	if err := waitChain(ctx); err != nil {
		return err
	}
	return wrapErr(s.logged.Sync(ctx))
}

// Sync implements metapb.MetaServer: it returns once every operation
// answered before it is durable (a client's fsync and fsyncdir).
func (s *Service) Sync(ctx context.Context, _ *metapb.SyncRequest) (*metapb.Empty, error) {
	if err := s.sync(ctx); err != nil {
		return nil, err
	}
	return &metapb.Empty{}, nil
}

// view runs fn in a read-only transaction.
func (s *Service) view(ctx context.Context, fn func(r kv.Reader) error) error {
	if err := waitChain(ctx); err != nil {
		return err
	}
	return wrapErr(s.store.View(ctx, fn))
}

func wrapErr(err error) error {
	if err == nil {
		return nil
	}
	var me *metaerr.Error
	if errors.As(err, &me) {
		return me
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	if errors.Is(err, kv.ErrNotLeader) || errors.Is(err, kv.ErrNotApplied) {
		// Nothing was applied: the client retries (on the new leader).
		return grpcstatus.Error(codes.Unavailable, err.Error())
	}
	return metaerr.New(syscall.EIO, "metadata store: %v", err)
}

func getMsg(r kv.Reader, key []byte, m proto.Message) (bool, error) {
	v, ok, err := r.Get(key)
	if err != nil || !ok {
		return ok, err
	}
	if err := proto.Unmarshal(v, m); err != nil {
		return false, fmt.Errorf("decode %x: %w", key, err)
	}
	return true, nil
}

func putMsg(t kv.Txn, key []byte, m proto.Message) error {
	v, err := proto.Marshal(m)
	if err != nil {
		return fmt.Errorf("encode %x: %w", key, err)
	}
	return t.Put(key, v)
}

const (
	counterIno     = "ino"
	counterChunk   = "chunk"
	counterSession = "session"
)

// nextID allocates n consecutive ids from a counter and returns the first.
// Counters start at 1 and never go back, so ids are never reused.
func nextID(t kv.Txn, name string, n uint64) (uint64, error) {
	v, ok, err := t.Get(keys.Counter(name))
	if err != nil {
		return 0, err
	}
	id := uint64(1)
	if ok {
		if id, err = keys.DecodeUint64(v); err != nil {
			return 0, fmt.Errorf("counter %s: %w", name, err)
		}
	}
	return id, t.Put(keys.Counter(name), keys.EncodeUint64(id+n))
}

// getInode loads an inode or fails with ENOENT.
func getInode(r kv.Reader, ino uint64) (*metapb.InodeRecord, error) {
	rec := &metapb.InodeRecord{}
	ok, err := getMsg(r, keys.Inode(ino), rec)
	if err != nil {
		return nil, err
	}
	if !ok || rec.Attr == nil {
		return nil, metaerr.New(syscall.ENOENT, "inode %d does not exist", ino)
	}
	return rec, nil
}

func putInode(t kv.Txn, rec *metapb.InodeRecord) error {
	return putMsg(t, keys.Inode(rec.Attr.Ino), rec)
}

// getDir loads an inode that must be a directory.
func getDir(r kv.Reader, ino uint64) (*metapb.InodeRecord, error) {
	rec, err := getInode(r, ino)
	if err != nil {
		return nil, err
	}
	if !isDir(rec.Attr) {
		return nil, metaerr.New(syscall.ENOTDIR, "inode %d is not a directory", ino)
	}
	return rec, nil
}

func getDentry(r kv.Reader, parent uint64, name string) (*metapb.DentryRecord, bool, error) {
	d := &metapb.DentryRecord{}
	ok, err := getMsg(r, keys.Dentry(parent, name), d)
	return d, ok, err
}

func fileType(mode uint32) uint32 { return mode & syscall.S_IFMT }
func isDir(a *metapb.Attr) bool   { return fileType(a.Mode) == syscall.S_IFDIR }
func isReg(a *metapb.Attr) bool   { return fileType(a.Mode) == syscall.S_IFREG }

// checkName validates a single path component.
func checkName(name string) error {
	switch {
	case name == "" || name == "." || name == "..":
		return metaerr.New(syscall.EINVAL, "invalid name %q", name)
	case len(name) > NameMax:
		return metaerr.New(syscall.ENAMETOOLONG, "name of %d bytes exceeds %d", len(name), NameMax)
	}
	for i := 0; i < len(name); i++ {
		if name[i] == '/' || name[i] == 0 {
			return metaerr.New(syscall.EINVAL, "name %q contains '/' or NUL", name)
		}
	}
	return nil
}
