// Package fileio is the FUSE client's file I/O engine: it implements fs.Data
// over the metadata service (stripe maps, write grants, commits) and the
// chunkservers (one-sided RDMA reads and writes of shards).
//
// Writes land in stripe buffers carved from one registered memory region; a
// partly overwritten stripe that holds committed data is read in first. Flush
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

	"github.com/klauspost/reedsolomon"

	"github.com/rdmafs/rdmafs/chunkserver/chunk"
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
	Logger         *slog.Logger
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

	stats Stats
}

// Stats count what the engine did.
type Stats struct {
	// DegradedReads counts stripes read with shards missing, rebuilt from the
	// survivors.
	DegradedReads atomic.Int64
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
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
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
	e.conns = &conns{dev: cfg.Device, pd: pd, secret: cfg.Secret, m: map[string]*peer{}}
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

// file is the engine's state of one inode.
type file struct {
	mu      sync.Mutex
	ino     uint64
	k, m    int
	unit    int64
	size    int64                         // committed size as last seen, grown by local writes
	stripes map[uint64]*metapb.StripeInfo // committed stripes as last seen; nil value: none
	dirty   map[uint64]*dirtyStripe
	dirtyN  int // bytes of buffers held by dirty stripes
}

// dirtyStripe is a stripe being rewritten: data shards then parity in one
// registered buffer, built on base (the committed version, 0 for none).
type dirtyStripe struct {
	buf     *buffer
	base    uint64
	length  int64      // bytes of file data in the stripe
	extents [][2]int64 // ranges written, for reapplying after a conflict
}

func (e *Engine) file(ino uint64) *file {
	e.mu.Lock()
	defer e.mu.Unlock()
	f := e.files[ino]
	if f == nil {
		f = &file{ino: ino, stripes: map[uint64]*metapb.StripeInfo{}, dirty: map[uint64]*dirtyStripe{}, size: -1}
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
	if len(f.dirty) == 0 {
		f.size = -1
	}
	return nil
}

// stripeSize returns the bytes of file data a stripe holds.
func (f *file) stripeSize() int64 { return int64(f.k) * f.unit }

// fetch loads the layout, size and the committed state of stripes
// [first, first+count) that are not cached.
func (e *Engine) fetch(ctx context.Context, f *file, first, count uint64) error {
	if f.size >= 0 && f.k > 0 {
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
	r, err := e.cfg.Meta.GetStripes(ctx, &metapb.GetStripesRequest{Ino: f.ino, First: first, Count: count})
	if err != nil {
		return err
	}
	if l := r.Layout; l != nil && l.K > 0 {
		f.k, f.m, f.unit = int(l.K), int(l.M), int64(l.Unit)
	}
	if f.k == 0 || f.unit == 0 {
		return fmt.Errorf("fileio: inode %d has no layout: %w", f.ino, syscall.EIO)
	}
	size := int64(r.Size)
	for s, d := range f.dirty {
		size = max(size, int64(s)*f.stripeSize()+d.length)
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

// Read implements fs.Data.
func (e *Engine) Read(ctx context.Context, ino uint64, p []byte, off int64) (int, error) {
	f := e.file(ino)
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(p) == 0 {
		return 0, nil
	}
	if err := e.fetch(ctx, f, 0, 0); err != nil {
		return 0, err
	}
	ss := f.stripeSize()
	end := min(off+int64(len(p)), f.size)
	if off >= end {
		return 0, nil
	}
	first, last := uint64(off/ss), uint64((end-1)/ss)
	if err := e.fetch(ctx, f, first, last-first+1); err != nil {
		return 0, err
	}
	end = min(end, f.size)
	for s := first; s <= last; s++ {
		lo, hi := max(off, int64(s)*ss), min(end, int64(s+1)*ss)
		dst := p[lo-off : hi-off]
		so := lo - int64(s)*ss
		if d := f.dirty[s]; d != nil {
			copy(dst, d.buf.b[so:so+int64(len(dst))])
			continue
		}
		if err := e.readCommitted(ctx, f, f.stripes[s], so, dst); err != nil {
			return 0, err
		}
	}
	return int(end - off), nil
}

// readCommitted reads [so, so+len(dst)) of a committed stripe into dst; bytes
// past its length, and stripes never written, read as zeros.
func (e *Engine) readCommitted(ctx context.Context, f *file, si *metapb.StripeInfo, so int64, dst []byte) error {
	clear(dst)
	if si == nil || so >= int64(si.Length) {
		return nil
	}
	n := min(int64(len(dst)), int64(si.Length)-so)
	tmp, err := e.pool.get(ctx, int(n))
	if err != nil {
		return err
	}
	defer e.pool.put(tmp)
	// The data shards the range covers, each read with RDMA_READ into tmp.
	var failed bool
	for done := int64(0); done < n; {
		x := so + done
		shard, soff := int(x/f.unit), x%f.unit
		l := min(n-done, f.unit-soff)
		if shard >= len(si.Shards) {
			return fmt.Errorf("fileio: stripe %d of inode %d has %d shards: %w", si.Stripe, f.ino, len(si.Shards), syscall.EIO)
		}
		sh := si.Shards[shard]
		c, err := e.conns.get(ctx, sh.Address)
		if err == nil {
			_, err = c.ReadAt(ctx, chunk.Key{Chunk: sh.ChunkId, Version: si.Version}, int(soff), []rdma.SGE{tmp.sge(int(done), int(l))})
		}
		if err != nil {
			e.log.Warn("fileio: shard read failed, reconstructing", "ino", f.ino, "stripe", si.Stripe, "shard", shard, "server", sh.Address, "err", err)
			failed = true
			break
		}
		done += l
	}
	if !failed {
		copy(dst, tmp.b[:n])
		return nil
	}
	data, release, err := e.readStripeDegraded(ctx, f, si)
	if err != nil {
		return err
	}
	defer release()
	copy(dst, data[so:so+n])
	return nil
}

// shardLen returns the length of every shard of a stripe holding length bytes.
func (f *file) shardLen(length int64) int64 {
	l := min(length, f.unit)
	return (l + 4095) / 4096 * 4096
}

// readStripeDegraded reads every shard it can reach of a committed stripe and
// rebuilds the data from any k of them. It returns the stripe's data bytes
// (k*unit laid out shard after shard) and a function releasing the buffer.
func (e *Engine) readStripeDegraded(ctx context.Context, f *file, si *metapb.StripeInfo) ([]byte, func(), error) {
	n := f.k + f.m
	if len(si.Shards) != n {
		return nil, nil, fmt.Errorf("fileio: stripe %d has %d shards, layout %d+%d: %w", si.Stripe, len(si.Shards), f.k, f.m, syscall.EIO)
	}
	sl := f.shardLen(int64(si.Length))
	buf, err := e.pool.get(ctx, n*int(f.unit))
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
			c, err := e.conns.get(ctx, sh.Address)
			if err == nil {
				_, err = c.ReadAt(ctx, chunk.Key{Chunk: sh.ChunkId, Version: si.Version}, 0, []rdma.SGE{buf.sge(i*int(f.unit), int(sl))})
			}
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
		shards[r.i] = buf.b[r.i*int(f.unit) : r.i*int(f.unit)+int(sl)]
		ok++
	}
	if ok < f.k {
		release()
		return nil, nil, fmt.Errorf("fileio: stripe %d of inode %d: %d of %d shards readable, %d needed (last error: %v): %w",
			si.Stripe, f.ino, ok, n, f.k, lastErr, syscall.EIO)
	}
	if ok < n {
		e.stats.DegradedReads.Add(1)
		if f.k == 1 {
			for _, s := range shards {
				if s != nil {
					copy(buf.b[:sl], s)
					break
				}
			}
		} else {
			enc, err := e.codec(f.k, f.m)
			if err != nil {
				release()
				return nil, nil, err
			}
			// Missing data shards are rebuilt in place: give them their slot
			// with zero length and the capacity of the shard.
			for i := 0; i < f.k; i++ {
				if shards[i] == nil {
					shards[i] = buf.b[i*int(f.unit) : i*int(f.unit) : i*int(f.unit)+int(sl)]
				}
			}
			if err := enc.ReconstructData(shards); err != nil {
				release()
				return nil, nil, fmt.Errorf("fileio: reconstruct stripe %d of inode %d: %w", si.Stripe, f.ino, err)
			}
		}
	}
	// Data shards hold sl bytes each at their unit offset; zero the rest so the
	// stripe reads as laid out in the file.
	for i := 0; i < f.k; i++ {
		clear(buf.b[i*int(f.unit)+int(sl) : (i+1)*int(f.unit)])
	}
	return buf.b[:f.k*int(f.unit)], release, nil
}

// errConflict marks a stripe committed by someone else meanwhile.
var errConflict = errors.New("stripe changed under the writer")

// Write implements fs.Data.
func (e *Engine) Write(ctx context.Context, ino uint64, p []byte, off int64) (int, error) {
	f := e.file(ino)
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(p) == 0 {
		return 0, nil
	}
	if err := e.fetch(ctx, f, 0, 0); err != nil {
		return 0, err
	}
	ss := f.stripeSize()
	end := off + int64(len(p))
	for s := uint64(off / ss); int64(s)*ss < end; s++ {
		lo, hi := max(off, int64(s)*ss), min(end, int64(s+1)*ss)
		d, err := e.dirtyStripe(ctx, f, s, lo-int64(s)*ss, hi-int64(s)*ss)
		if err != nil {
			return int(max(lo-off, 0)), err
		}
		so := lo - int64(s)*ss
		copy(d.buf.b[so:], p[lo-off:hi-off])
		d.length = max(d.length, hi-int64(s)*ss)
		d.extents = append(d.extents, [2]int64{so, hi - int64(s)*ss})
	}
	f.size = max(f.size, end)
	if f.dirtyN > e.cfg.FileDirtyLimit {
		if err := e.flush(ctx, f); err != nil {
			return len(p), err
		}
	}
	return len(p), nil
}

// dirtyStripe returns the dirty buffer of stripe s, creating it — with the
// committed data read in unless [lo, hi) covers all of it — when there is none.
func (e *Engine) dirtyStripe(ctx context.Context, f *file, s uint64, lo, hi int64) (*dirtyStripe, error) {
	if d := f.dirty[s]; d != nil {
		return d, nil
	}
	if err := e.fetch(ctx, f, s, 1); err != nil {
		return nil, err
	}
	size := (f.k + f.m) * int(f.unit)
	buf, err := e.getBuffer(ctx, f, size)
	if err != nil {
		return nil, err
	}
	d := &dirtyStripe{buf: buf}
	clear(buf.b[:f.k*int(f.unit)])
	if si := f.stripes[s]; si != nil {
		d.base, d.length = si.Version, int64(si.Length)
		if lo > 0 || hi < int64(si.Length) {
			if err := e.readCommitted(ctx, f, si, 0, buf.b[:si.Length]); err != nil {
				e.pool.put(buf)
				return nil, err
			}
		}
	}
	f.dirty[s] = d
	f.dirtyN += size
	return d, nil
}

// getBuffer takes buffer memory; when the pool is short it first flushes the
// file's own dirty stripes, so a writer never waits while holding memory.
func (e *Engine) getBuffer(ctx context.Context, f *file, n int) (*buffer, error) {
	short, cancel := context.WithCancel(ctx)
	cancel() // a cancelled context: get returns at once when it would wait
	if b, err := e.pool.get(short, n); err == nil {
		return b, nil
	}
	if len(f.dirty) > 0 {
		if err := e.flush(ctx, f); err != nil {
			return nil, err
		}
	}
	return e.pool.get(ctx, n)
}

// Flush implements fs.Data.
func (e *Engine) Flush(ctx context.Context, ino uint64) error {
	f := e.file(ino)
	f.mu.Lock()
	defer f.mu.Unlock()
	return e.flush(ctx, f)
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
		err := e.flush(ctx, f)
		f.mu.Unlock()
		if err != nil && first == nil {
			first = fmt.Errorf("fileio: flush inode %d: %w", f.ino, err)
		}
	}
	return first
}

// Truncate implements fs.Data: dirty data past size is dropped.
func (e *Engine) Truncate(ctx context.Context, ino uint64, size uint64) error {
	f := e.file(ino)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.k == 0 {
		clear(f.stripes)
		f.size = -1
		return nil
	}
	ss := f.stripeSize()
	for s, d := range f.dirty {
		start := int64(s) * ss
		switch {
		case start >= int64(size):
			e.pool.put(d.buf)
			f.dirtyN -= len(d.buf.b)
			delete(f.dirty, s)
		case start+d.length > int64(size):
			cut := int64(size) - start
			clear(d.buf.b[cut:d.length])
			d.length = cut
			d.extents = append(d.extents, [2]int64{cut, cut}) // the cut is a change too
		}
	}
	clear(f.stripes)
	f.size = -1
	return nil
}

// flush writes every dirty stripe of f and commits them together.
func (e *Engine) flush(ctx context.Context, f *file) error {
	for attempt := 0; len(f.dirty) > 0; attempt++ {
		if attempt == 8 {
			return fmt.Errorf("fileio: inode %d: stripes kept changing under the writer: %w", f.ino, syscall.EIO)
		}
		err := e.writeStripes(ctx, f)
		if err == nil {
			return nil
		}
		conflicts := metaclient.ConflictStripes(err)
		if len(conflicts) == 0 {
			return err
		}
		if err := e.rebase(ctx, f, conflicts); err != nil {
			return err
		}
	}
	return nil
}

// writeStripes encodes, writes and commits all dirty stripes of f.
func (e *Engine) writeStripes(ctx context.Context, f *file) error {
	stripes := make([]uint64, 0, len(f.dirty))
	for s := range f.dirty {
		stripes = append(stripes, s)
	}
	slices.Sort(stripes)
	enc, err := e.codec(f.k, f.m)
	if err != nil {
		return err
	}
	unit := int(f.unit)
	for _, s := range stripes {
		d := f.dirty[s]
		sl := int(f.shardLen(d.length))
		shards := make([][]byte, f.k+f.m)
		for i := range shards {
			shards[i] = d.buf.b[i*unit : i*unit+sl]
		}
		if f.m > 0 {
			if f.k == 1 {
				for i := 1; i < len(shards); i++ {
					copy(shards[i], shards[0])
				}
			} else if err := enc.Encode(shards); err != nil {
				return fmt.Errorf("fileio: encode stripe %d: %w", s, err)
			}
		}
	}
	g, err := e.cfg.Meta.GrantWrite(ctx, &metapb.GrantWriteRequest{Ino: f.ino, Stripes: stripes})
	if err != nil {
		return err
	}
	if len(g.Grants) != len(stripes) {
		return fmt.Errorf("fileio: %d grants for %d stripes: %w", len(g.Grants), len(stripes), syscall.EIO)
	}
	// Every shard of every stripe in parallel.
	errs := make(chan error, len(stripes)*(f.k+f.m))
	pending := 0
	for _, gr := range g.Grants {
		d := f.dirty[gr.Stripe]
		if d == nil || len(gr.Shards) != f.k+f.m {
			return fmt.Errorf("fileio: grant for stripe %d does not match the layout: %w", gr.Stripe, syscall.EIO)
		}
		sl := int(f.shardLen(d.length))
		for i, sh := range gr.Shards {
			pending++
			go func() {
				c, err := e.conns.get(ctx, sh.Address)
				if err == nil {
					b := d.buf.b[i*unit : i*unit+sl]
					err = c.WriteVersion(ctx, chunk.Key{Chunk: sh.ChunkId, Version: gr.Version}, []rdma.SGE{d.buf.sge(i*unit, sl)}, crc32.Checksum(b, crcTable))
				}
				if err != nil {
					err = fmt.Errorf("fileio: write shard %d of stripe %d to %s: %w", i, gr.Stripe, sh.Address, err)
				}
				errs <- err
			}()
		}
	}
	var firstErr error
	for range pending {
		if err := <-errs; err != nil && firstErr == nil {
			firstErr = err
		}
	}
	if firstErr != nil {
		return firstErr
	}
	commits := make([]*metapb.StripeCommit, len(g.Grants))
	for i, gr := range g.Grants {
		d := f.dirty[gr.Stripe]
		commits[i] = &metapb.StripeCommit{Stripe: gr.Stripe, Version: gr.Version, ExpectedVersion: d.base, Length: uint64(d.length)}
	}
	size := f.size
	if _, err := e.cfg.Meta.CommitStripes(ctx, &metapb.CommitStripesRequest{Ino: f.ino, Stripes: commits, Size: uint64(max(size, 0))}); err != nil {
		return err
	}
	for _, gr := range g.Grants {
		d := f.dirty[gr.Stripe]
		f.stripes[gr.Stripe] = &metapb.StripeInfo{Stripe: gr.Stripe, Version: gr.Version, Length: uint64(d.length), Layout: gr.Layout, Shards: gr.Shards}
		f.dirtyN -= len(d.buf.b)
		e.pool.put(d.buf)
		delete(f.dirty, gr.Stripe)
	}
	return nil
}

// rebase rebuilds the conflicting stripes on their newest committed versions
// and applies this writer's ranges again.
func (e *Engine) rebase(ctx context.Context, f *file, conflicts []uint64) error {
	for _, s := range conflicts {
		old := f.dirty[s]
		if old == nil {
			continue
		}
		delete(f.stripes, s)
		delete(f.dirty, s)
		f.dirtyN -= len(old.buf.b)
		d, err := e.dirtyStripe(ctx, f, s, 0, 0)
		if err != nil {
			e.pool.put(old.buf)
			return err
		}
		for _, x := range old.extents {
			copy(d.buf.b[x[0]:x[1]], old.buf.b[x[0]:x[1]])
			d.length = max(d.length, x[1])
		}
		d.extents = old.extents
		e.pool.put(old.buf)
	}
	return nil
}
