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
// Shard length convention: all k+m shards of a stripe have the same length,
// that of data shard 0 rounded up to 4 KiB; data shards with fewer bytes are
// zero-padded. A small file therefore costs k+m small chunks, not full units.
package fileio

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/klauspost/reedsolomon"

	"github.com/rdmafs/rdmafs/chunkserver/chunk"
	chunkclient "github.com/rdmafs/rdmafs/chunkserver/client"
	"github.com/rdmafs/rdmafs/fs/ec"
	metaclient "github.com/rdmafs/rdmafs/meta/client"
	"github.com/rdmafs/rdmafs/meta/metapb"
	"github.com/rdmafs/rdmafs/rdma"
)

// Config configures an Engine.
type Config struct {
	Meta   metapb.MetaClient
	Device rdma.Device // transport to the chunkservers
	Secret []byte      // cluster secret, presented to chunkservers
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
	conns *conns
	log   *slog.Logger

	mu    sync.Mutex
	files map[uint64]*file
	codes map[[2]int]reedsolomon.Encoder

	ra    readaheadState
	stats Stats

	slabs       sync.Pool    // of *slab, for sparse stripes
	sparseTotal atomic.Int64 // slab bytes held by all files' sparse stripes
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
	// SparseStripes counts dirty stripes begun sparse (small writes
	// gathered without a whole-stripe buffer).
	SparseStripes atomic.Int64
	// DeltaWrites counts stripes written as a parity delta: only the
	// changed ranges and the parity's, each shard's new version derived
	// from the committed one on its chunkserver.
	DeltaWrites atomic.Int64
}

// Stats returns the engine's counters.
func (e *Engine) Stats() *Stats { return &e.stats }

var crcTable = crc32.MakeTable(crc32.Castagnoli)

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
		files: map[uint64]*file{}, codes: map[[2]int]reedsolomon.Encoder{}}
	e.ra.limit = int64(cfg.ReadaheadBytes)
	e.conns = newConns(cfg.Device, pd, chunkclient.Options{Secret: cfg.Secret, MinTimeout: minIOTimeout(cfg.IOTimeout), MaxTimeout: cfg.IOTimeout},
		cfg.Now, cfg.Logger)
	return e, nil
}

