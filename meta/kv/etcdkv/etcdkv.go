// Package etcdkv is the kv.Store backend on etcd, for several metadata
// servers sharing one file system. A transaction reads one etcd snapshot
// (the revision of its first read), buffers its writes, and commits with one
// etcd transaction whose compares check that nothing it read - each key, and
// each scanned range - changed since that revision; a failed compare is
// kv.ErrConflict and Update runs the transaction again.
//
// With Options.Batch, concurrent Update calls are run one after another by
// a committer and committed together as one etcd transaction (group commit,
// as the bbolt backend does): transactions of one process never conflict
// with each other, which matters for hot keys such as a directory that many
// clients create files in.
package etcdkv

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/url"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/rdmafs/rdmafs/meta/auth"
	"github.com/rdmafs/rdmafs/meta/kv"
)

// DefaultPrefix is the key prefix used when a URL names none.
const DefaultPrefix = "rdmafs"

// ErrFenced reports that a commit was refused because the fence key (the
// leader key of this process) no longer exists with the expected revision:
// another metadata server has taken over.
var ErrFenced = fmt.Errorf("etcdkv: fence key lost: %w", kv.ErrNotLeader)

// Options configures a Store.
type Options struct {
	// Endpoints are the etcd client endpoints (host:port).
	Endpoints []string
	// Prefix is the namespace of this file system in etcd; metadata keys are
	// stored under Prefix+"/d/" (see DataPrefix).
	Prefix string
	// DialTimeout bounds connecting to etcd at Open (default 5s).
	DialTimeout time.Duration
	// PageSize is the number of keys fetched per request by scans (default 512).
	PageSize int
	// Batch enables group commit (see the package comment).
	Batch bool
	// MaxBatch bounds the transactions committed together (default 256).
	MaxBatch int
	// CacheEntries, when positive, keeps up to this many values in memory
	// (see cache.go). Only for a store that is the only writer of its
	// prefix, as the elected meta server is; with other writers, reads in
	// View may be stale.
	CacheEntries int
	// Linger bounds how long the committer waits for the transactions of
	// clients that are between two calls (default 1ms; negative: off).
	Linger time.Duration
	// Logger receives warnings (default slog.Default()).
	Logger *slog.Logger
	// OnCommit, when set, is called after every successful group commit
	// (Batch) with the number of transactions it committed and how long
	// the etcd transaction took.
	OnCommit func(txns int, d time.Duration)
	// TLS, when set, makes the client speak TLS to etcd (Config.TLSConfig).
	TLS *tls.Config
}

// Config is what an etcd:// URL names.
type Config struct {
	Endpoints []string
	Prefix    string
	// TLS names the PEM files of the URL's cacert, cert and key parameters
	// (as etcdctl's flags): with cacert the client speaks TLS to etcd and
	// verifies it, with cert and key it presents a client certificate.
	TLS auth.TLSFiles
}

// TLSConfig returns the client TLS configuration of c.TLS, or nil when the
// URL asked for none.
func (c Config) TLSConfig() (*tls.Config, error) {
	cfg, err := c.TLS.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("etcdkv: %w", err)
	}
	return cfg, nil
}

