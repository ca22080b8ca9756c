// Package fileio is the FUSE client's file I/O engine: it implements fs.Data
// over the metadata service (stripe maps, write grants, commits) and the
// chunkservers (one-sided RDMA reads and writes of shards).
//
// Writes land in stripe buffers carved from one registered memory region. A
// stripe that holds committed data and is only partly overwritten is merged
// with it lazily: the ranges not overwritten are read in before the stripe is
// flushed or read back, so a sequential overwrite never reads. Flush
// (close, fsync, or a file's dirty data passing its limit) Reed-Solomon encodes
// each dirty stripe in place, writes its k+m shards to the granted chunkservers
// in parallel straight from the buffer (prepare, RDMA_WRITE, commit: durable on
// return), then commits all the file's stripes with their new versions, the size
// and mtime in one compare-and-set transaction. A stripe someone else committed
// meanwhile is re-read and the writes are applied again on top.
//
// Reads use the stripe map cached since the file was opened (close-to-open
// consistency) and RDMA_READ the data shards they need; a shard that cannot be
// read is rebuilt from any k shards of the stripe, so up to m lost chunkservers
// stay invisible to applications.
//
// Shard lengths (internal/stripe): short stripes. Data shard i is stored
// with its own bytes only (rounded up to 4 KiB), parity shards as long as data
// shard 0; for coding, data shards count as zero-padded to that length, and a
// decoder reads each shard's stored bytes and zeros after them.
//
// Files by concern: engine.go (configuration, per-file state, the stripe map
// and its fetching), buffered.go (writes into dirty stripes and the memory
// they take), dirty.go (the dirty stripe: whole or sparse, its extents),
// flush.go (which stripes flush when, and waiting for them), write.go
// (encoding, writing shards with replacements, committing), delta.go
// (parity-delta writes of small changes), read.go (reads and degraded reads),
// readahead.go, truncate.go (truncation, and rebasing after a conflict),
// pool.go (registered buffer memory); chunkserver connections and their
// health are chunkserver/client.Pool's.
package fileio

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	chunkclient "github.com/rdmafs/rdmafs/chunkserver/client"
	"github.com/rdmafs/rdmafs/chunkserver/proto"
	"github.com/rdmafs/rdmafs/internal/stripe"
	"github.com/rdmafs/rdmafs/meta/metapb"
	"github.com/rdmafs/rdmafs/rdma"
)

// Config configures an Engine.
type Config struct {
	Meta   metapb.MetaClient
	Device rdma.Device       // transport to the chunkservers
	Secret []byte            // cluster secret, or a mount token's data key, presented to chunkservers
	Token  *proto.Token      // the mount token Secret is the data key of; nil: Secret is the cluster secret
	Caps   *chunkclient.Caps // with Token: the chunk capabilities meta gave it
	// MemBytes is the registered buffer memory (default 256 MiB). It bounds
	// dirty data: writers flush their own files when it runs short.
	MemBytes int
	// FileDirtyLimit bounds one file's dirty data before it is flushed
	// (default a quarter of MemBytes).
	FileDirtyLimit int
	// ReadaheadStripes is the largest readahead window of a sequential reader,
	// in stripes (default 8; negative: no readahead).
	ReadaheadStripes int
	// ReadaheadBytes bounds the memory holding prefetched stripes of all files
	// (default a quarter of MemBytes).
	ReadaheadBytes int
	// IOTimeout bounds how long a request to a chunkserver may go without
	// any answer on its connection before the chunkserver is deemed gone
	// and routed around (default 10s); below it the timeout follows the
	// observed latency, from minIOTimeout(IOTimeout) up.
	IOTimeout time.Duration
	// WriteTimeout bounds how long a write waits while fewer than a
	// stripe's min-write-shards chunkservers can take it (default 60s);
	// then it fails with EIO.
	WriteTimeout time.Duration
	// Now returns the current time (default time.Now).
	Now    func() time.Time
	Logger *slog.Logger
}

