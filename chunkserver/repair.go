package chunkserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/rdmafs/rdmafs/chunkserver/chunk"
	"github.com/rdmafs/rdmafs/chunkserver/client"
	"github.com/rdmafs/rdmafs/chunkserver/mempool"
	"github.com/rdmafs/rdmafs/chunkserver/store"
	"github.com/rdmafs/rdmafs/internal/stripe"
	"github.com/rdmafs/rdmafs/rdma"
)

// RepairPlanner is where chunkd's repair worker gets its work: the metadata
// service. Each poll reports the tasks finished since the last one and the
// chunk versions found corrupt, and asks for up to want new tasks.
type RepairPlanner interface {
	RepairPoll(ctx context.Context, id string, results []RepairResult, corrupt []chunk.Key, want int) ([]RepairTask, error)
}

// RepairTask asks chunkd to build shard Shard of a k+m stripe and store it
// here as version Key, from the other shards (Sources, indexed by shard).
type RepairTask struct {
	ID      uint64
	Key     chunk.Key // the version to create in this chunkd's store
	Shard   int
	K, M    int
	Sources []ShardSource
	// Length is the stripe's bytes of file data and Unit the layout's
	// unit: they give every shard's stored length (internal/stripe).
	// Length 0 (a task from a meta server before short stripes): every
	// shard has the length of the first one read.
	Length, Unit int64
	// Verify asks for no shard to be built: every shard is read and the
	// parity checked against the data (Shard and Key unused).
	Verify bool
	// To, when set, asks for shard Shard of the stripe re-encoded in another
	// layout of the same stripe size (relayout.go); Key then has the new
	// version, Sources the stripe's current one.
	To *RelayoutTarget
}

// ShardSource is where one shard of the stripe lives.
type ShardSource struct {
	Addr      string    // chunkd address; empty: unknown
	Key       chunk.Key // the shard's chunk version
	Available bool      // false: do not read it (lost, down or being rebuilt)
}

// RepairResult reports a finished task.
type RepairResult struct {
	ID       uint64
	Key      chunk.Key // the version the task built (RepairTask.Key)
	Err      error     // nil: the shard is stored durably
	Bytes    int
	Duration time.Duration
	// BadShards are, for a Verify task, the shards that disagree with the
	// rest of the stripe; Mismatch says they disagree but no single shard
	// explains it.
	BadShards []int
	Mismatch  bool
}

// RepairConfig configures chunkd's repair worker.
type RepairConfig struct {
	// Planner hands out repair tasks; nil disables repair.
	Planner RepairPlanner
	// Bandwidth bounds the bytes per second repair reads from other
	// chunkservers, so that foreground I/O keeps working (0: unlimited).
	Bandwidth int64
	// Parallel is the number of tasks run at once (default 2).
	Parallel int
	// MemBytes is the registered memory repair reads into, allocated and
	// registered once (default 32 MiB). A task needs (k+1) shards of it.
	MemBytes int
	// PollInterval is the time between polls while idle (default the
	// heartbeat interval).
	PollInterval time.Duration
}

// repairer runs repair tasks with its own protection domain, registered
// buffer pool and connections to the other chunkservers.
type repairer struct {
	s     *Server
	cfg   RepairConfig
	pd    rdma.ProtectionDomain
	mem   *mempool.Pool
	conns *client.Pool
	wire  client.WireStats // the work requests of conns
	limit *rateLimiter

	codecs stripe.Codecs
}

func newRepairer(s *Server, cfg RepairConfig) (*repairer, error) {
	if cfg.Parallel <= 0 {
		cfg.Parallel = 2
	}
	if cfg.MemBytes <= 0 {
		cfg.MemBytes = 32 << 20
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = s.cfg.HeartbeatInterval
	}
	pd, err := s.cfg.Device.AllocPD()
	if err != nil {
		return nil, fmt.Errorf("chunkserver: repair pd: %w", err)
	}
	mem, err := mempool.New(pd, "chunkd-repair", cfg.MemBytes)
	if err != nil {
		pd.Close()
		return nil, fmt.Errorf("chunkserver: repair memory of %d bytes: %w", cfg.MemBytes, err)
	}
	r := &repairer{s: s, cfg: cfg, pd: pd, mem: mem, limit: newRateLimiter(cfg.Bandwidth)}
	r.conns = client.NewPool(s.cfg.Device, pd, client.Options{Secret: s.cfg.Secret, Wire: &r.wire}, nil, s.log)
	if s.cfg.Registerer != nil {
		// Repair, scrub and relayout read other chunkservers' shards.
		s.cfg.Registerer.MustRegister(r.wire.Collector(s.cfg.Device.Name()))
	}
	return r, nil
}