// ParseURL parses etcd://host:port[,host:port...][/prefix][?cacert=FILE[&cert=FILE&key=FILE]].
func ParseURL(s string) (Config, error) {
	rest, ok := strings.CutPrefix(s, "etcd://")
	if !ok {
		return Config{}, fmt.Errorf("etcdkv: %q is not an etcd:// URL (want etcd://host:port[,host:port]/prefix)", s)
	}
	rest, query, _ := strings.Cut(rest, "?")
	var files auth.TLSFiles
	if query != "" {
		q, err := url.ParseQuery(query)
		if err != nil {
			return Config{}, fmt.Errorf("etcdkv: parameters of %q: %w", s, err)
		}
		for k, v := range q {
			if len(v) != 1 {
				return Config{}, fmt.Errorf("etcdkv: parameter %s given %d times in %q", k, len(v), s)
			}
			switch k {
			case "cacert":
				files.CA = v[0]
			case "cert":
				files.Cert = v[0]
			case "key":
				files.Key = v[0]
			default:
				return Config{}, fmt.Errorf("etcdkv: unknown parameter %q in %q (known: cacert, cert, key)", k, s)
			}
		}
		if files.CA == "" {
			return Config{}, fmt.Errorf("etcdkv: %q: TLS to etcd needs cacert=FILE (the CA that signed etcd's certificate)", s)
		}
	}
	hosts, prefix, _ := strings.Cut(rest, "/")
	prefix = strings.Trim(prefix, "/")
	if prefix == "" {
		prefix = DefaultPrefix
	}
	for _, r := range prefix {
		if r <= ' ' || r >= 0x7f {
			return Config{}, fmt.Errorf("etcdkv: prefix %q in %q must be printable ASCII without spaces", prefix, s)
		}
	}
	cfg := Config{Prefix: prefix, TLS: files}
	for _, h := range strings.Split(hosts, ",") {
		if h == "" {
			continue
		}
		host, port, err := net.SplitHostPort(h)
		if err != nil || host == "" || port == "" {
			return Config{}, fmt.Errorf("etcdkv: endpoint %q in %q must be host:port", h, s)
		}
		cfg.Endpoints = append(cfg.Endpoints, h)
	}
	if len(cfg.Endpoints) == 0 {
		return Config{}, fmt.Errorf("etcdkv: %q names no etcd endpoint", s)
	}
	if _, err := url.Parse("http://" + cfg.Endpoints[0]); err != nil {
		return Config{}, fmt.Errorf("etcdkv: %q: %w", s, err)
	}
	return cfg, nil
}

// DataPrefix returns the etcd key prefix under which the metadata keys of
// the file system with the given prefix live.
func DataPrefix(prefix string) string { return prefix + "/d/" }

// LeaderPrefix returns the etcd key prefix of the metadata server election.
func LeaderPrefix(prefix string) string { return prefix + "/leader/" }

// Store is a kv.Store on etcd.
type Store struct {
	cli    *clientv3.Client
	opts   Options
	prefix string // data prefix
	end    string // end of the data prefix range

	fenceMu  sync.RWMutex
	fenceKey string
	fenceRev int64

	// lastRev is the highest revision this store has committed or read:
	// a snapshot at least this new contains every write acknowledged by
	// this store, so reads may be served by any member (serializable)
	// when it is that far.
	lastRev atomic.Int64
	cache   *cache // nil without Options.CacheEntries

	inflight atomic.Int64 // Update calls not yet returned (batch mode)
	peak     atomic.Int64 // highest inflight since the committer last reset it

	mu       sync.RWMutex // guards closed against sends on reqs
	closed   bool
	reqs     chan *request
	finished chan struct{}
}

type request struct {
	ctx  context.Context
	fn   func(kv.Txn) error
	done chan error
}

// Open connects to etcd and checks that it answers.
func Open(ctx context.Context, opts Options) (*Store, error) {
	if len(opts.Endpoints) == 0 {
		return nil, errors.New("etcdkv: no endpoints")
	}
	if opts.Prefix == "" {
		opts.Prefix = DefaultPrefix
	}
	if opts.DialTimeout <= 0 {
		opts.DialTimeout = 5 * time.Second
	}
	if opts.PageSize <= 0 {
		opts.PageSize = 512
	}
	if opts.MaxBatch <= 0 {
		opts.MaxBatch = 256
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Linger == 0 {
		opts.Linger = time.Millisecond
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:          opts.Endpoints,
		DialTimeout:        opts.DialTimeout,
		TLS:                opts.TLS,
		Logger:             zap.NewNop(),
		MaxCallSendMsgSize: 64 << 20,
		MaxCallRecvMsgSize: 64 << 20,
	})
	if err != nil {
		return nil, fmt.Errorf("etcdkv: connect to %v: %w", opts.Endpoints, err)
	}
	cctx, cancel := context.WithTimeout(ctx, opts.DialTimeout)
	defer cancel()
	if _, err := cli.Get(cctx, "rdmafs-ping", clientv3.WithCountOnly()); err != nil {
		cli.Close()
		return nil, fmt.Errorf("etcdkv: etcd at %v does not answer: %w", opts.Endpoints, err)
	}
	if err := checkTxnOps(cctx, cli); err != nil {
		cli.Close()
		return nil, fmt.Errorf("etcdkv: etcd at %v: %w", opts.Endpoints, err)
	}
	p := DataPrefix(opts.Prefix)
	s := &Store{cli: cli, opts: opts, prefix: p, end: string(kv.PrefixEnd([]byte(p))), finished: make(chan struct{}), cache: newCache(opts.CacheEntries)}
	if opts.Batch {
		s.reqs = make(chan *request, opts.MaxBatch)
		go s.committer()
	} else {
		close(s.finished)
	}
	return s, nil
}