// Engine is the file I/O engine of one mount.
type Engine struct {
	cfg   Config
	pd    rdma.ProtectionDomain
	mem   *rdma.Memory
	mr    rdma.MemoryRegion
	pool  *pool
	conns *chunkclient.Pool
	log   *slog.Logger

	mu     sync.Mutex
	files  map[uint64]*file
	codecs stripe.Codecs

	ra    readaheadState
	stats Stats
	wire  chunkclient.WireStats // the connections' work requests (Wire)

	dirtyBytes   atomic.Int64 // buffer bytes of all files' dirty and flushing stripes (addBuf)
	patchedBytes atomic.Int64 // bytes of kept deltas of all files (keepPatched)

	slabs       sync.Pool    // of *slab, for sparse stripes
	sparseTotal atomic.Int64 // slab bytes held by all files' sparse stripes

	observer atomic.Pointer[commitObserver] // ObserveCommits

	// noPatches is set once meta refused a patched inline commit (a server
	// that predates them): inline commits then send their bytes whole.
	noPatches atomic.Bool
}

// commitObserver is what ObserveCommits registered.
type commitObserver struct {
	begin func(ino uint64)
	end   func(ino uint64, r *metapb.CommitStripesReply)
}

// ObserveCommits implements fs.Data: begin is called before each commit of
// a file's written stripes is sent to meta, and end when it has returned,
// with meta's reply (nil when it failed). end is called before the engine
// lets go of the writes the commit carried: Size reports them until end has
// returned.
func (e *Engine) ObserveCommits(begin func(ino uint64), end func(ino uint64, r *metapb.CommitStripesReply)) {
	e.observer.Store(&commitObserver{begin: begin, end: end})
}

// commit sends req, a commit of stripes of req.Ino, to meta, between the
// observer's begin and end. With behind, and a metadata client that can,
// it goes with the client's next batch of calls (FlushBehind).
func (e *Engine) commit(ctx context.Context, req *metapb.CommitStripesRequest, behind bool) (*metapb.CommitStripesReply, error) {
	o := e.observer.Load()
	if o != nil {
		o.begin(req.Ino)
	}
	var r *metapb.CommitStripesReply
	var err error
	if cb, ok := e.cfg.Meta.(commitBehinder); ok && behind {
		e.stats.InlineBehind.Add(1)
		r, err = cb.CommitBehind(ctx, req)
	} else {
		r, err = e.cfg.Meta.CommitStripes(ctx, req)
	}
	if o != nil {
		if err != nil {
			o.end(req.Ino, nil)
		} else {
			o.end(req.Ino, r)
		}
	}
	return r, err
}

// commitBehinder is a metadata client that can send a commit behind, with
// its next batch of calls (meta/client.Client.CommitBehind).
type commitBehinder interface {
	CommitBehind(ctx context.Context, req *metapb.CommitStripesRequest) (*metapb.CommitStripesReply, error)
}

// WriteErrors implements fs.Data: the number of writes of ino that failed
// for good since the engine has known the file (their data dropped), and
// the latest failure.
func (e *Engine) WriteErrors(ino uint64) (uint64, error) {
	f := e.file(ino)
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.failures, f.lastFailure
}