func (r *repairer) close() {
	r.conns.Close()
	if err := r.mem.Close(); err != nil {
		r.s.log.Error("chunkd: release repair memory", "err", err)
	}
	r.pd.Close()
}

// loop polls the planner and runs up to Parallel tasks at once. A finished
// task makes it poll at once, to report and take the next. While work
// comes, an idle worker polls again soon (from busyPoll, doubling up to
// PollInterval): the planner queues more as other chunkservers finish
// their share of a stripe.
func (r *repairer) loop(ctx context.Context) {
	defer r.s.wg.Done()
	s := r.s
	done := make(chan RepairResult, r.cfg.Parallel)
	var report []RepairResult
	running := 0
	t := time.NewTimer(0)
	defer t.Stop()
	failures := 0
	idle := r.cfg.PollInterval
	for {
		select {
		case <-ctx.Done():
			return
		case res := <-done:
			running--
			report = append(report, res)
		case <-t.C:
		}
		for more := true; more; {
			select {
			case res := <-done:
				running--
				report = append(report, res)
			default:
				more = false
			}
		}
		tasks, err := r.cfg.Planner.RepairPoll(ctx, s.ID(), report, s.corruptKeys(), r.cfg.Parallel-running)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if failures++; !errors.Is(err, ErrNotRegistered) && (failures == 1 || failures%100 == 0) {
				s.log.Warn("chunkd: repair poll", "err", err, "failures", failures)
			}
			t.Reset(r.cfg.PollInterval)
			continue
		}
		failures = 0
		if len(tasks) > 0 || len(report) > 0 {
			idle = min(busyPoll, r.cfg.PollInterval)
		} else {
			idle = min(2*idle, r.cfg.PollInterval)
		}
		report = report[:0]
		for _, task := range tasks {
			running++
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				done <- r.run(ctx, task)
			}()
		}
		t.Reset(idle)
	}
}

// busyPoll is how soon an idle repair worker polls again after work came.
const busyPoll = 50 * time.Millisecond

// run builds one shard and stores it durably.
func (r *repairer) run(ctx context.Context, t RepairTask) RepairResult {
	if t.Verify {
		return r.runVerify(ctx, t)
	}
	start := time.Now()
	build := r.build
	if t.To != nil {
		build = r.relayout
	}
	n, err := build(ctx, t)
	d := time.Since(start)
	res := RepairResult{ID: t.ID, Key: t.Key, Err: err, Bytes: n, Duration: d}
	m := r.s.metrics
	if err != nil {
		m.Repairs.WithLabelValues("failed").Inc()
		r.s.log.Warn("chunkd: repair failed", "task", t.ID, "chunk", t.Key, "shard", t.Shard, "err", err)
		return res
	}
	m.Repairs.WithLabelValues("done").Inc()
	m.RepairBytes.Add(float64(n))
	m.RepairSeconds.Observe(d.Seconds())
	r.s.log.Debug("chunkd: shard rebuilt", "task", t.ID, "chunk", t.Key, "shard", t.Shard, "bytes", n, "took", d)
	return res
}

// errRepairMemory is returned when the repair buffer pool cannot hold a task.
var errRepairMemory = errors.New("chunkserver: repair memory exhausted")