// MinTxnOps is the smallest --max-txn-ops of the etcd server that Open
// accepts. A metadata transaction commits one compare per key read and one
// operation per key written, and group commit puts many of them into one
// etcd transaction; etcd's default of 128 is far too small.
const MinTxnOps = 4096

// checkTxnOps fails clearly when etcd limits transactions to fewer than
// MinTxnOps operations, instead of failing later on the first large commit.
func checkTxnOps(ctx context.Context, cli *clientv3.Client) error {
	cmps := make([]clientv3.Cmp, MinTxnOps)
	for i := range cmps {
		cmps[i] = clientv3.Compare(clientv3.CreateRevision("rdmafs-probe"), "=", 0)
	}
	if _, err := cli.Txn(ctx).If(cmps...).Commit(); err != nil {
		if errors.Is(err, rpctypes.ErrTooManyOps) {
			return fmt.Errorf("the server allows too few operations per transaction: start etcd with --max-txn-ops %d or more (65536 recommended, see docs/meta-etcd.md)", MinTxnOps)
		}
		return fmt.Errorf("probe transaction: %w", err)
	}
	return nil
}

// Client returns the etcd client (for elections and leases); it is closed
// by Close.
func (s *Store) Client() *clientv3.Client { return s.cli }

// SetFence makes every later commit conditional on key existing with the
// given create revision (the leader key of an etcd election), so that a
// server that lost its leadership cannot write. An empty key removes it.
func (s *Store) SetFence(key string, createRev int64) {
	s.fenceMu.Lock()
	s.fenceKey, s.fenceRev = key, createRev
	s.fenceMu.Unlock()
	// Whoever wrote while this store was not the writer is not in the
	// cache.
	if s.cache != nil {
		s.cache.reset()
	}
}

func (s *Store) fence() (string, int64) {
	s.fenceMu.RLock()
	defer s.fenceMu.RUnlock()
	return s.fenceKey, s.fenceRev
}

// View implements kv.Store.
func (s *Store) View(ctx context.Context, fn func(kv.Reader) error) error {
	for attempt := 0; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		if s.isClosed() {
			return kv.ErrClosed
		}
		o := &occ{s: s, readOnly: true}
		if s.cache != nil && attempt == 0 {
			// Read at the revision of this store's last commit, from the
			// cache while no later commit happens (see cache).
			o.rev = s.cache.generation()
			o.gen = o.rev
		}
		t := &txn{o: o, ctx: ctx}
		err := fn(t)
		if !errors.Is(err, errSnapshotGone) || attempt >= 100 {
			return err
		}
	}
}

// Update implements kv.Store.
func (s *Store) Update(ctx context.Context, fn func(kv.Txn) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.opts.Batch {
		n := s.inflight.Add(1)
		for p := s.peak.Load(); n > p && !s.peak.CompareAndSwap(p, n); p = s.peak.Load() {
		}
		defer s.inflight.Add(-1)
		r := &request{ctx: ctx, fn: fn, done: make(chan error, 1)}
		s.mu.RLock()
		if s.closed {
			s.mu.RUnlock()
			return kv.ErrClosed
		}
		s.reqs <- r
		s.mu.RUnlock()
		// Once queued the outcome must be awaited, as with bbolt.
		return <-r.done
	}
	if s.isClosed() {
		return kv.ErrClosed
	}
	for attempt := 0; ; attempt++ {
		o := &occ{s: s}
		t := &txn{o: o, ctx: ctx, writes: map[string][]byte{}}
		err := kv.CallSafely(fn, t)
		if err == nil {
			err = o.commit(ctx, t.writes)
		}
		if !errors.Is(err, kv.ErrConflict) {
			return err
		}
		if err := backoff(ctx, attempt); err != nil {
			return err
		}
	}
}

// maxPage bounds the keys fetched per request by a scan with a limit.
const maxPage = 4096