// Stats count what the engine did.
type Stats struct {
	// DegradedReads counts stripes read with shards missing, rebuilt from the
	// survivors.
	DegradedReads atomic.Int64
	// ReadaheadStripes counts stripes prefetched for sequential readers, and
	// ReadaheadHits the reads served from them.
	ReadaheadStripes, ReadaheadHits atomic.Int64
	// MergeReads counts partly overwritten stripes whose committed data was
	// read in to merge with the new bytes.
	MergeReads atomic.Int64
	// DegradedWrites counts stripes committed with shards missing (fewer
	// chunkservers reachable than k+m), left to repair.
	DegradedWrites atomic.Int64
	// InlineCommits counts small files' stripes committed into metadata
	// instead of shards.
	InlineCommits atomic.Int64
	// InlineBehind counts inline commits sent behind, with a batch of the
	// mount's other calls (FlushBehind).
	InlineBehind atomic.Int64
	// InlinePatched counts inline commits that sent only the changed bytes
	// of the file (StripeCommit.patch).
	InlinePatched atomic.Int64
	// SparseStripes counts dirty stripes begun sparse (small writes
	// gathered without a whole-stripe buffer).
	SparseStripes atomic.Int64
	// DeltaWrites counts stripes written as a parity delta: only the
	// changed ranges and the parity's, each shard's new version derived
	// from the committed one on its chunkserver.
	DeltaWrites atomic.Int64
	// WriteRetries counts shard writes tried again: after a chunkserver
	// answered busy, or on another chunkserver after one failed.
	WriteRetries atomic.Int64
	// DeltaOldKept counts ranges of parity deltas whose old bytes the mount
	// had from the stripe's previous delta (patched), where they would
	// otherwise be read from a chunkserver.
	DeltaOldKept atomic.Int64
	// NextGrantsUsed counts stripes written with the grant the commit of
	// their previous delta made (nextgrant.go), without a GrantWrite call.
	NextGrantsUsed atomic.Int64
}

// Stats returns the engine's counters.
func (e *Engine) Stats() *Stats { return &e.stats }