// build reads the shard itself when it is readable (a move), otherwise k
// other shards, rebuilds it with Reed-Solomon, and stores it.
func (r *repairer) build(ctx context.Context, t RepairTask) (int, error) {
	n := t.K + t.M
	if t.K < 1 || len(t.Sources) != n || t.Shard < 0 || t.Shard >= n {
		return 0, fmt.Errorf("repair task %d: bad shape: k=%d m=%d shard %d of %d sources", t.ID, t.K, t.M, t.Shard, len(t.Sources))
	}
	if src := t.Sources[t.Shard]; src.Available && src.Addr != "" {
		nb, err := r.copyShard(ctx, t, src)
		if err == nil {
			return nb, nil
		}
		r.s.log.Info("chunkd: repair: copying the shard failed, rebuilding it from the others", "task", t.ID, "err", err)
	}
	var cands []int
	for i, src := range t.Sources {
		if i != t.Shard && src.Available && src.Addr != "" {
			cands = append(cands, i)
		}
	}
	if len(cands) < t.K {
		return 0, fmt.Errorf("repair task %d: %d readable shards, %d needed", t.ID, len(cands), t.K)
	}
	// Shards are coded at data shard 0's length; each is stored with its
	// own (short stripes), the rest counting as zeros. A task without the
	// stripe's length (from a meta server before short stripes) has every
	// shard as long as the first readable one.
	var length int
	if t.Length > 0 && t.Unit > 0 {
		length = int(stripe.CodedLen(t.Length, t.Unit))
	} else {
		var firstErr error
		for _, i := range cands {
			l, err := r.lease(ctx, t.Sources[i])
			if err == nil {
				length = int(l.Length)
				r.release(ctx, t.Sources[i], l)
				break
			}
			firstErr = err
		}
		if length == 0 {
			return 0, fmt.Errorf("repair task %d: no shard readable: %w", t.ID, firstErr)
		}
	}
	buf, ok := r.mem.Alloc((t.K + 1) * length)
	if !ok {
		return 0, fmt.Errorf("repair task %d: %d bytes: %w", t.ID, (t.K+1)*length, errRepairMemory)
	}
	defer r.mem.Free(buf)
	b := r.mem.Bytes(buf)
	// k readers take candidates in order until each has read one shard.
	var mu sync.Mutex
	next := 0
	got := make([]int, t.K) // slot -> shard index
	read := make([]bool, t.K)
	var wg sync.WaitGroup
	errs := make([]error, t.K)
	for slot := 0; slot < t.K; slot++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				if next >= len(cands) {
					mu.Unlock()
					return
				}
				i := cands[next]
				next++
				mu.Unlock()
				err := r.readInto(ctx, t.Sources[i], buf, slot*length, length)
				if err == nil {
					got[slot], read[slot] = i, true
					return
				}
				errs[slot] = fmt.Errorf("shard %d at %s: %w", i, t.Sources[i].Addr, err)
			}
		}()
	}
	wg.Wait()
	shards := make([][]byte, n)
	for slot := 0; slot < t.K; slot++ {
		if !read[slot] {
			var last error
			for _, e := range errs {
				if e != nil {
					last = e
				}
			}
			return 0, fmt.Errorf("repair task %d: fewer than %d shards readable (last error: %v)", t.ID, t.K, last)
		}
		shards[got[slot]] = b[slot*length : (slot+1)*length]
	}
	out := b[t.K*length : (t.K+1)*length : (t.K+1)*length]
	stored := length
	if t.Length > 0 && t.Unit > 0 {
		stored = int(stripe.ShardLen(t.Length, t.Unit, t.K, t.Shard))
	}
	if t.K == 1 {
		copy(out, shards[got[0]])
	} else {
		enc, err := r.codecs.Get(t.K, t.M)
		if err != nil {
			return 0, err
		}
		shards[t.Shard] = out[:0]
		required := make([]bool, n)
		required[t.Shard] = true
		if err := enc.ReconstructSome(shards, required); err != nil {
			return 0, fmt.Errorf("repair task %d: reconstruct shard %d: %w", t.ID, t.Shard, err)
		}
		if len(shards[t.Shard]) != length {
			return 0, fmt.Errorf("repair task %d: reconstructed %d bytes, want %d", t.ID, len(shards[t.Shard]), length)
		}
		if &shards[t.Shard][0] != &out[0] {
			copy(out, shards[t.Shard])
		}
	}
	return stored, r.store(t, out[:stored])
}

// copyShard moves a readable shard as is (drain and rebalance).
func (r *repairer) copyShard(ctx context.Context, t RepairTask, src ShardSource) (int, error) {
	l, err := r.lease(ctx, src)
	if err != nil {
		return 0, err
	}
	length := int(l.Length)
	r.release(ctx, src, l)
	buf, ok := r.mem.Alloc(max(length, 1))
	if !ok {
		return 0, fmt.Errorf("%d bytes: %w", length, errRepairMemory)
	}
	defer r.mem.Free(buf)
	if err := r.readInto(ctx, src, buf, 0, length); err != nil {
		return 0, err
	}
	return length, r.store(t, r.mem.Bytes(buf)[:length])
}

func (r *repairer) store(t RepairTask, data []byte) error {
	crc := store.Checksum(data)
	err := r.s.store.Put(t.Key, data, crc)
	if errors.Is(err, store.ErrExists) {
		if info, serr := r.s.store.Stat(t.Key); serr == nil && info.CRC == crc {
			err = nil // a retried task
		}
	}
	if err != nil {
		return fmt.Errorf("repair task %d: store %v: %w", t.ID, t.Key, err)
	}
	r.s.metrics.BytesWritten.Add(float64(len(data)))
	r.s.updateStoreGauges()
	return nil
}