// maxAttempts bounds the retries of a conflicting transaction.
const maxAttempts = 1000

func backoff(ctx context.Context, attempt int) error {
	if attempt >= maxAttempts {
		return fmt.Errorf("etcdkv: transaction still conflicting after %d attempts: %w", attempt, kv.ErrConflict)
	}
	d := time.Duration(rand.Int64N(int64(time.Millisecond) << min(attempt, 6)))
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

func (s *Store) isClosed() bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.closed
}

// Close waits for queued transactions and closes the etcd client.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return kv.ErrClosed
	}
	s.closed = true
	if s.reqs != nil {
		close(s.reqs)
	}
	s.mu.Unlock()
	<-s.finished
	if err := s.cli.Close(); err != nil {
		return fmt.Errorf("etcdkv: close: %w", err)
	}
	return nil
}

// committer runs batches of queued transactions (Options.Batch).
func (s *Store) committer() {
	defer close(s.finished)
	batch := make([]*request, 0, s.opts.MaxBatch)
	peakReset := time.Now()
	for {
		r, ok := <-s.reqs
		if !ok {
			return
		}
		batch = append(batch[:0], r)
	drain:
		for len(batch) < s.opts.MaxBatch {
			select {
			case r, ok := <-s.reqs:
				if !ok {
					break drain
				}
				batch = append(batch, r)
			default:
				break drain
			}
		}
		// As in the bbolt backend: under concurrent load, wait briefly
		// for the writers of the previous batch, whose next transactions
		// are on their way, so that they share the round trips.
		if time.Since(peakReset) > 50*time.Millisecond {
			s.peak.Store(s.inflight.Load())
			peakReset = time.Now()
		}
		if want := min(int(s.peak.Load()), s.opts.MaxBatch); len(batch) < want && s.opts.Linger > 0 {
			timer := time.NewTimer(s.opts.Linger)
		linger:
			for len(batch) < want {
				select {
				case r, ok := <-s.reqs:
					if !ok {
						break linger
					}
					batch = append(batch, r)
				case <-timer.C:
					break linger
				}
			}
			timer.Stop()
		}
		s.runBatch(batch)
	}
}

// runBatch runs the batch's transactions one after another on one snapshot,
// each seeing the writes of those before it, and commits the union of their
// writes at once. A conflict with another writer reruns the whole batch.
// Before that serial pass, prefetch fills the batch's caches of values and
// scan pages, so that the serial pass rarely waits for etcd.
func (s *Store) runBatch(batch []*request) {
	results := make([]error, len(batch))
	ctx := context.Background()
	for attempt := 0; ; attempt++ {
		o := &occ{s: s, pages: map[[2]string]*clientv3.GetResponse{}}
		var err error
		retry := false
		if len(batch) > 1 {
			// The snapshot: on a first attempt the revision of this
			// store's last commit or read (no round trip; a member that
			// has not applied it answers ErrFutureRev and the batch runs
			// again), otherwise the revision a fresh read fixes.
			if rev := s.lastRev.Load(); attempt == 0 && rev > 0 {
				o.rev = rev
			} else {
				_, err = o.get(ctx, s.prefix, clientv3.WithCountOnly())
			}
			if err == nil {
				err = o.prefetch(ctx, batch)
			}
		}
		merged := map[string][]byte{}
		for i, r := range batch {
			if err != nil {
				break
			}
			results[i] = r.ctx.Err()
			if results[i] != nil {
				continue
			}
			t := &txn{o: o, ctx: r.ctx, base: merged, writes: map[string][]byte{}}
			ferr := kv.CallSafely(r.fn, t)
			if errors.Is(ferr, errSnapshotGone) {
				retry = true
				break
			}
			results[i] = ferr
			if ferr == nil {
				for k, v := range t.writes {
					merged[k] = v
				}
			}
		}
		if err == nil && !retry {
			start := time.Now()
			err = o.commit(ctx, merged)
			if err == nil && s.opts.OnCommit != nil {
				s.opts.OnCommit(len(batch), time.Since(start))
			}
		}
		if errors.Is(err, kv.ErrConflict) {
			retry = true
		}
		if retry {
			if attempt < maxAttempts {
				time.Sleep(time.Duration(rand.Int64N(int64(time.Millisecond) << min(attempt, 6))))
				continue
			}
			err = fmt.Errorf("etcdkv: batch still conflicting after %d attempts: %w", attempt, kv.ErrConflict)
		}
		for i, r := range batch {
			if err != nil && results[i] == nil {
				results[i] = err
			}
			r.done <- results[i]
		}
		return
	}
}