// New allocates and registers the engine's buffer memory, once.
func New(cfg Config) (*Engine, error) {
	if cfg.MemBytes <= 0 {
		cfg.MemBytes = 256 << 20
	}
	if cfg.FileDirtyLimit <= 0 {
		cfg.FileDirtyLimit = cfg.MemBytes / 4
	}
	if cfg.ReadaheadStripes == 0 {
		cfg.ReadaheadStripes = 8
	}
	if cfg.ReadaheadBytes <= 0 {
		cfg.ReadaheadBytes = cfg.MemBytes / 4
	}
	if cfg.ReadaheadStripes < 0 {
		cfg.ReadaheadBytes = 0
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.IOTimeout <= 0 {
		cfg.IOTimeout = 10 * time.Second
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = 60 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	pd, err := cfg.Device.AllocPD()
	if err != nil {
		return nil, fmt.Errorf("fileio: %w", err)
	}
	mem, err := rdma.AllocMemory("fileio", cfg.MemBytes)
	if err != nil {
		pd.Close()
		return nil, fmt.Errorf("fileio: %w", err)
	}
	mr, err := pd.RegisterMemory(mem, rdma.AccessLocalWrite)
	if err != nil {
		mem.Free()
		pd.Close()
		return nil, fmt.Errorf("fileio: %w", err)
	}
	e := &Engine{cfg: cfg, pd: pd, mem: mem, mr: mr, pool: newPool(mr), log: cfg.Logger,
		files: map[uint64]*file{}}
	e.ra.limit = int64(cfg.ReadaheadBytes)
	e.conns = chunkclient.NewPool(cfg.Device, pd, chunkclient.Options{Wire: &e.wire, Secret: cfg.Secret, Token: cfg.Token, Caps: cfg.Caps, MinTimeout: minIOTimeout(cfg.IOTimeout), MaxTimeout: cfg.IOTimeout},
		cfg.Now, cfg.Logger)
	return e, nil
}

// Close drops every connection and frees the buffer memory. Dirty data not
// flushed is lost: flush files first.
func (e *Engine) Close() error {
	e.conns.Close()
	e.mr.Deregister()
	e.mem.Free()
	return e.pd.Close()
}

// minIOTimeout is the floor of the stall timeout under ceiling: 2s, or a
// fifth of the ceiling when that is more (chunkservers on slow disks, whose
// syncs may take seconds, want a higher ceiling, and the floor follows),
// never above the ceiling.
func minIOTimeout(ceiling time.Duration) time.Duration {
	return min(ceiling, max(2*time.Second, ceiling/5))
}

// isInline reports whether a committed stripe keeps its bytes in metadata.
func isInline(si *metapb.StripeInfo) bool { return len(si.Shards) == 0 }

// inlineSized reports whether stripe s, written up to stripe offset end,
// is the one stripe of a file small enough under l to keep its data in
// metadata.
func inlineSized(l stripe.Layout, s uint64, end int64) bool {
	return s == 0 && l.Inline > 0 && end <= l.Inline
}

// bufSize returns the size of a whole dirty stripe's buffer under layout l:
// K data and M parity units.
func bufSize(l stripe.Layout) int { return (l.K + l.M) * int(l.Unit) }

// file is the engine's state of one inode. Stripes being written move from
// dirty to flushing while their shards and commit are in flight; cond is
// signalled whenever a flush ends.
type file struct {
	mu       sync.Mutex
	cond     *sync.Cond
	ino      uint64
	lay      stripe.Layout                 // never changes for a file; K = 0 until known
	size     int64                         // committed size as last seen, grown by local writes; -1 unknown
	stripes  map[uint64]*metapb.StripeInfo // committed stripes as last seen; nil value: none
	known    bool                          // every committed stripe is in stripes (a file this mount created)
	dirty    map[uint64]*dirtyStripe
	flushing map[uint64]*dirtyStripe
	bufBytes int   // buffer bytes held by dirty and flushing stripes
	sparse   int   // of which slab bytes held by sparse stripes
	err      error // a background flush's failure, reported by the next Flush
	// failures counts the writes that failed for good (their data dropped)
	// and lastFailure is the latest: every open file description reports
	// each once (WriteErrors), whichever closed or synced first.
	failures    uint64
	lastFailure error
	// A truncate in progress: until meta has answered it (Truncated), a
	// size read from meta meanwhile may be the old one; the file's size is
	// sizeCap.
	// forgotten: the kernel forgot the inode; the engine drops the file
	// once nothing of it is dirty or flushing (Forget).
	forgotten bool
	syncing   int // Sync calls in progress: commits started meanwhile are durable at once
	behind    int // FlushBehind calls in progress: inline commits started meanwhile go behind
	capped    bool
	sizeCap   int64

	readahead *seqWindow            // the sequential-read policy; nil until the first read
	cache     map[uint64]*prefetch  // stripes fetched ahead of the reader
	patched   map[uint64]*patched   // the last parity delta of stripes, for the next one's old bytes
	next      map[uint64]*nextGrant // grants made for stripes' next deltas (nextgrant.go)
}

func (e *Engine) file(ino uint64) *file {
	e.mu.Lock()
	defer e.mu.Unlock()
	f := e.files[ino]
	if f == nil {
		f = &file{ino: ino, stripes: map[uint64]*metapb.StripeInfo{}, dirty: map[uint64]*dirtyStripe{},
			flushing: map[uint64]*dirtyStripe{}, cache: map[uint64]*prefetch{}, size: -1}
		f.cond = sync.NewCond(&f.mu)
		e.files[ino] = f
	}
	return f
}

// Open forgets what is cached of ino's committed state, so that this open sees
// everything committed before it (close-to-open consistency).
func (e *Engine) Open(ctx context.Context, ino uint64) error {
	f := e.file(ino)
	f.mu.Lock()
	defer f.mu.Unlock()
	clear(f.stripes)
	f.known = false
	f.forgotten = false
	if len(f.dirty) == 0 && len(f.flushing) == 0 {
		f.size = -1
	}
	return nil
}

// Forget implements fs.Data: the kernel no longer knows ino, so nothing has
// it open. The engine drops its state of the file now, or once what was
// written to it is committed, so that the state of every file a mount ever
// touched does not pile up.
func (e *Engine) Forget(ino uint64) {
	e.mu.Lock()
	f := e.files[ino]
	e.mu.Unlock()
	if f == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.forgotten = true
	e.dropIfForgotten(f)
}

// dropIfForgotten removes f from the engine if the kernel forgot it and
// nothing of it is dirty or flushing. The caller holds f.mu.
func (e *Engine) dropIfForgotten(f *file) {
	if !f.forgotten || len(f.dirty) > 0 || len(f.flushing) > 0 {
		return
	}
	e.dropCacheLocked(f)
	e.dropAllPatched(f)
	e.mu.Lock()
	if e.files[f.ino] == f {
		delete(e.files, f.ino)
	}
	e.mu.Unlock()
}

// Created tells the engine that ino was just created empty with layout l
// by this mount: its writes then need no lookup of committed stripes.
func (e *Engine) Created(ino uint64, l *metapb.Layout) {
	if l == nil || l.K == 0 || l.Unit == 0 {
		return
	}
	f := e.file(ino)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.forgotten = false
	if f.lay.K != 0 || len(f.dirty) > 0 || len(f.flushing) > 0 {
		return // another process of this mount got to the file first
	}
	clear(f.stripes)
	f.lay, f.size, f.known = l.Stripe(), 0, true
}

// fetch loads the layout, size and the committed state of stripes
// [first, first+count) that are not cached.
func (e *Engine) fetch(ctx context.Context, f *file, first, count uint64) error {
	if f.known && f.size >= 0 && f.lay.K > 0 {
		return nil
	}
	if f.size >= 0 && f.lay.K > 0 {
		missing := false
		for s := first; s < first+count; s++ {
			if _, ok := f.stripes[s]; !ok {
				missing = true
				break
			}
		}
		if !missing {
			return nil
		}
	}
	sctx, done := slow(ctx)
	r, err := e.cfg.Meta.GetStripes(sctx, &metapb.GetStripesRequest{Ino: f.ino, First: first, Count: count})
	done()
	if err != nil {
		return err
	}
	if l := r.Layout; l != nil && l.K > 0 && (f.lay.K == 0 || l.Stripe().StripeSize() == f.lay.StripeSize()) {
		f.lay = l.Stripe() // a relayout keeps the stripe size
	}
	if f.lay.K == 0 || f.lay.Unit == 0 {
		return fmt.Errorf("fileio: inode %d has no layout: %w", f.ino, syscall.EIO)
	}
	size := int64(r.Size)
	if f.capped {
		size = f.sizeCap
	}
	for _, m := range []map[uint64]*dirtyStripe{f.dirty, f.flushing} {
		for s, d := range m {
			size = max(size, int64(s)*f.lay.StripeSize()+d.length)
		}
	}
	f.size = max(size, 0)
	for s := first; s < first+count; s++ {
		f.stripes[s] = nil
	}
	for _, si := range r.Stripes {
		f.stripes[si.Stripe] = si
	}
	return nil
}

// killableContext is a request context without cancellation that can give
// one its caller's death cancels (fs's read context), for the waits of a
// read that may be long.
type killableContext interface {
	Killable() (context.Context, func())
}

// slow returns the context for a wait that may be long: ctx itself, or the
// killable one a killableContext gives. done must be called after the wait.
func slow(ctx context.Context) (context.Context, func()) {
	if k, ok := ctx.(killableContext); ok {
		return k.Killable()
	}
	return ctx, func() {}
}

// Size reports the size of ino as this engine sees it while it holds writes
// not yet committed: the metadata service learns of them only when they are
// (false: there are none, and the service's size is current).
func (e *Engine) Size(ino uint64) (int64, bool) {
	e.mu.Lock()
	f := e.files[ino]
	e.mu.Unlock()
	if f == nil {
		return 0, false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.size < 0 || len(f.dirty)+len(f.flushing) == 0 {
		return 0, false
	}
	return f.size, true
}