func (r *repairer) lease(ctx context.Context, src ShardSource) (client.Lease, error) {
	c, _, err := r.conns.Get(ctx, "", src.Addr)
	if err != nil {
		return client.Lease{}, err
	}
	return c.ReadLease(ctx, src.Key)
}

func (r *repairer) release(ctx context.Context, src ShardSource, l client.Lease) {
	if c, _, err := r.conns.Get(ctx, "", src.Addr); err == nil {
		c.ReleaseLease(ctx, l)
	}
}

// readInto reads a whole shard with RDMA_READ into buf at off, within the
// bandwidth bound, and checks it against the checksum its chunkd holds. The
// shard may be stored shorter than length (short stripes): the rest of the
// length is zeroed.
func (r *repairer) readInto(ctx context.Context, src ShardSource, buf mempool.Buf, off, length int) error {
	c, _, err := r.conns.Get(ctx, "", src.Addr)
	if err != nil {
		return err
	}
	// Wait for bandwidth before taking the lease: a lease pins the shard in
	// the source's memory, and a long wait could outlast it.
	if err := r.limit.wait(ctx, length); err != nil {
		return err
	}
	l, err := c.ReadLease(ctx, src.Key)
	if err != nil {
		return err
	}
	defer c.ReleaseLease(ctx, l)
	n := int(l.Length)
	if n > length {
		return fmt.Errorf("%v is %d bytes, longer than the stripe's shards (%d)", src.Key, l.Length, length)
	}
	if n > 0 {
		if err := c.Read(ctx, l, 0, []rdma.SGE{r.mem.SGE(buf, off, n)}); err != nil {
			return err
		}
	}
	all := r.mem.Bytes(buf)[off : off+length]
	if crc := store.Checksum(all[:n]); crc != l.CRC {
		return fmt.Errorf("%v read with crc32c %08x, its chunkd holds %08x", src.Key, crc, l.CRC)
	}
	clear(all[n:])
	r.s.metrics.RepairReadBytes.Add(float64(n))
	return nil
}

// rateLimiter bounds a byte rate: each wait reserves n bytes and sleeps
// until the reservation is covered (debt is allowed, so any size passes).
type rateLimiter struct {
	rate float64 // bytes per second; 0: unlimited
	mu   sync.Mutex
	next time.Time // when the bytes reserved so far are paid for
}

func newRateLimiter(bytesPerSecond int64) *rateLimiter {
	return &rateLimiter{rate: float64(max(bytesPerSecond, 0))}
}

func (l *rateLimiter) wait(ctx context.Context, n int) error {
	if l.rate == 0 || n <= 0 {
		return nil
	}
	now := time.Now()
	l.mu.Lock()
	// Allow a burst of 100ms worth of idle time, no more.
	if l.next.Before(now.Add(-100 * time.Millisecond)) {
		l.next = now.Add(-100 * time.Millisecond)
	}
	start := l.next
	l.next = l.next.Add(time.Duration(float64(n) / l.rate * float64(time.Second)))
	l.mu.Unlock()
	if d := start.Sub(now); d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// noteCorrupt records a stored version that failed its checksum; the repair
// worker reports it until garbage collection deletes it. It returns whether
// the version was not known corrupt before.
func (s *Server) noteCorrupt(key chunk.Key) bool {
	s.mu.Lock()
	_, known := s.corrupt[key]
	s.corrupt[key] = struct{}{}
	s.mu.Unlock()
	if !known {
		s.metrics.Errors.WithLabelValues("corrupt").Inc()
		s.log.Error("chunkd: stored chunk version is corrupt: reporting it for repair", "chunk", key)
	}
	return !known
}

// maxCorruptPerPoll is how many corrupt versions one repair poll reports: the
// metadata service takes no more (core.MaxDeletesPerHeartbeat).
const maxCorruptPerPoll = 4096

// corruptKeys returns the corrupt versions to report in the next poll: all of
// them, or maxCorruptPerPoll of them picked at random (map order), so that a
// failing disk with many bad chunks reports them all over a few polls.
func (s *Server) corruptKeys() []chunk.Key {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.corrupt) == 0 {
		return nil
	}
	out := make([]chunk.Key, 0, min(len(s.corrupt), maxCorruptPerPoll))
	for k := range s.corrupt {
		if len(out) == maxCorruptPerPoll {
			break
		}
		out = append(out, k)
	}
	return out
}