// maxPrefetchRounds bounds the rounds of a batch's prefetch; what a
// transaction reads after that many dependent misses it fetches itself.
const maxPrefetchRounds = 4

// prefetch reads what the batch's transactions will read, in rounds of one
// etcd request each. A round runs every transaction on the snapshot with its
// writes thrown away, each until its first read that is not cached yet (the
// read is noted and the transaction abandoned); one read-only etcd
// transaction then fetches everything noted, at the snapshot revision. A
// transaction whose reads depend on what it read needs a round per step, so
// a batch of creates takes one or two requests where reading separately
// would take two per create: on a small machine the CPU of those requests,
// in this process and in etcd, is what bounds the throughput.
func (o *occ) prefetch(ctx context.Context, batch []*request) error {
	o.collect = true
	defer func() { o.collect = false }()
	for range maxPrefetchRounds {
		for _, r := range batch {
			if r.ctx.Err() == nil {
				kv.CallSafely(r.fn, &txn{o: o, ctx: r.ctx, writes: map[string][]byte{}})
			}
		}
		if len(o.wantKeys) == 0 && len(o.wantPages) == 0 {
			return nil
		}
		if err := o.fetchWanted(ctx); err != nil {
			return err
		}
	}
	return nil
}

// fetchWanted reads the keys and scan pages noted by a prefetch round with
// one read-only etcd transaction at the snapshot revision.
func (o *occ) fetchWanted(ctx context.Context) error {
	ops := make([]clientv3.Op, 0, len(o.wantKeys)+len(o.wantPages))
	keys := make([]string, 0, len(o.wantKeys))
	for k := range o.wantKeys {
		keys = append(keys, k)
		ops = append(ops, clientv3.OpGet(k, clientv3.WithRev(o.rev), clientv3.WithSerializable()))
	}
	pages := make([]pageWant, 0, len(o.wantPages))
	for pw := range o.wantPages {
		pages = append(pages, pw)
		ops = append(ops, clientv3.OpGet(pw.from, clientv3.WithRange(pw.end), clientv3.WithLimit(int64(pw.size)),
			clientv3.WithRev(o.rev), clientv3.WithSerializable()))
	}
	clear(o.wantKeys)
	clear(o.wantPages)
	resp, err := o.s.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		if errors.Is(err, rpctypes.ErrCompacted) || errors.Is(err, rpctypes.ErrFutureRev) {
			return errSnapshotGone
		}
		return fmt.Errorf("etcdkv: prefetch %d reads: %w", len(ops), err)
	}
	if len(resp.Responses) != len(ops) {
		return fmt.Errorf("etcdkv: prefetch: %d answers to %d reads", len(resp.Responses), len(ops))
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.values == nil {
		o.values = map[string]cached{}
	}
	for i, k := range keys {
		rr := resp.Responses[i].GetResponseRange()
		if rr == nil {
			return fmt.Errorf("etcdkv: prefetch: answer %d is not a read", i)
		}
		c, mod := valueOf((*clientv3.GetResponse)(rr))
		o.values[k] = c
		o.record(k, mod)
		if o.s.cache != nil {
			o.s.cache.fill(k, cacheEntry{v: c.v, ok: c.ok, mod: mod}, o.rev)
		}
	}
	for i, pw := range pages {
		rr := resp.Responses[len(keys)+i].GetResponseRange()
		if rr == nil {
			return fmt.Errorf("etcdkv: prefetch: answer %d is not a read", len(keys)+i)
		}
		o.pages[[2]string{pw.from, pw.end}] = (*clientv3.GetResponse)(rr)
	}
	return nil
}

// errSnapshotGone reports that the snapshot revision of a transaction can
// no longer be read (compacted, or not yet applied by the member asked); the
// transaction is run again on a new snapshot.
var errSnapshotGone = fmt.Errorf("etcdkv: snapshot revision unavailable: %w", kv.ErrConflict)