// Close drops every connection and frees the buffer memory. Dirty data not
// flushed is lost: flush files first.
func (e *Engine) Close() error {
	e.conns.closeAll()
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

func (e *Engine) codec(k, m int) (reedsolomon.Encoder, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if enc, ok := e.codes[[2]int{k, m}]; ok {
		return enc, nil
	}
	if m == 0 {
		return nil, nil
	}
	enc, err := reedsolomon.New(k, m)
	if err != nil {
		return nil, fmt.Errorf("fileio: %d+%d code: %w", k, m, err)
	}
	e.codes[[2]int{k, m}] = enc
	return enc, nil
}

// layout is a file's erasure-coding layout; it never changes for a file.
// A file of at most inline bytes commits its data into metadata (stripe 0
// inline: no shards) instead of writing k+m shards.
type layout struct {
	k, m   int
	unit   int64
	inline int64
}

// layoutOf converts the metadata service's layout.
func layoutOf(l *metapb.Layout) layout {
	return layout{k: int(l.K), m: int(l.M), unit: int64(l.Unit), inline: int64(l.InlineMax)}
}

// isInline reports whether a committed stripe keeps its bytes in metadata.
func isInline(si *metapb.StripeInfo) bool { return len(si.Shards) == 0 }

// stripeSize returns the bytes of file data a stripe holds.
func (l layout) stripeSize() int64 { return int64(l.k) * l.unit }

// bufSize returns the size of a whole dirty stripe's buffer: k data and m
// parity units.
func (l layout) bufSize() int { return (l.k + l.m) * int(l.unit) }

// shardLen returns the length of every shard of a stripe holding length bytes.
func (l layout) shardLen(length int64) int64 {
	n := min(length, l.unit)
	return (n + 4095) / 4096 * 4096
}

// file is the engine's state of one inode. Stripes being written move from
// dirty to flushing while their shards and commit are in flight; cond is
// signalled whenever a flush ends.
type file struct {
	mu       sync.Mutex
	cond     *sync.Cond
	ino      uint64
	lay      layout
	size     int64                         // committed size as last seen, grown by local writes; -1 unknown
	stripes  map[uint64]*metapb.StripeInfo // committed stripes as last seen; nil value: none
	known    bool                          // every committed stripe is in stripes (a file this mount created)
	dirty    map[uint64]*dirtyStripe
	flushing map[uint64]*dirtyStripe
	bufBytes int   // buffer bytes held by dirty and flushing stripes
	sparse   int   // of which slab bytes held by sparse stripes
	err      error // a background flush's failure, reported by the next Flush
	// A truncate in progress: until meta has answered it (Truncated), a
	// size read from meta meanwhile may be the old one; the file's size is
	// sizeCap.
	capped  bool
	sizeCap int64

	readahead *ec.Readahead        // the sequential-read policy; nil until the first read
	cache     map[uint64]*prefetch // stripes fetched ahead of the reader
}

// dirtyStripe is a stripe being rewritten: data shards then parity in one
// registered buffer, built on base (the committed version, 0 for none).
//
// A stripe whose first write is small and not where a sequential writer
// would begin is sparse instead: buf is nil and the writes are kept as they
// came, in slabs, so that a random writer gathers many writes in many
// stripes within the memory of a few whole stripes. A sparse stripe gets its
// buffer (materialize) when its writes add up to a quarter of the stripe or
// when it is flushed; reads overlay its writes on the committed data.
type dirtyStripe struct {
	buf     *buffer
	sparse  []sparseWrite // while buf is nil: the writes, oldest first
	slabs   []*slab       // hold the sparse writes' bytes
	slabOff int           // bytes used of the last slab
	base    uint64
	length  int64      // bytes of file data in the stripe
	extents [][2]int64 // ranges written, sorted and merged, for reapplying after a conflict
	// base is read in lazily: committed holds the committed stripe whose bytes
	// [0, fillEnd) not covered by extents are still to be read into buf (nil
	// when there is nothing to read). A stripe that the writer ends up covering
	// whole, as a sequential overwrite does, is never read.
	committed *metapb.StripeInfo
	fillEnd   int64
	// delta is set while the stripe flushes as a parity delta (its buffer,
	// if any, is then not filled); noDelta once a delta of it failed.
	delta   *deltaPlan
	noDelta bool
	// The data area, buf.b[:dataLen], is zeroed lazily: [0, clean) holds
	// written, filled or zeroed bytes and the rest whatever the buffer held
	// before. A writer that covers the stripe in order, as sequential writes
	// do, never has it cleared; anything else that reads or fills the buffer
	// calls zero first.
	clean, dataLen int64
}

// slabSize is the size of the pieces of memory that hold sparse writes; a
// write larger than a slab makes its stripe whole at once.
const slabSize = 64 << 10

type slab [slabSize]byte

// sparseWrite is a write kept in a sparse stripe: b at offset off.
type sparseWrite struct {
	off int64
	b   []byte
}

// sparseBytes returns the slab memory d holds.
func (d *dirtyStripe) sparseBytes() int { return len(d.slabs) * slabSize }

// addSparse keeps p, written at offset so, in d's slabs and returns how many
// bytes of slab memory d took for it.
func (e *Engine) addSparse(d *dirtyStripe, so int64, p []byte) int {
	grew := 0
	for len(p) > 0 {
		if len(d.slabs) == 0 || d.slabOff == slabSize {
			sl, _ := e.slabs.Get().(*slab)
			if sl == nil {
				sl = new(slab)
			}
			d.slabs, d.slabOff = append(d.slabs, sl), 0
			grew += slabSize
		}
		n := copy(d.slabs[len(d.slabs)-1][d.slabOff:], p)
		d.sparse = append(d.sparse, sparseWrite{so, d.slabs[len(d.slabs)-1][d.slabOff : d.slabOff+n]})
		d.slabOff += n
		so += int64(n)
		p = p[n:]
	}
	return grew
}

// copyWrites returns copies of d's sparse writes clipped to [so, so+n),
// oldest first.
func (d *dirtyStripe) copyWrites(so, n int64) []sparseWrite {
	var out []sparseWrite
	for _, w := range d.sparse {
		lo, hi := max(so, w.off), min(so+n, w.off+int64(len(w.b)))
		if lo < hi {
			out = append(out, sparseWrite{lo, slices.Clone(w.b[lo-w.off : hi-w.off])})
		}
	}
	return out
}

// dropSparse gives d's slabs back, takes them off f's accounts and
// returns the memory freed. The caller holds f.mu.
func (e *Engine) dropSparse(f *file, d *dirtyStripe) int {
	n := d.sparseBytes()
	f.sparse -= n
	f.bufBytes -= n
	for _, sl := range d.slabs {
		e.slabs.Put(sl)
	}
	e.sparseTotal.Add(-int64(n))
	d.slabs, d.sparse, d.slabOff = nil, nil, 0
	return n
}

// materialize gives sparse stripe d the whole-stripe buffer buf and applies
// its writes to it; the committed bytes around them are read in lazily, as
// for any partly written stripe. The caller holds f.mu.
func (e *Engine) materialize(f *file, d *dirtyStripe, buf *buffer) {
	d.buf, d.clean = buf, 0
	d.zero()
	for _, w := range d.sparse {
		copy(buf.b[w.off:], w.b)
	}
	e.dropSparse(f, d)
	f.bufBytes += len(buf.b)
}

// dropDirty gives back all the memory of dirty stripe d: its buffer, its
// slabs and its delta's. The caller holds f.mu.
func (e *Engine) dropDirty(f *file, d *dirtyStripe) {
	if d.buf != nil {
		f.bufBytes -= len(d.buf.b)
		e.pool.put(d.buf)
		d.buf = nil
	}
	e.dropSparse(f, d)
	e.dropDelta(f, d)
}

// errNoBuffer reports that a sparse stripe could not get its buffer now.
var errNoBuffer = errors.New("fileio: no buffer memory free for a sparse stripe")

// zeroTo clears the data area from clean up to end.
func (d *dirtyStripe) zeroTo(end int64) {
	if end > d.clean {
		clear(d.buf.b[d.clean:end])
		d.clean = end
	}
}

// zero clears whatever of the data area is not yet written or cleared.
func (d *dirtyStripe) zero() { d.zeroTo(d.dataLen) }

// gaps calls fn for each range of [0, end) not covered by the extents.
func (d *dirtyStripe) gaps(end int64, fn func(lo, hi int64) error) error {
	at := int64(0)
	for _, x := range d.extents {
		if x[0] >= end {
			break
		}
		if x[0] > at {
			if err := fn(at, x[0]); err != nil {
				return err
			}
		}
		at = max(at, x[1])
	}
	if at < end {
		return fn(at, end)
	}
	return nil
}

// truncateSparse cuts the sparse writes at n.
func (d *dirtyStripe) truncateSparse(n int64) {
	out := d.sparse[:0]
	for _, w := range d.sparse {
		if w.off < n {
			w.b = w.b[:min(int64(len(w.b)), n-w.off)]
			out = append(out, w)
		}
	}
	d.sparse = out
}

// truncate cuts the extents at n.
func (d *dirtyStripe) truncate(n int64) {
	out := d.extents[:0]
	for _, x := range d.extents {
		if x[0] < n {
			out = append(out, [2]int64{x[0], min(x[1], n)})
		}
	}
	d.extents = out
	d.fillEnd = min(d.fillEnd, n)
}

// addExtent records [lo, hi) as written, keeping the list sorted and merged.
func (d *dirtyStripe) addExtent(lo, hi int64) {
	x := append(d.extents, [2]int64{lo, hi})
	slices.SortFunc(x, func(a, b [2]int64) int { return int(a[0] - b[0]) })
	out := x[:1]
	for _, e := range x[1:] {
		if last := &out[len(out)-1]; e[0] <= last[1] {
			last[1] = max(last[1], e[1])
		} else {
			out = append(out, e)
		}
	}
	d.extents = out
}

// covers reports whether the writes cover [0, n).
func (d *dirtyStripe) covers(n int64) bool {
	return len(d.extents) == 1 && d.extents[0][0] == 0 && d.extents[0][1] >= n
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
	if len(f.dirty) == 0 && len(f.flushing) == 0 {
		f.size = -1
	}
	return nil
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
	if f.lay.k != 0 || len(f.dirty) > 0 || len(f.flushing) > 0 {
		return // another process of this mount got to the file first
	}
	clear(f.stripes)
	f.lay, f.size, f.known = layoutOf(l), 0, true
}

// fetch loads the layout, size and the committed state of stripes
// [first, first+count) that are not cached.
func (e *Engine) fetch(ctx context.Context, f *file, first, count uint64) error {
	if f.known && f.size >= 0 && f.lay.k > 0 {
		return nil
	}
	if f.size >= 0 && f.lay.k > 0 {
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
	if l := r.Layout; l != nil && l.K > 0 && f.lay.k == 0 {
		f.lay = layoutOf(l)
	}
	if f.lay.k == 0 || f.lay.unit == 0 {
		return fmt.Errorf("fileio: inode %d has no layout: %w", f.ino, syscall.EIO)
	}
	size := int64(r.Size)
	if f.capped {
		size = f.sizeCap
	}
	for _, m := range []map[uint64]*dirtyStripe{f.dirty, f.flushing} {
		for s, d := range m {
			size = max(size, int64(s)*f.lay.stripeSize()+d.length)
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

// Read implements fs.Data. The file's lock is held only to look up what to
// read: the RDMA reads run without it, so the kernel's parallel readahead
// requests proceed in parallel.
func (e *Engine) Read(ctx context.Context, ino uint64, p []byte, off int64) (int, error) {
	n, _, _, err := e.read(ctx, ino, p, off, false)
	return n, err
}

// ReadInPlace reads like Read, except that when the whole range lies in one
// stripe already read ahead it returns those bytes where they are, in the
// engine's registered memory, instead of copying them into p: a sequential
// reader's data then crosses memory once less. Such bytes stay valid until
// release.Release is called, which must be called exactly once; release is nil
// when the bytes are p[:n]. A short count means end of file.
func (e *Engine) ReadInPlace(ctx context.Context, ino uint64, p []byte, off int64) ([]byte, interface{ Release() }, error) {
	n, view, pf, err := e.read(ctx, ino, p, off, true)
	switch {
	case err != nil:
		return nil, nil, err
	case pf != nil:
		return view, pf, nil
	default:
		return p[:n], nil, nil
	}
}

// read is Read and, with inPlace, ReadInPlace: when the range is one piece of
// a stripe read ahead, it returns that stripe's bytes (view) and the reference
// that keeps them (pf) instead of copying.
func (e *Engine) read(ctx context.Context, ino uint64, p []byte, off int64, inPlace bool) (n int, view []byte, pf *prefetch, err error) {
	if len(p) == 0 {
		return 0, nil, nil, nil
	}
	f := e.file(ino)
	f.mu.Lock()
	if err := e.fetch(ctx, f, 0, 0); err != nil {
		f.mu.Unlock()
		return 0, nil, nil, err
	}
	lay := f.lay
	ss := lay.stripeSize()
	end := min(off+int64(len(p)), f.size)
	if off >= end {
		f.mu.Unlock()
		return 0, nil, nil, nil
	}
	first, last := uint64(off/ss), uint64((end-1)/ss)
	if err := e.fetch(ctx, f, first, last-first+1); err != nil {
		f.mu.Unlock()
		return 0, nil, nil, err
	}
	end = min(end, f.size)
	type piece struct {
		si  *metapb.StripeInfo
		pf  *prefetch // the stripe fetched ahead, or nil
		so  int64
		dst []byte
		// A sparse dirty stripe: a copy of its writes over the range
		// full, applied after the read of si into dst.
		full   []byte
		writes []sparseWrite
	}
	var room [4]piece // a read spans few stripes: no allocation per read
	pieces := room[:0]
	for s := first; s <= last && int64(s)*ss < end; s++ {
		lo, hi := max(off, int64(s)*ss), min(end, int64(s+1)*ss)
		dst := p[lo-off : hi-off]
		so := lo - int64(s)*ss
		d := f.dirty[s]
		if d != nil && d.buf == nil {
			// Sparse: the committed bytes the writes are to be merged with
			// (read after the lock is let go), with a copy of the writes
			// over them.
			pc := piece{si: d.committed, so: so, dst: dst, full: dst, writes: d.copyWrites(so, int64(len(dst)))}
			if d.committed != nil {
				pc.dst = dst[:max(0, min(int64(len(dst)), d.fillEnd-so))]
			}
			clear(dst)
			pieces = append(pieces, pc)
			continue
		}
		if d != nil {
			if err := e.fill(ctx, f, d); err != nil {
				for _, pc := range pieces {
					if pc.pf != nil {
						e.unref(pc.pf)
					}
				}
				f.mu.Unlock()
				return 0, nil, nil, err
			}
		} else if d = f.flushing[s]; d != nil && d.delta != nil {
			// Flushing as a delta: its writes over the committed stripe
			// it builds on.
			pc := piece{si: d.delta.si, so: so, dst: dst, full: dst, writes: d.writtenIn(so, int64(len(dst)))}
			pieces = append(pieces, pc)
			continue
		}
		if d != nil {
			copy(dst, d.buf.b[so:so+int64(len(dst))])
			continue
		}
		si := f.stripes[s]
		pieces = append(pieces, piece{si: si, pf: e.cachedLocked(f, s, si), so: so, dst: dst})
	}
	e.readaheadLocked(ctx, f, off, end)
	f.mu.Unlock()
	if inPlace && len(pieces) == 1 && pieces[0].pf != nil && len(pieces[0].dst) == int(end-off) {
		pc := pieces[0]
		view, err := e.prefetchedView(ctx, pc.pf, pc.so, len(pc.dst))
		if err != nil {
			e.unref(pc.pf)
			return 0, nil, nil, err
		}
		if view != nil {
			return len(view), view, pc.pf, nil
		}
	}
	for _, pc := range pieces {
		if err != nil {
			if pc.pf != nil {
				e.unref(pc.pf)
			}
			continue
		}
		done := false
		if pc.pf != nil {
			done, err = e.copyPrefetched(ctx, pc.pf, pc.so, pc.dst)
			e.unref(pc.pf)
		}
		if !done && err == nil {
			err = e.readCommitted(ctx, ino, lay, pc.si, pc.so, pc.dst)
		}
		for _, w := range pc.writes {
			copy(pc.full[w.off-pc.so:], w.b)
		}
	}
	if err != nil {
		return 0, nil, nil, err
	}
	return int(end - off), nil, nil, nil
}

// readCommitted reads [so, so+len(dst)) of a committed stripe into dst; bytes
// past its length, and stripes never written, read as zeros.
func (e *Engine) readCommitted(ctx context.Context, ino uint64, lay layout, si *metapb.StripeInfo, so int64, dst []byte) error {
	return e.readCommittedTo(ctx, ino, lay, si, so, dst, nil, 0)
}

// readCommittedTo is readCommitted; when into is not nil, dst is
// into.b[at:at+len(dst)] and the shards are read straight into it, taking no
// buffer memory (a dirty stripe's merge read holds its file's lock: waiting
// for memory there could wait for itself).
func (e *Engine) readCommittedTo(ctx context.Context, ino uint64, lay layout, si *metapb.StripeInfo, so int64, dst []byte, into *buffer, at int) error {
	clear(dst)
	if si == nil || so >= int64(si.Length) {
		return nil
	}
	if isInline(si) {
		if so < int64(len(si.InlineData)) {
			copy(dst, si.InlineData[so:min(int64(len(si.InlineData)), int64(si.Length))])
		}
		return nil
	}
	n := min(int64(len(dst)), int64(si.Length)-so)
	if into == nil {
		tmp, err := e.pool.get(ctx, int(n))
		if err != nil {
			return err
		}
		defer e.pool.put(tmp)
		into, at = tmp, 0
	}
	// The data shards the range covers, each read with RDMA_READ.
	var failed bool
	for done := int64(0); done < n; {
		x := so + done
		shard, soff := int(x/lay.unit), x%lay.unit
		l := min(n-done, lay.unit-soff)
		if shard >= len(si.Shards) {
			return fmt.Errorf("fileio: stripe %d of inode %d has %d shards: %w", si.Stripe, ino, len(si.Shards), syscall.EIO)
		}
		sh := si.Shards[shard]
		err := e.readShard(ctx, sh, chunk.Key{Chunk: sh.ChunkId, Version: si.Version}, int(soff), into.sgl(at+int(done), int(l)))
		if err != nil {
			e.log.Warn("fileio: shard read failed, reconstructing", "ino", ino, "stripe", si.Stripe, "shard", shard, "server", sh.Address, "err", err)
			failed = true
			break
		}
		done += l
	}
	if !failed {
		copy(dst, into.b[at:at+int(n)]) // a no-op when dst is into's
		return nil
	}
	// A merge read (into != nil) runs under the file lock: its degraded
	// read takes memory only if some is free now.
	wait := into == nil
	data, release, err := e.readStripeDegraded(ctx, ino, lay, si, wait)
	if err != nil {
		// Repair may have moved shards since the placement was cached:
		// look it up again and, if it changed, read from the new one.
		fresh, ferr := e.refreshStripe(ctx, ino, si)
		if ferr != nil || fresh == nil {
			return err
		}
		if data, release, err = e.readStripeDegraded(ctx, ino, lay, fresh, wait); err != nil {
			return err
		}
	}
	defer release()
	copy(dst, data[so:so+n])
	return nil
}

// readShard RDMA_READs [off, ...) of shard sh's version key into sgl. It
// fails at once for a chunkserver this mount suspects; one that fails (or
// goes silent: its connection's stall timeout) becomes suspect.
func (e *Engine) readShard(ctx context.Context, sh *metapb.Shard, key chunk.Key, off int, sgl []rdma.SGE) error {
	c, p, err := e.conns.get(ctx, sh.ServerId, sh.Address)
	if err != nil {
		return err
	}
	if _, err := c.ReadAt(ctx, key, off, sgl); err != nil {
		e.conns.failed(ctx, p, err)
		return err
	}
	e.conns.succeeded(p)
	return nil
}

// refreshStripe fetches the committed state of si's stripe again. It returns
// the new state, also cached, when it differs from si (repair moved shards,
// or a writer committed a new version), or nil when nothing changed.
func (e *Engine) refreshStripe(ctx context.Context, ino uint64, si *metapb.StripeInfo) (*metapb.StripeInfo, error) {
	r, err := e.cfg.Meta.GetStripes(ctx, &metapb.GetStripesRequest{Ino: ino, First: si.Stripe, Count: 1})
	if err != nil {
		return nil, err
	}
	if len(r.Stripes) != 1 || r.Stripes[0].Stripe != si.Stripe {
		return nil, nil
	}
	fresh := r.Stripes[0]
	if fresh.Version == si.Version && metapb.SameShards(fresh.Shards, si.Shards) {
		return nil, nil
	}
	// Cache it for later reads. Not here: the caller may hold the file's lock
	// (a partial overwrite merging with committed data reads under it).
	go func() {
		f := e.file(ino)
		f.mu.Lock()
		if f.stripes[si.Stripe] == si {
			f.stripes[si.Stripe] = fresh
		}
		f.mu.Unlock()
	}()
	if fresh.Version != si.Version && fresh.Length < si.Length {
		return nil, nil // rewritten shorter meanwhile: let the caller fail and retry
	}
	return fresh, nil
}

// readStripeDegraded reads every shard it can reach of a committed stripe and
// rebuilds the data from any k of them. It returns the stripe's data bytes
// (k*unit laid out shard after shard) and a function releasing the buffer.
// Without wait it fails with errNoBuffer when the buffer memory is short
// instead of waiting for some.
func (e *Engine) readStripeDegraded(ctx context.Context, ino uint64, lay layout, si *metapb.StripeInfo, wait bool) ([]byte, func(), error) {
	n := lay.k + lay.m
	if len(si.Shards) != n {
		return nil, nil, fmt.Errorf("fileio: stripe %d has %d shards, layout %d+%d: %w", si.Stripe, len(si.Shards), lay.k, lay.m, syscall.EIO)
	}
	sl := lay.shardLen(int64(si.Length))
	unit := int(lay.unit)
	var buf *buffer
	var err error
	if wait {
		buf, err = e.pool.get(ctx, lay.bufSize())
	} else if buf = e.pool.tryGet(lay.bufSize()); buf == nil {
		err = errNoBuffer
	}
	if err != nil {
		return nil, nil, err
	}
	release := func() { e.pool.put(buf) }
	shards := make([][]byte, n)
	type result struct {
		i   int
		err error
	}
	results := make(chan result, n)
	for i, sh := range si.Shards {
		go func() {
			err := e.readShard(ctx, sh, chunk.Key{Chunk: sh.ChunkId, Version: si.Version}, 0, []rdma.SGE{buf.sge(i*unit, int(sl))})
			results <- result{i, err}
		}()
	}
	ok := 0
	var lastErr error
	for range n {
		r := <-results
		if r.err != nil {
			lastErr = r.err
			continue
		}
		shards[r.i] = buf.b[r.i*unit : r.i*unit+int(sl)]
		ok++
	}
	if ok < lay.k {
		release()
		return nil, nil, fmt.Errorf("fileio: stripe %d of inode %d: %d of %d shards readable, %d needed (last error: %v): %w",
			si.Stripe, ino, ok, n, lay.k, lastErr, syscall.EIO)
	}
	if ok < n {
		e.stats.DegradedReads.Add(1)
		if lay.k == 1 {
			for _, s := range shards {
				if s != nil {
					copy(buf.b[:sl], s)
					break
				}
			}
		} else {
			enc, err := e.codec(lay.k, lay.m)
			if err != nil {
				release()
				return nil, nil, err
			}
			// Missing data shards are rebuilt in place: give them their slot
			// with zero length and the capacity of the shard.
			for i := 0; i < lay.k; i++ {
				if shards[i] == nil {
					shards[i] = buf.b[i*unit : i*unit : i*unit+int(sl)]
				}
			}
			if err := enc.ReconstructData(shards); err != nil {
				release()
				return nil, nil, fmt.Errorf("fileio: reconstruct stripe %d of inode %d: %w", si.Stripe, ino, err)
			}
		}
	}
	// Data shards hold sl bytes each at their unit offset; zero the rest so the
	// stripe reads as laid out in the file.
	for i := 0; i < lay.k; i++ {
		clear(buf.b[i*unit+int(sl) : (i+1)*unit])
	}
	return buf.b[:lay.k*unit], release, nil
}

// flushTimeout bounds one background flush: its writes and commits outlive
// the request that started them.
const flushTimeout = 2 * time.Minute

// Write implements fs.Data. A stripe whose bytes have all been written starts
// flushing at once in the background while the writer goes on (write-behind).
func (e *Engine) Write(ctx context.Context, ino uint64, p []byte, off int64) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	f := e.file(ino)
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := e.fetch(ctx, f, 0, 0); err != nil {
		return 0, err
	}
	ss := f.lay.stripeSize()
	end := off + int64(len(p))
	for s := uint64(off / ss); int64(s)*ss < end; s++ {
		lo, hi := max(off, int64(s)*ss), min(end, int64(s+1)*ss)
		so, sh := lo-int64(s)*ss, hi-int64(s)*ss
		d, err := e.dirtyStripe(ctx, f, s, so, sh)
		if err != nil {
			return int(max(lo-off, 0)), err
		}
		if d.buf == nil {
			grew := e.addSparse(d, so, p[lo-off:hi-off])
			f.bufBytes += grew
			f.sparse += grew
			e.sparseTotal.Add(int64(grew))
			if int64(d.sparseBytes()) >= ss/4 {
				if buf := e.pool.tryGet(f.lay.bufSize()); buf != nil {
					e.materialize(f, d, buf)
				}
			}
		} else {
			d.zeroTo(so)
			copy(d.buf.b[so:], p[lo-off:hi-off])
			d.clean = max(d.clean, sh)
		}
		d.length = max(d.length, sh)
		d.addExtent(so, sh)
		if d.covers(ss) {
			e.startFlush(f, []uint64{s})
		}
	}
	f.size = max(f.size, end)
	// Whole-stripe buffers are bounded by the file's dirty limit; a random
	// writer's sparse writes (heap memory, not buffer memory) by half of
	// the engine's memory, for all files together and for one: the more
	// writes a stripe gathers, the fewer times it is rewritten.
	for f.bufBytes-f.sparse > e.cfg.FileDirtyLimit || f.sparse > e.cfg.MemBytes/2 || e.sparseTotal.Load() > int64(e.cfg.MemBytes)/2 {
		// A flush that failed for good is reported here too (and again
		// by the next Flush): a writer ahead of a failing cluster must
		// not wait for one flush after another.
		if isWriteFailed(f.err) {
			return len(p), f.err
		}
		// Wait for the flushes in progress before flushing stripes still
		// being written: a stripe flushed half written is written again
		// (and its first half read back) once the writer fills it. A
		// sequential writer ahead of the disk rewrote one stripe in ten so.
		if len(f.flushing) == 0 {
			if len(f.dirty) > 0 {
				e.startFlush(f, keys(f.dirty))
			}
			if len(f.flushing) == 0 && f.err == nil && len(f.dirty) > 0 {
				// Sparse stripes that found no buffer memory: wait for some.
				if err := e.waitForMemory(ctx, f); err != nil {
					return len(p), err
				}
				continue
			}
			if len(f.flushing) == 0 {
				break // nothing could start: f.err says why, the next Flush reports it
			}
		}
		if err := f.wait(ctx); err != nil {
			return len(p), err // the data stays dirty; an interrupted writer need not wait
		}
	}
	return len(p), nil
}

// wait waits on f.cond until a flush ends or ctx ends, and returns ctx's
// error then. The caller holds f.mu.
func (f *file) wait(ctx context.Context) error {
	if ctx.Done() == nil {
		f.cond.Wait()
		return nil
	}
	stop := context.AfterFunc(ctx, func() {
		f.mu.Lock()
		f.cond.Broadcast()
		f.mu.Unlock()
	})
	f.cond.Wait()
	stop()
	return ctx.Err()
}

func keys(m map[uint64]*dirtyStripe) []uint64 {
	ks := make([]uint64, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// dirtyStripe returns the dirty buffer of stripe s, creating it — with the
// committed data read in unless [lo, hi) covers all of it — when there is none.
// It waits for a flush of s in progress. The caller holds f.mu.
func (e *Engine) dirtyStripe(ctx context.Context, f *file, s uint64, lo, hi int64) (*dirtyStripe, error) {
	for {
		for f.flushing[s] != nil {
			if err := f.wait(ctx); err != nil {
				return nil, err
			}
		}
		if d := f.dirty[s]; d != nil {
			return d, nil
		}
		if err := e.fetch(ctx, f, s, 1); err != nil {
			return nil, err
		}
		// Sparse unless the write is where a sequential writer begins a
		// stripe (its start, or the end of its committed data) or large.
		si := f.stripes[s]
		sparse := lo > 0 && hi-lo <= slabSize && (si == nil || lo != int64(si.Length))
		var buf *buffer
		if !sparse {
			b, err := e.getBuffer(ctx, f, f.lay.bufSize())
			if err != nil {
				return nil, err
			}
			if f.dirty[s] != nil || f.flushing[s] != nil {
				e.pool.put(b) // someone else made it while we waited for memory
				continue
			}
			buf, si = b, f.stripes[s]
		}
		if pf := f.cache[s]; pf != nil {
			e.dropLocked(pf)
		}
		d := &dirtyStripe{buf: buf, dataLen: f.lay.stripeSize()}
		if si != nil {
			d.base, d.length = si.Version, int64(si.Length)
			if lo > 0 || hi < int64(si.Length) {
				d.committed, d.fillEnd = si, int64(si.Length)
			}
		}
		f.dirty[s] = d
		if buf != nil {
			f.bufBytes += len(buf.b)
		} else {
			e.stats.SparseStripes.Add(1)
		}
		return d, nil
	}
}

// fill reads the committed bytes of d that the writes have not covered into
// its buffer, once. The caller holds f.mu and owns d (dirty, not flushing).
func (e *Engine) fill(ctx context.Context, f *file, d *dirtyStripe) error {
	if d.buf == nil {
		buf := e.pool.tryGet(f.lay.bufSize())
		if buf == nil {
			return errNoBuffer
		}
		e.materialize(f, d, buf)
	}
	d.zero()
	if d.committed == nil {
		return nil
	}
	read := false
	err := d.gaps(d.fillEnd, func(lo, hi int64) error {
		read = true
		return e.readCommittedTo(ctx, f.ino, f.lay, d.committed, lo, d.buf.b[lo:hi], d.buf, int(lo))
	})
	if err != nil {
		return fmt.Errorf("fileio: read stripe %d of inode %d to merge a partial write: %w", d.committed.Stripe, f.ino, err)
	}
	d.committed = nil
	if read {
		e.stats.MergeReads.Add(1)
	}
	return nil
}

// getBuffer takes buffer memory. When the pool is short it waits for the
// file's flushes in progress, else flushes the file's dirty stripes and waits
// for them, and only then waits for other files' flushes with f.mu released,
// so no writer ever waits for memory it holds itself.
// The caller holds f.mu.
func (e *Engine) getBuffer(ctx context.Context, f *file, n int) (*buffer, error) {
	for {
		if b := e.pool.tryGet(n); b != nil {
			return b, nil
		}
		if isWriteFailed(f.err) {
			return nil, f.err
		}
		switch {
		case len(f.flushing) > 0:
			// Flushes in progress free memory; flushing the stripes still
			// being written would have them written twice (see Write).
			if err := f.wait(ctx); err != nil {
				return nil, err
			}
		case len(f.dirty) > 0:
			e.startFlush(f, keys(f.dirty))
			if len(f.flushing) == 0 && f.err != nil {
				err := f.err
				f.err = nil
				return nil, err
			}
			if len(f.flushing) == 0 {
				// Sparse stripes that found no memory either: wait for
				// memory without the lock, as below.
				return e.getBufferUnlocked(ctx, f, n)
			}
			if err := f.wait(ctx); err != nil {
				return nil, err
			}
		default:
			return e.getBufferUnlocked(ctx, f, n)
		}
	}
}

// getBufferUnlocked waits for n bytes of buffer memory with f.mu released,
// after starting flushes of other files' whole stripes (nothing else would
// free their memory while their writers are idle) and dropping this
// engine's read-ahead. The caller holds f.mu.
func (e *Engine) getBufferUnlocked(ctx context.Context, f *file, n int) (*buffer, error) {
	for {
		if b := e.pool.tryGet(n); b != nil {
			return b, nil
		}
		if !e.evictOldest(f) {
			break
		}
	}
	e.flushOthers(f)
	f.mu.Unlock()
	b, err := e.pool.get(ctx, n)
	f.mu.Lock()
	return b, err
}

// flushOthers starts flushing the dirty whole stripes of files other than
// f that have no flush in progress and whose lock is free now. The caller
// holds f.mu.
func (e *Engine) flushOthers(f *file) {
	e.mu.Lock()
	others := make([]*file, 0, len(e.files))
	for _, g := range e.files {
		if g != f {
			others = append(others, g)
		}
	}
	e.mu.Unlock()
	for _, g := range others {
		if !g.mu.TryLock() {
			continue
		}
		if len(g.flushing) == 0 {
			var whole []uint64
			for s, d := range g.dirty {
				if d.buf != nil {
					whole = append(whole, s)
				}
			}
			if len(whole) > 0 {
				slices.Sort(whole)
				e.startFlush(g, whole)
			}
		}
		g.mu.Unlock()
	}
}

// startFlush moves stripes from dirty to flushing and writes and commits them
// in the background. The caller holds f.mu.
func (e *Engine) startFlush(f *file, stripes []uint64) {
	ctx, cancel := context.WithTimeout(context.Background(), flushTimeout)
	defer cancel()
	ready := stripes[:0:0]
	for _, s := range stripes {
		d := f.dirty[s]
		if d == nil {
			continue
		}
		if d.delta = e.planDelta(f, s, d); d.delta != nil {
			ready = append(ready, s)
			continue
		}
		err := e.fill(ctx, f, d)
		if err != nil && !errors.Is(err, errNoBuffer) && e.rebaseIfMoved(ctx, f, s) {
			err = e.fill(ctx, f, d) // rebase keeps d, on the newest version
		}
		switch {
		case errors.Is(err, errNoBuffer):
			continue // stays dirty until memory frees up
		case err != nil:
			f.err = err // the stripe stays dirty: a later flush tries again
			continue
		}
		ready = append(ready, s)
	}
	stripes = ready
	if len(stripes) == 0 {
		return
	}
	batch := make([]*dirtyStripe, 0, len(stripes))
	for _, s := range stripes {
		d := f.dirty[s]
		delete(f.dirty, s)
		f.flushing[s] = d
		batch = append(batch, d)
	}
	lay := f.lay
	// A file that stays within the layout's inline size commits its one
	// stripe into metadata.
	inline := lay.inline > 0 && len(stripes) == 1 && stripes[0] == 0 &&
		f.size >= 0 && f.size <= lay.inline && batch[0].length <= lay.inline
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), flushTimeout)
		defer cancel()
		var infos []*metapb.StripeInfo
		var err error
		if inline {
			infos, err = e.commitInline(ctx, f.ino, batch[0])
		} else {
			infos, err = e.writeStripes(ctx, f.ino, lay, stripes, batch)
		}
		var df *deltaFailed
		if err != nil && metaclient.ConflictStripes(err) == nil && !errors.As(err, &df) {
			// writeStripes has waited and retried what can pass (chunkservers
			// down, replacements, meta failover): what is left is final.
			err = failWrite(err)
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		defer f.cond.Broadcast()
		failed := isWriteFailed(err)
		for i, s := range stripes {
			delete(f.flushing, s)
			d := batch[i]
			switch {
			case err == nil:
				f.stripes[s] = infos[i]
				fallthrough
			case failed:
				// Written, or failed for good: a failed write-back's
				// data is dropped once its error is reported, as on a
				// local file system, so a failing cluster does not pin
				// the mount's memory.
				e.dropDirty(f, d)
			default:
				if df != nil && d.delta != nil {
					d.noDelta = true
				}
				e.dropDelta(f, d)
				f.dirty[s] = d // kept for the next attempt
			}
		}
		if err == nil {
			return
		}
		if df != nil {
			e.log.Info("fileio: partial-stripe write failed, rewriting the stripes whole", "ino", f.ino, "stripes", len(stripes), "err", err)
			e.startFlush(f, stripes)
			return
		}
		if failed {
			e.log.Error("fileio: write failed, data not written", "ino", f.ino, "stripes", len(stripes), "err", err)
			clear(f.stripes) // the size and stripes this writer assumed did not commit
			f.known = false
			f.size = -1
			f.err = err
			return
		}
		if conflicts := metaclient.ConflictStripes(err); len(conflicts) > 0 {
			if rerr := e.rebase(ctx, f, conflicts); rerr != nil {
				f.err = rerr
				return
			}
			e.startFlush(f, conflicts)
			return
		}
		f.err = err
	}()
}

// Flush implements fs.Data: it flushes every dirty stripe of ino, waits for all
// flushes in progress, and reports the first failure since the last Flush. A
// flush that lost the version compare-and-set to another writer is rebased
// and tried again; any other failure is final once writeStripes has waited
// and retried what can pass (EIO, or ENOSPC), and its data is dropped. When ctx
// ends (the caller is being killed) Flush returns its error at once and the
// flushes in progress go on.
func (e *Engine) Flush(ctx context.Context, ino uint64) error {
	f := e.file(ino)
	f.mu.Lock()
	defer f.mu.Unlock()
	return e.flushLocked(ctx, f)
}

func (e *Engine) flushLocked(ctx context.Context, f *file) error {
	// Sparse stripes flush as buffer memory allows, some per round: a round
	// that flushed some is progress, bounded by the stripes there were.
	progress := len(f.dirty)
	for attempt := 0; ; attempt++ {
		started := 0
		if len(f.dirty) > 0 {
			before := len(f.flushing)
			e.startFlush(f, keys(f.dirty))
			started = len(f.flushing) - before
		}
		for len(f.flushing) > 0 {
			if err := f.wait(ctx); err != nil {
				return err
			}
		}
		err := f.err
		f.err = nil
		if err == nil && len(f.dirty) == 0 {
			return nil
		}
		if err == nil && started == 0 {
			// No stripe got buffer memory (other files hold it): wait for
			// some; that is no failed attempt.
			if err := e.waitForMemory(ctx, f); err != nil {
				return err
			}
			attempt--
			continue
		}
		if err == nil && progress > 0 {
			progress-- // some stripes flushed, the others go next round
			attempt--
			continue
		}
		if attempt == 2 || isWriteFailed(err) {
			if err == nil {
				err = fmt.Errorf("fileio: inode %d: stripes kept changing under the writer: %w", f.ino, syscall.EIO)
			}
			return err
		}
	}
}

// waitForMemory waits, with f.mu released, until a whole stripe's buffer
// is free. The caller holds f.mu.
func (e *Engine) waitForMemory(ctx context.Context, f *file) error {
	b, err := e.getBufferUnlocked(ctx, f, f.lay.bufSize())
	e.pool.put(b)
	return err
}

// FlushAll flushes every file with dirty data (before an unmount); it returns
// the first error and goes on with the other files.
func (e *Engine) FlushAll(ctx context.Context) error {
	e.mu.Lock()
	files := make([]*file, 0, len(e.files))
	for _, f := range e.files {
		files = append(files, f)
	}
	e.mu.Unlock()
	var first error
	for _, f := range files {
		f.mu.Lock()
		err := e.flushLocked(ctx, f)
		f.mu.Unlock()
		if err != nil && first == nil {
			first = fmt.Errorf("fileio: flush inode %d: %w", f.ino, err)
		}
	}
	return first
}

// Truncate implements fs.Data: flushes in progress finish, and dirty data past
// size is dropped.
func (e *Engine) Truncate(ctx context.Context, ino uint64, size uint64) error {
	f := e.file(ino)
	f.mu.Lock()
	defer f.mu.Unlock()
	for len(f.flushing) > 0 {
		if err := f.wait(ctx); err != nil {
			return err
		}
	}
	e.dropCacheLocked(f)
	if f.readahead != nil {
		f.readahead.Reset()
	}
	f.known = false
	f.capped, f.sizeCap = true, int64(size)
	if f.lay.k == 0 {
		clear(f.stripes)
		f.size = -1
		return nil
	}
	ss := f.lay.stripeSize()
	for s, d := range f.dirty {
		start := int64(s) * ss
		switch {
		case start >= int64(size):
			e.dropDirty(f, d)
			delete(f.dirty, s)
		case start+d.length > int64(size):
			cut := int64(size) - start
			if d.buf != nil {
				clear(d.buf.b[cut:d.length])
			} else {
				d.truncateSparse(cut)
			}
			d.length = cut
			d.truncate(cut)
		}
	}
	clear(f.stripes)
	f.size = -1
	return nil
}

// Truncated implements fs.Data: meta has applied (or refused) the size a
// Truncate prepared for, so sizes read from it are current again. What reads
// fetched meanwhile may be from before the new size (a stripe's old length,
// its old bytes): it is dropped and fetched again.
func (e *Engine) Truncated(ino uint64) {
	f := e.file(ino)
	f.mu.Lock()
	f.capped = false
	e.dropCacheLocked(f)
	clear(f.stripes)
	f.known = false
	f.size = -1
	f.mu.Unlock()
}

// rebaseIfMoved rebases dirty stripe s when the committed version it was to be
// merged with has been superseded (its chunks may be gone already); it reports
// whether it did. The caller holds f.mu.
func (e *Engine) rebaseIfMoved(ctx context.Context, f *file, s uint64) bool {
	d := f.dirty[s]
	if d == nil || d.committed == nil {
		return false
	}
	delete(f.stripes, s)
	f.known = false
	if err := e.fetch(ctx, f, s, 1); err != nil {
		return false
	}
	if si := f.stripes[s]; si != nil && si.Version == d.committed.Version {
		return false
	}
	return e.rebase(ctx, f, []uint64{s}) == nil
}

// rebase rebuilds conflicting dirty stripes on their newest committed versions:
// the writer's ranges stay, in the same buffer (or slabs), and the rest is to
// be read from the new version. It takes no memory. The caller holds f.mu.
func (e *Engine) rebase(ctx context.Context, f *file, conflicts []uint64) error {
	for _, s := range conflicts {
		d := f.dirty[s]
		if d == nil {
			continue
		}
		delete(f.stripes, s)
		f.known = false
		if err := e.fetch(ctx, f, s, 1); err != nil {
			return err
		}
		if d.buf != nil {
			// What is not written holds the old version's bytes: clear it.
			d.zero()
			d.gaps(d.dataLen, func(lo, hi int64) error {
				clear(d.buf.b[lo:hi])
				return nil
			})
		}
		d.base, d.committed, d.fillEnd = 0, nil, 0
		if si := f.stripes[s]; si != nil {
			d.base, d.committed, d.fillEnd = si.Version, si, int64(si.Length)
			d.length = max(d.length, int64(si.Length))
		}
	}
	return nil
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