// runVerify reads every shard of a stripe and checks its parity.
func (r *repairer) runVerify(ctx context.Context, t RepairTask) RepairResult {
	start := time.Now()
	bad, n, err := r.verify(ctx, t)
	res := RepairResult{ID: t.ID, Key: t.Key, Err: err, Bytes: n, Duration: time.Since(start), BadShards: bad}
	if errors.Is(err, errUnlocated) {
		res.Err, res.Mismatch = nil, true
		bad = nil
	}
	switch {
	case res.Mismatch:
		r.s.metrics.Repairs.WithLabelValues("verify_mismatch").Inc()
		r.s.log.Error("chunkd: a stripe's shards disagree and no single shard explains it", "task", t.ID, "err", err)
	case err != nil:
		r.s.metrics.Repairs.WithLabelValues("verify_failed").Inc()
		r.s.log.Warn("chunkd: stripe verification failed", "task", t.ID, "err", err)
	case len(bad) > 0:
		r.s.metrics.Repairs.WithLabelValues("verify_mismatch").Inc()
		r.s.log.Error("chunkd: a stripe's shards disagree", "task", t.ID, "bad_shards", bad)
	default:
		r.s.metrics.Repairs.WithLabelValues("verified").Inc()
	}
	return res
}

// verify reads all k+m shards, checks the parity against the data and, if
// they disagree, finds the shard that does: rebuilt from the others, it
// makes the stripe consistent. Disagreement no single shard explains (two
// shards wrong, or any with one parity shard, where every shard rebuilt
// from the rest fits) is an error. It returns the bad shards and the bytes
// read.
func (r *repairer) verify(ctx context.Context, t RepairTask) ([]int, int, error) {
	n := t.K + t.M
	if t.K < 1 || t.M < 1 || len(t.Sources) != n || t.Length <= 0 || t.Unit <= 0 {
		return nil, 0, fmt.Errorf("verify task %d: bad shape: k=%d m=%d, %d sources, length %d unit %d", t.ID, t.K, t.M, len(t.Sources), t.Length, t.Unit)
	}
	length := int(stripe.CodedLen(t.Length, t.Unit))
	buf, ok := r.mem.Alloc((n + 1) * length)
	if !ok {
		return nil, 0, fmt.Errorf("verify task %d: %d bytes: %w", t.ID, (n+1)*length, errRepairMemory)
	}
	defer r.mem.Free(buf)
	b := r.mem.Bytes(buf)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, src := range t.Sources {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if src.Addr == "" {
				errs[i] = errors.New("no address")
				return
			}
			errs[i] = r.readInto(ctx, src, buf, i*length, length)
		}()
	}
	wg.Wait()
	shards := make([][]byte, n)
	for i := range shards {
		if errs[i] != nil {
			return nil, 0, fmt.Errorf("verify task %d: shard %d at %s: %w", t.ID, i, t.Sources[i].Addr, errs[i])
		}
		shards[i] = b[i*length : (i+1)*length : (i+1)*length]
	}
	read := n * length
	if t.K == 1 {
		return verifyCopies(t, shards, read)
	}
	enc, err := r.codecs.Get(t.K, t.M)
	if err != nil {
		return nil, read, err
	}
	if ok, err := enc.Verify(shards); err != nil || ok {
		return nil, read, err
	}
	scratch := b[n*length : (n+1)*length : (n+1)*length]
	trial := make([][]byte, n)
	required := make([]bool, n)
	var bad []int
	for i := range shards {
		copy(trial, shards)
		trial[i] = scratch[:0]
		clear(required)
		required[i] = true
		if err := enc.ReconstructSome(trial, required); err != nil {
			return nil, read, fmt.Errorf("verify task %d: rebuild shard %d: %w", t.ID, i, err)
		}
		if ok, err := enc.Verify(trial); err == nil && ok {
			bad = append(bad, i)
		}
	}
	if len(bad) != 1 {
		return nil, read, fmt.Errorf("verify task %d: %w (%d candidates)", t.ID, errUnlocated, len(bad))
	}
	return bad, read, nil
}

// errUnlocated says a stripe's shards disagree and no single shard explains
// it.
var errUnlocated = errors.New("the shards of the stripe disagree and no single shard explains it")

// verifyCopies is verify for replication (k = 1): every shard is a copy;
// those that differ from a strict majority of equal copies are bad.
func verifyCopies(t RepairTask, shards [][]byte, read int) ([]int, int, error) {
	for i := range shards {
		var same, bad []int
		for j := range shards {
			if bytes.Equal(shards[i], shards[j]) {
				same = append(same, j)
			} else {
				bad = append(bad, j)
			}
		}
		if 2*len(same) > len(shards) {
			return bad, read, nil // nil when all agree
		}
	}
	return nil, read, fmt.Errorf("verify task %d: %w (%d copies, no majority)", t.ID, errUnlocated, len(shards))
}