// occ is the etcd side of one optimistic transaction: its snapshot revision
// and what it read.
type occ struct {
	s        *Store
	readOnly bool

	// mu guards the fields below: the prefetch pass of a batch reads
	// from several goroutines.
	mu     sync.Mutex
	rev    int64            // snapshot revision, 0 before the first read
	gen    int64            // views: cache generation the view reads at (0: no cache)
	reads  map[string]int64 // full key -> mod revision seen (0: absent)
	ranges [][2]string      // scanned ranges [start, end) of full keys
	values map[string]cached
	pages  map[[2]string]*clientv3.GetResponse // scan pages by (from, end), batches only

	// A prefetch round (collect) notes the reads it misses instead of
	// making them.
	collect   bool
	wantKeys  map[string]struct{}
	wantPages map[pageWant]struct{}
}

// pageWant is a scan page a prefetch round missed.
type pageWant struct {
	from, end string
	size      int
}

// errPrefetchMiss abandons a transaction in a prefetch round at its first
// read that is not cached yet.
var errPrefetchMiss = errors.New("etcdkv: prefetch: read not cached yet")

type cached struct {
	v  []byte
	ok bool
}

func (o *occ) get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	o.mu.Lock()
	rev := o.rev
	o.mu.Unlock()
	if rev != 0 {
		resp, err := o.s.cli.Get(ctx, key, append(opts, clientv3.WithRev(rev), clientv3.WithSerializable())...)
		if err != nil {
			if errors.Is(err, rpctypes.ErrCompacted) || errors.Is(err, rpctypes.ErrFutureRev) {
				return nil, errSnapshotGone
			}
			return nil, fmt.Errorf("etcdkv: read: %w", err)
		}
		return resp, nil
	}
	// The first read fixes the snapshot. A serializable read is enough if
	// the member answering has every write this store acknowledged;
	// otherwise read again through the raft leader (linearizable).
	resp, err := o.s.cli.Get(ctx, key, append(opts, clientv3.WithSerializable())...)
	if err == nil && resp.Header.Revision < o.s.lastRev.Load() {
		resp, err = o.s.cli.Get(ctx, key, opts...)
	}
	if err != nil {
		return nil, fmt.Errorf("etcdkv: read: %w", err)
	}
	o.s.observe(resp.Header.Revision)
	o.mu.Lock()
	if o.rev == 0 {
		o.rev = resp.Header.Revision
	} else if o.rev != resp.Header.Revision {
		// Another goroutine of the batch fixed the snapshot first.
		o.mu.Unlock()
		return o.get(ctx, key, opts...)
	}
	o.mu.Unlock()
	return resp, nil
}

// observe raises lastRev to rev.
func (s *Store) observe(rev int64) {
	for cur := s.lastRev.Load(); rev > cur && !s.lastRev.CompareAndSwap(cur, rev); cur = s.lastRev.Load() {
	}
}

// getPage reads one page of a scan, from the batch's page cache if the
// prefetch pass read it already.
func (o *occ) getPage(ctx context.Context, from, end string, size int) (*clientv3.GetResponse, error) {
	k := [2]string{from, end}
	o.mu.Lock()
	if r, ok := o.pages[k]; ok {
		o.mu.Unlock()
		return r, nil
	}
	cache := o.pages != nil
	if o.collect {
		if o.wantPages == nil {
			o.wantPages = map[pageWant]struct{}{}
		}
		o.wantPages[pageWant{from, end, size}] = struct{}{}
		o.mu.Unlock()
		return nil, errPrefetchMiss
	}
	o.mu.Unlock()
	resp, err := o.get(ctx, from, clientv3.WithRange(end), clientv3.WithLimit(int64(size)))
	if err != nil {
		return nil, err
	}
	if cache {
		o.mu.Lock()
		o.pages[k] = resp
		o.mu.Unlock()
	}
	return resp, nil
}

func (o *occ) getKey(ctx context.Context, full string) ([]byte, bool, error) {
	o.mu.Lock()
	c, ok := o.values[full]
	o.mu.Unlock()
	if ok {
		return c.v, c.ok, nil
	}
	if sc := o.s.cache; sc != nil {
		if e, gen, hit := sc.get(full); hit && (!o.readOnly || gen == o.gen) {
			if !o.readOnly {
				o.mu.Lock()
				o.record(full, e.mod)
				if o.values == nil {
					o.values = map[string]cached{}
				}
				o.values[full] = cached{v: e.v, ok: e.ok}
				o.mu.Unlock()
			}
			return e.v, e.ok, nil
		}
	}
	if o.collect {
		o.mu.Lock()
		if o.wantKeys == nil {
			o.wantKeys = map[string]struct{}{}
		}
		o.wantKeys[full] = struct{}{}
		o.mu.Unlock()
		return nil, false, errPrefetchMiss
	}
	resp, err := o.get(ctx, full)
	if err != nil {
		return nil, false, err
	}
	c, mod := valueOf(resp)
	if o.s.cache != nil {
		o.mu.Lock()
		snap := o.rev
		o.mu.Unlock()
		o.s.cache.fill(full, cacheEntry{v: c.v, ok: c.ok, mod: mod}, snap)
	}
	if !o.readOnly {
		o.mu.Lock()
		o.record(full, mod)
		if o.values == nil {
			o.values = map[string]cached{}
		}
		o.values[full] = c
		o.mu.Unlock()
	}
	return c.v, c.ok, nil
}

// valueOf returns the value a single-key read found, and its mod revision
// (0: absent).
func valueOf(resp *clientv3.GetResponse) (cached, int64) {
	if len(resp.Kvs) == 0 {
		return cached{}, 0
	}
	c := cached{v: resp.Kvs[0].Value, ok: true}
	if c.v == nil {
		c.v = []byte{}
	}
	return c, resp.Kvs[0].ModRevision
}

// record notes a read for the commit's compares; o.mu must be held.
func (o *occ) record(full string, mod int64) {
	if o.reads == nil {
		o.reads = map[string]int64{}
	}
	o.reads[full] = mod
}

// commit writes the buffered writes if nothing read changed since the
// snapshot (and the fence holds). A transaction that read nothing it must
// check and wrote nothing commits trivially.
func (o *occ) commit(ctx context.Context, writes map[string][]byte) error {
	if len(writes) == 0 {
		return nil
	}
	cmps := make([]clientv3.Cmp, 0, len(o.reads)+len(o.ranges)+1)
	fkey, frev := o.s.fence()
	if fkey != "" {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(fkey), "=", frev))
	}
	for k, mod := range o.reads {
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k), "=", mod))
	}
	for _, r := range o.ranges {
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(r[0]), "<", o.rev+1).WithRange(r[1]))
	}
	ops := make([]clientv3.Op, 0, len(writes))
	for k, v := range writes {
		if v == nil {
			ops = append(ops, clientv3.OpDelete(o.s.prefix+k))
		} else {
			ops = append(ops, clientv3.OpPut(o.s.prefix+k, string(v)))
		}
	}
	var els []clientv3.Op
	if fkey != "" {
		els = append(els, clientv3.OpGet(fkey))
	}
	resp, err := o.s.cli.Txn(ctx).If(cmps...).Then(ops...).Else(els...).Commit()
	if o.s.cache != nil {
		if err == nil && resp.Succeeded {
			o.s.cache.committed(writes, o.s.prefix, resp.Header.Revision)
		} else {
			o.s.cache.clear()
		}
	}
	if err != nil {
		return fmt.Errorf("etcdkv: commit %d writes with %d compares: %w", len(ops), len(cmps), err)
	}
	if resp.Succeeded {
		o.s.observe(resp.Header.Revision)
		return nil
	}
	if fkey != "" {
		rr := resp.Responses[0].GetResponseRange()
		if rr == nil || len(rr.Kvs) == 0 || rr.Kvs[0].CreateRevision != frev {
			return ErrFenced
		}
	}
	return kv.ErrConflict
}

// txn implements kv.Txn (and kv.Reader for View) on an occ.
type txn struct {
	o      *occ
	ctx    context.Context
	base   map[string][]byte // writes of earlier transactions of the batch (read-only)
	writes map[string][]byte // this transaction's writes; nil value: deleted
}

func (t *txn) pending(key string) ([]byte, bool, bool) {
	if v, ok := t.writes[key]; ok {
		return v, v != nil, true
	}
	if v, ok := t.base[key]; ok {
		return v, v != nil, true
	}
	return nil, false, false
}

// Get implements kv.Reader.
func (t *txn) Get(key []byte) ([]byte, bool, error) {
	if v, ok, found := t.pending(string(key)); found {
		if !ok {
			return nil, false, nil
		}
		return bytes.Clone(v), true, nil
	}
	v, ok, err := t.o.getKey(t.ctx, t.o.s.prefix+string(key))
	if err != nil || !ok {
		return nil, false, err
	}
	return bytes.Clone(v), true, nil
}

// Put implements kv.Txn.
func (t *txn) Put(key, value []byte) error {
	if t.writes == nil {
		return errors.New("etcdkv: write in a read-only transaction")
	}
	if len(key) == 0 {
		return errors.New("etcdkv: empty key")
	}
	if value == nil {
		value = []byte{}
	}
	t.writes[string(key)] = bytes.Clone(value)
	return nil
}

// Delete implements kv.Txn.
func (t *txn) Delete(key []byte) error {
	if t.writes == nil {
		return errors.New("etcdkv: write in a read-only transaction")
	}
	t.writes[string(key)] = nil
	return nil
}

type pendingKV struct {
	k string
	v []byte // nil: deleted
}

// Scan implements kv.Reader: etcd's keys, fetched in pages at the snapshot
// revision, merged with the pending writes.
func (t *txn) Scan(start, end []byte, limit int, fn func(k, v []byte) error) error {
	inRange := func(k string) bool {
		return k >= string(start) && (end == nil || k < string(end))
	}
	var pend []pendingKV
	seen := map[string]bool{}
	for _, m := range []map[string][]byte{t.writes, t.base} {
		for k, v := range m {
			if !seen[k] && inRange(k) {
				seen[k] = true
				pend = append(pend, pendingKV{k, v})
			}
		}
	}
	sort.Slice(pend, func(i, j int) bool { return pend[i].k < pend[j].k })

	o, p := t.o, t.o.s.prefix
	fullStart := p + string(start)
	fullEnd := o.s.end
	if end != nil {
		fullEnd = p + string(end)
	}
	// A scan with a limit fetches at most that many keys per request
	// (plus the pending deletions that may hide some), up to maxPage.
	pageSize := o.s.opts.PageSize
	if limit > 0 {
		pageSize = min(max(limit+len(pend), 1), max(pageSize, maxPage))
	}
	n := 0
	lastSeen := "" // last user key passed to fn
	stopped := false
	emit := func(k string, v []byte) error {
		if limit > 0 && n >= limit {
			stopped = true
			return kv.ErrStop
		}
		n++
		lastSeen = k
		if err := fn([]byte(k), v); err != nil {
			stopped = true
			return err
		}
		return nil
	}
	err := func() error {
		from := fullStart
		for {
			resp, err := o.getPage(t.ctx, from, fullEnd, pageSize)
			if err != nil {
				return err
			}
			for _, ekv := range resp.Kvs {
				k := string(ekv.Key[len(p):])
				for len(pend) > 0 && pend[0].k <= k {
					pk := pend[0]
					pend = pend[1:]
					if pk.v != nil {
						if err := emit(pk.k, pk.v); err != nil {
							return err
						}
					}
				}
				if seen[k] {
					continue // shadowed by a pending write
				}
				if !o.readOnly {
					o.mu.Lock()
					o.record(string(ekv.Key), ekv.ModRevision)
					o.mu.Unlock()
				}
				v := ekv.Value
				if v == nil {
					v = []byte{}
				}
				if err := emit(k, v); err != nil {
					return err
				}
			}
			if !resp.More || len(resp.Kvs) == 0 {
				break
			}
			from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
		}
		for _, pk := range pend {
			if pk.v != nil {
				if err := emit(pk.k, pk.v); err != nil {
					return err
				}
			}
		}
		return nil
	}()
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.readOnly && o.rev != 0 {
		// Phantoms: no key may appear in the part of the range the
		// caller looked at.
		rangeEnd := fullEnd
		if stopped {
			rangeEnd = p + lastSeen + "\x00"
		}
		if rangeEnd > fullStart {
			o.ranges = append(o.ranges, [2]string{fullStart, rangeEnd})
		}
	}
	if errors.Is(err, kv.ErrStop) {
		return nil
	}
	return err
}
