// Package bolt is the embedded kv.Store backend: a bbolt file with a
// write-ahead log in front of it and pipelined group commit.
//
// Transactions run one after another as they arrive, against the state the
// transactions before them left, including those not durable yet. A single
// writer appends the writes of each group of transactions to the log with
// one sequential write and one fdatasync. Update answers a transaction once
// its group is durable; UpdateLogged answers it as soon as the group is
// written, before the fdatasync: it then survives a crash of this process
// (the record is in the page cache) but not one of the machine until the
// fdatasync ends, and Sync waits for that. The next group is written only
// after the fdatasync of the one before, while its transactions gather.
// (A bbolt commit costs two fdatasyncs and a scattered write per dirty
// page, several times as long.) A checkpointer applies the logged groups to
// bbolt in the background with bbolt's own durable commits, after which
// their log space is reused; until then reads see them in memory. Open
// replays the log into bbolt after a crash.
package bolt

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/rdmafs/rdmafs/internal/private"
	"github.com/rdmafs/rdmafs/meta/kv"
)

// FileName is the name of the database file inside the data directory.
const FileName = "meta.db"

// bucketName is the bucket that holds every key of the store; walBucket
// holds the log's state: the last sequence number applied and the epoch.
const (
	bucketName = "rdmafs"
	walBucket  = "rdmafs-log"
)

// Options tunes a Store.
type Options struct {
	// MaxBatch bounds the number of transactions committed together
	// (default 1024).
	MaxBatch int
	// Linger bounds how long the writer waits for one more transaction
	// when fewer are waiting than there were concurrent writers recently:
	// the writers of the previous group, between two Update calls (default
	// 500µs; negative disables waiting). It never waits longer than half
	// of what a group commit has been taking: where the log's sync is
	// cheap (tmpfs, a write cache) a wait would cost more than the sync
	// it saves.
	Linger time.Duration
	// MaxLinger bounds the whole wait before a group commit while
	// transactions keep arriving (default 10×Linger).
	MaxLinger time.Duration
	// LogSegment is the size of each of the two log files (default 8 MiB).
	// A group whose writes do not fit in half of it is committed to bbolt
	// directly.
	LogSegment int64
	// CheckpointEvery is how long logged groups may wait before they are
	// applied to bbolt (default 50ms; sooner when many are waiting).
	CheckpointEvery time.Duration
	// Slack is how many zero-filled bytes the database file keeps beyond
	// the pages in use (default 4 MiB; negative disables it). bbolt grows
	// its file sparsely, and writing into a hole makes every fdatasync a
	// journal commit (~6x slower here than overwriting written blocks).
	Slack int64
	// Logger receives warnings (default slog.Default()).
	Logger *slog.Logger
	// OnCommit, when set, is called after every group commit with the number
	// of transactions in it and the time the commit took (for metrics).
	OnCommit func(txns int, d time.Duration)

	// maxSize is bbolt's MaxSize, for tests that make commits fail.
	maxSize int
	// chainHold is maxChainHold unless set (tests).
	chainHold time.Duration
}

// maxChainHold bounds how long the writer leaves a group of chains'
// transactions alone waiting for the chains to be complete.
const maxChainHold = 2 * time.Millisecond

// checkpointGroups is how many logged groups start a checkpoint at once.
const checkpointGroups = 32

// Store is a kv.Store on a bbolt file and its log.
type Store struct {
	db   *bbolt.DB
	opts Options
	path string
	log  *wal // the writer goroutine's

	// mu serializes the execution of transactions and guards the fields
	// up to kick. The writer takes it only between commits.
	mu      sync.Mutex
	taken   *sync.Cond // signalled when the writer takes the open group or the store closes
	closed  bool
	open    *group                  // transactions run since the writer took the last group
	pending map[string]pendingWrite // writes of run transactions that are not durable yet
	sorted  []string                // the keys of pending in order, for scans
	arrived time.Time               // when the last transaction joined the open group
	want    int                     // while the writer lingers: the group size it waits for

	kick     chan struct{} // wakes the writer (capacity 1)
	finished chan struct{} // closed when the writer has exited

	// ovMu guards logged: the durable groups not in bbolt yet, oldest
	// first. Readers take a snapshot of it together with a bbolt read
	// transaction; checkpoints replace it after their commit.
	ovMu   sync.RWMutex
	logged []*group

	ckMu       sync.Mutex    // serializes checkpoints (bbolt's write transactions) and guards hwm, filesz
	ckKick     chan struct{} // wakes the checkpointer (capacity 1)
	ckStop     chan struct{} // closed when the writer has exited
	ckFinished chan struct{} // closed when the checkpointer has exited
	ckErr      error         // the checkpointer's last error (ckFinished)

	hwm      int64        // bytes of the file bbolt uses
	filesz   int64        // file size when last checked; the file never shrinks
	inflight atomic.Int64 // Update calls not yet returned
	peak     atomic.Int64 // highest inflight since the writer last reset it
	commitNs int64        // moving average of a group commit's duration (the writer's)

	// durMu guards the durability state: the last group answered (written
	// to the log, or durable), the last durable one, the channel closed
	// when durable next advances, and broken, set when a written group
	// could not be made durable (the store refuses transactions from then).
	durMu    sync.Mutex
	answered uint64
	durable  uint64
	advanced chan struct{}
	broken   error
}

// group is the transactions committed together.
type group struct {
	seq     uint64 // order of the groups in this process
	reqs    []*request
	waiting int       // requests that wait for durability (not early)
	chained int       // requests of chains (Chain), which do not wake the writer
	holding int       // chains with requests here that have not waited yet: the writer leaves a group of theirs alone (for maxChainHold)
	started time.Time // when the first request joined
	// writes merges the writes of the group's successful transactions in
	// the order they ran; a nil value is a deletion.
	writes map[string][]byte
	keys   []string // the keys of writes in order, once the writer took the group
	lsn    uint64   // sequence number in the log, once logged
}

// pendingWrite is the latest value a run transaction wrote to a key that
// is not durable yet.
type pendingWrite struct {
	value []byte // nil: deleted
	seq   uint64 // the group of the transaction that wrote it
}

type request struct {
	err   error      // what fn returned (set under mu)
	done  chan error // the outcome, once the request's group is durable (or logged, when early)
	early bool       // answer once the group is written, before its fdatasync
	chain *Chain     // the chain the request belongs to, if any
}

// errRunAgain tells Update that its transaction read writes of a group that
// failed to commit, so nothing of it was applied and it must run again.
var errRunAgain = errors.New("bolt: run the transaction again")

// Open opens (creating if needed) the database in dir and applies to it
// what the log holds beyond it.
//
// The directory and everything in it are kept to the process's user: created
// 0700, and group or world access found there removed (with a log line).
func Open(dir string, opts Options) (*Store, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if err := private.MkdirAll(dir, opts.Logger); err != nil {
		return nil, fmt.Errorf("bolt: data dir: %w", err)
	}
	if _, err := private.TightenTree(dir, opts.Logger); err != nil {
		return nil, fmt.Errorf("bolt: data dir: %w", err)
	}
	path := filepath.Join(dir, FileName)
	db, err := openDB(path, opts.maxSize, false)
	if err != nil {
		return nil, err
	}
	if opts.MaxBatch <= 0 {
		opts.MaxBatch = 1024
	}
	if opts.Linger == 0 {
		opts.Linger = 500 * time.Microsecond
	}
	if opts.MaxLinger <= 0 {
		opts.MaxLinger = 10 * opts.Linger
	}
	if opts.chainHold <= 0 {
		opts.chainHold = maxChainHold
	}
	if opts.LogSegment <= 0 {
		opts.LogSegment = 8 << 20
	}
	opts.LogSegment = max(opts.LogSegment, 64<<10)
	if opts.CheckpointEvery <= 0 {
		opts.CheckpointEvery = 50 * time.Millisecond
	}
	if opts.Slack == 0 {
		opts.Slack = 4 << 20
	}
	s := &Store{db: db, opts: opts, path: path, open: newGroup(1), pending: map[string]pendingWrite{},
		kick: make(chan struct{}, 1), finished: make(chan struct{}), advanced: make(chan struct{}),
		ckKick: make(chan struct{}, 1), ckStop: make(chan struct{}), ckFinished: make(chan struct{})}
	s.taken = sync.NewCond(&s.mu)
	if s.log, err = openWAL(dir, opts.LogSegment); err != nil {
		db.Close()
		return nil, err
	}
	if err := s.recover(); err != nil {
		s.log.close()
		db.Close()
		return nil, err
	}
	if err := s.ensureSlack(); err != nil {
		s.log.close()
		db.Close()
		return nil, err
	}
	go s.writer()
	go s.checkpointer()
	return s, nil
}

// openDB opens the bbolt file at path; maxSize is bbolt's MaxSize (0: no
// limit).
func openDB(path string, maxSize int, readOnly bool) (*bbolt.DB, error) {
	// The freelist is rebuilt at open instead of being written at every
	// commit: fewer pages per fsync, same durability.
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: 2 * time.Second, NoFreelistSync: true,
		FreelistType: bbolt.FreelistMapType, MaxSize: maxSize, ReadOnly: readOnly})
	if err != nil {
		return nil, fmt.Errorf("bolt: open %s: %w", path, err)
	}
	return db, nil
}

// recover applies the logged groups bbolt lacks and starts a new epoch of
// the log, so that no record written before can be taken for a new one. If
// the log is damaged in the middle it returns a *CorruptLogError and writes
// nothing.
func (s *Store) recover() error {
	st, err := readLogState(s.db)
	if err != nil {
		return err
	}
	s.hwm = st.size
	var plan replayPlan
	if st.epoch != 0 {
		l, err := s.log.scan(st.epoch)
		if err != nil {
			return err
		}
		plan = l.plan(st.applied)
		if err := l.check(filepath.Dir(s.path), plan); err != nil {
			return err
		}
	}
	st, err = replay(s.db, st.applied, plan.replay)
	if err != nil {
		return err
	}
	if len(plan.replay) > 0 {
		s.opts.Logger.Info("bolt: replayed the log", "groups", len(plan.replay), "last", st.applied)
	}
	s.hwm = st.size
	s.log.epoch, s.log.lsn = st.epoch, st.applied
	return nil
}

// logState is the log's state stored in bbolt, with the database's size.
type logState struct {
	applied uint64 // the last sequence number applied
	epoch   uint64 // the log's epoch (0: none yet)
	size    int64  // bytes of the file bbolt uses
}

// readLogState reads the log's state from the database.
func readLogState(db *bbolt.DB) (logState, error) {
	var st logState
	if err := db.View(func(tx *bbolt.Tx) error {
		if b := tx.Bucket([]byte(walBucket)); b != nil {
			st.applied, _ = decodeU64(b.Get([]byte("applied")))
			st.epoch, _ = decodeU64(b.Get([]byte("epoch")))
		}
		st.size = tx.Size()
		return nil
	}); err != nil {
		return st, fmt.Errorf("bolt: read log state: %w", err)
	}
	return st, nil
}

// replay applies recs, the records after applied in order, to the database
// and stores a new epoch in the same commit: every record of the log is
// stale from then on. It returns the new state.
func replay(db *bbolt.DB, applied uint64, recs []record) (logState, error) {
	epoch, err := randomEpoch()
	if err != nil {
		return logState{}, err
	}
	st := logState{applied: applied, epoch: epoch}
	if len(recs) > 0 {
		st.applied = recs[len(recs)-1].lsn
	}
	if err := db.Update(func(tx *bbolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists([]byte(bucketName))
		if err != nil {
			return err
		}
		for _, r := range recs {
			for i, k := range r.keys {
				if v := r.values[i]; v == nil {
					err = b.Delete([]byte(k))
				} else {
					err = b.Put([]byte(k), v)
				}
				if err != nil {
					return fmt.Errorf("replay record %d: %w", r.lsn, err)
				}
			}
		}
		if err := putLogState(tx, st.applied, epoch); err != nil {
			return err
		}
		st.size = tx.Size()
		return nil
	}); err != nil {
		return logState{}, fmt.Errorf("bolt: replay the log: %w", err)
	}
	return st, nil
}

// randomEpoch returns a new epoch for the log: random, never 0 (which no
// log has).
func randomEpoch() (uint64, error) {
	var eb [8]byte
	if _, err := rand.Read(eb[:]); err != nil {
		return 0, fmt.Errorf("bolt: log epoch: %w", err)
	}
	return binary.BigEndian.Uint64(eb[:]) | 1, nil
}

func putLogState(tx *bbolt.Tx, applied, epoch uint64) error {
	b, err := tx.CreateBucketIfNotExists([]byte(walBucket))
	if err != nil {
		return err
	}
	if err := b.Put([]byte("applied"), binary.BigEndian.AppendUint64(nil, applied)); err != nil {
		return err
	}
	if epoch != 0 {
		return b.Put([]byte("epoch"), binary.BigEndian.AppendUint64(nil, epoch))
	}
	return nil
}

func decodeU64(b []byte) (uint64, bool) {
	if len(b) != 8 {
		return 0, false
	}
	return binary.BigEndian.Uint64(b), true
}

func newGroup(seq uint64) *group { return &group{seq: seq, writes: map[string][]byte{}} }

// View implements kv.Store. It reads the durable state.
func (s *Store) View(ctx context.Context, fn func(kv.Reader) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	tx, logged, err := s.snapshot()
	if err != nil {
		return err
	}
	defer tx.Rollback()
	return fn(&reader{b: tx.Bucket([]byte(bucketName)), logged: logged})
}

// snapshot begins a bbolt read transaction and returns it with the logged
// groups it lacks. Together they are the durable state of one moment: a
// checkpoint removes groups from logged only after its commit.
func (s *Store) snapshot() (*bbolt.Tx, []*group, error) {
	s.ovMu.RLock()
	defer s.ovMu.RUnlock()
	tx, err := s.db.Begin(false)
	if err != nil {
		return nil, nil, fmt.Errorf("bolt: begin: %w", err)
	}
	return tx, s.logged, nil
}

// Update implements kv.Store. fn runs at once, serialized with the other
// transactions, and joins the open group; Update returns when the writer
// has made that group durable.
func (s *Store) Update(ctx context.Context, fn func(kv.Txn) error) error {
	return s.update(ctx, fn, false)
}

// UpdateLogged is Update that returns as soon as the transaction's group is
// written to the log, before the log's fdatasync: the transaction survives a
// crash of this process from then on, and one of the machine once Sync
// (called after UpdateLogged returned) has returned. Readers see it at once.
func (s *Store) UpdateLogged(ctx context.Context, fn func(kv.Txn) error) error {
	return s.update(ctx, fn, true)
}

// Sync waits until every transaction acknowledged before the call is
// durable. It fails if the store could not make one durable.
func (s *Store) Sync(ctx context.Context) error {
	s.durMu.Lock()
	target := s.answered
	for s.durable < target && s.broken == nil {
		ch := s.advanced
		s.durMu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
		s.durMu.Lock()
	}
	err := s.broken
	s.durMu.Unlock()
	return err
}

func (s *Store) update(ctx context.Context, fn func(kv.Txn) error, early bool) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	n := s.inflight.Add(1)
	for p := s.peak.Load(); n > p && !s.peak.CompareAndSwap(p, n); p = s.peak.Load() {
	}
	defer s.inflight.Add(-1)
	r := &request{done: make(chan error, 1), early: early}
	for {
		if err := s.run(ctx, fn, r); err != nil {
			return err
		}
		// Once run the outcome must be awaited: returning early would
		// leave the caller unsure whether its transaction committed.
		if err := <-r.done; err != errRunAgain {
			return err
		}
	}
}

// run executes fn and adds the request to the open group. An error means
// that fn did not run.
func (s *Store) run(ctx context.Context, fn func(kv.Txn) error, r *request) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for !s.closed && len(s.open.reqs) >= s.opts.MaxBatch {
		// The group may be a chain's, which has not woken the writer.
		select {
		case s.kick <- struct{}{}:
		default:
		}
		s.taken.Wait()
	}
	if s.closed {
		return kv.ErrClosed
	}
	if err := s.brokenErr(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if r.chain != nil && r.chain.failed != nil {
		return r.chain.failed
	}
	// A read transaction per run: a checkpoint may need every read
	// transaction closed to grow the memory map.
	tx, logged, err := s.snapshot()
	if err != nil {
		return err
	}
	t := &txn{reader: reader{b: tx.Bucket([]byte(bucketName)), logged: logged},
		pending: s.pending, sorted: s.sorted, writes: map[string][]byte{}}
	r.err = kv.CallSafely(fn, t)
	if err := tx.Rollback(); err != nil {
		s.opts.Logger.Warn("bolt: close read transaction", "err", err)
	}
	g := s.open
	if r.err == nil {
		for k, v := range t.writes {
			g.writes[k] = v
			if _, ok := s.pending[k]; !ok {
				i, _ := slices.BinarySearch(s.sorted, k)
				s.sorted = slices.Insert(s.sorted, i, k)
			}
			s.pending[k] = pendingWrite{value: v, seq: g.seq}
		}
	}
	g.reqs = append(g.reqs, r)
	if len(g.reqs) == 1 {
		g.started = time.Now()
	}
	if !r.early {
		g.waiting++
	}
	if r.chain != nil {
		// The chain wakes the writer when it waits (Chain.Wait), so that
		// its transactions share one group.
		g.chained++
		if r.chain.held != g.seq {
			r.chain.held = g.seq
			g.holding++
		}
		return nil
	}
	s.arrived = time.Now()
	// Wake the writer when it may be idle, or when the group it lingers
	// for is complete; otherwise it wakes by itself once arrivals pause.
	if len(g.reqs)-g.chained == 1 || s.want > 0 && len(g.reqs) >= s.want {
		select {
		case s.kick <- struct{}{}:
		default:
		}
	}
	return nil
}

// A Chain runs a sequence of transactions (the calls of a client's batch)
// without waiting for each to be logged: each joins the open group as it
// runs, seeing the writes of those before it, and the writer is woken only
// when the chain waits, so that they share one group commit. Wait returns
// once all are logged. If a group holding one of them fails, no later
// transaction of the chain is applied (they fail too): what a chain applies
// is always a prefix of it. A Chain is used by one goroutine at a time.
type Chain struct {
	s      *Store
	reqs   []*request // run and not yet waited for
	failed error      // set under s.mu once a transaction of the chain failed
	held   uint64     // under s.mu: the open group the chain holds back (its seq), or 0
	err    error      // the first failure Wait saw
}

// NewChain returns an empty chain of transactions on s.
func (s *Store) NewChain() kv.Chain { return &Chain{s: s} }

// Update runs fn now, as UpdateLogged does, and returns its error; it does
// not wait for the transaction to be logged (Wait does). It fails without
// running fn once a transaction of the chain has failed.
func (c *Chain) Update(ctx context.Context, fn func(kv.Txn) error) error {
	if c.err != nil {
		return c.err
	}
	r := &request{done: make(chan error, 1), early: true, chain: c}
	if err := c.s.run(ctx, fn, r); err != nil {
		return err
	}
	c.reqs = append(c.reqs, r)
	return r.err
}

// Wait returns once every transaction the chain ran is logged (readable,
// and surviving a crash of this process), or with the failure that kept one
// from being applied; later transactions of the chain were not applied then
// either. It may be called again after more Updates.
func (c *Chain) Wait(ctx context.Context) error {
	if len(c.reqs) == 0 {
		return c.err
	}
	c.s.mu.Lock()
	if c.held != 0 && c.held == c.s.open.seq {
		c.s.open.holding--
	}
	c.held = 0
	c.s.mu.Unlock()
	select {
	case c.s.kick <- struct{}{}:
	default:
	}
	for len(c.reqs) > 0 {
		var err error
		select {
		case err = <-c.reqs[0].done:
		case <-ctx.Done():
			return ctx.Err()
		}
		r := c.reqs[0]
		c.reqs = c.reqs[1:]
		if err == nil || err == r.err || c.err != nil {
			continue // applied, or fn's own failure, which Update returned
		}
		if err == errRunAgain {
			c.err = fmt.Errorf("bolt: a transaction read writes of a failed group: %w", kv.ErrNotApplied)
		} else {
			c.err = fmt.Errorf("%w: %w", kv.ErrNotApplied, err)
		}
	}
	return c.err
}

// Close waits for the transactions that ran, applies the log to bbolt and
// closes the files.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return kv.ErrClosed
	}
	s.closed = true
	s.taken.Broadcast()
	s.mu.Unlock()
	select {
	case s.kick <- struct{}{}:
	default:
	}
	<-s.finished
	close(s.ckStop)
	<-s.ckFinished
	err := s.ckErr
	if cerr := s.log.close(); err == nil && cerr != nil {
		err = fmt.Errorf("bolt: close log: %w", cerr)
	}
	if cerr := s.db.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("bolt: close: %w", cerr)
	}
	return err
}

// writer commits the open group whenever it is not empty, until the store
// is closed and every run transaction is committed.
func (s *Store) writer() {
	defer close(s.finished)
	peakReset := time.Now()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		s.mu.Lock()
		// A group of chains' transactions waits for them to be complete
		// (Chain.Wait), unless it is full, the store closes, or it has
		// waited maxChainHold: one chain's long run (a tree removal)
		// must not hold back another's.
		var hold time.Duration
		if s.open.holding > 0 && len(s.open.reqs) == s.open.chained && len(s.open.reqs) < s.opts.MaxBatch && !s.closed {
			hold = s.opts.chainHold - time.Since(s.open.started)
		}
		if len(s.open.reqs) == 0 || hold > 0 {
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return
			}
			if hold > 0 {
				timer.Reset(hold)
				select {
				case <-s.kick:
				case <-timer.C:
				}
			} else {
				<-s.kick
			}
			continue
		}
		// Under concurrent load the writers of the previous group are
		// sending their next transactions right now: linger while they
		// keep arriving, until as many transactions are waiting as there
		// were concurrent writers recently, so that they share the fsync
		// (one costs about as much as a whole group); never for a single
		// writer.
		if time.Since(peakReset) > 50*time.Millisecond {
			s.peak.Store(s.inflight.Load())
			peakReset = time.Now()
		}
		linger := min(s.opts.Linger, time.Duration(s.commitNs/2))
		if s.open.waiting == 0 {
			// Early requests are answered before the fdatasync: a wait
			// would only delay them.
			linger = 0
		}
		if want := min(int(s.peak.Load()), s.opts.MaxBatch); len(s.open.reqs) < want && linger > 0 && !s.closed {
			start := time.Now()
			deadline := start.Add(min(s.opts.MaxLinger, 10*linger))
			s.want = want
			for len(s.open.reqs) < want && !s.closed {
				until := start.Add(linger)
				if s.arrived.After(start) {
					until = s.arrived.Add(linger)
				}
				if deadline.Before(until) {
					until = deadline
				}
				wait := time.Until(until)
				if wait <= 0 {
					break
				}
				s.mu.Unlock()
				timer.Reset(wait)
				select {
				case <-s.kick:
				case <-timer.C:
				}
				s.mu.Lock()
			}
			s.want = 0
		}
		g := s.open
		s.open = newGroup(g.seq + 1)
		s.taken.Broadcast()
		s.mu.Unlock()
		s.commit(g)
	}
}

// commit makes the writes of g durable and reports the outcome of its
// transactions: early ones once g is written, the others once it is
// durable. If the write fails, the transactions that ran after g's (and may
// have read its writes) run again. If the fdatasync fails after the write,
// g is made durable by a checkpoint into bbolt instead; if that fails too,
// the store is broken.
func (s *Store) commit(g *group) {
	start := time.Now()
	var err error
	durable := true
	if len(g.writes) > 0 {
		g.keys = make([]string, 0, len(g.writes))
		for k := range g.writes {
			g.keys = append(g.keys, k)
		}
		slices.Sort(g.keys)
		durable, err = s.logGroup(g)
	}
	if err != nil {
		s.noteCommit(g, start)
	}
	var again []*request
	s.mu.Lock()
	if err == nil {
		for _, k := range g.keys {
			if p, ok := s.pending[k]; ok && p.seq == g.seq {
				delete(s.pending, k)
				if i, found := slices.BinarySearch(s.sorted, k); found {
					s.sorted = slices.Delete(s.sorted, i, i+1)
				}
			}
		}
	} else {
		// Every pending write is of g or of the open group, which ran
		// on top of g's writes.
		clear(s.pending)
		s.sorted = s.sorted[:0]
		// No later transaction of a chain that lost one may be applied.
		for _, reqs := range [][]*request{g.reqs, s.open.reqs} {
			for _, r := range reqs {
				if r.chain != nil && r.chain.failed == nil {
					r.chain.failed = fmt.Errorf("bolt: an earlier transaction of the chain failed: %w: %w", kv.ErrNotApplied, err)
				}
			}
		}
		again = s.open.reqs
		s.open = newGroup(s.open.seq + 1)
		s.taken.Broadcast()
	}
	s.mu.Unlock()
	for _, r := range again {
		r.done <- errRunAgain
	}
	if err != nil {
		// What fn returned may rest on writes of g that were not applied.
		for _, r := range g.reqs {
			r.done <- err
		}
		return
	}
	s.durMu.Lock()
	s.answered = g.seq
	s.durMu.Unlock()
	for _, r := range g.reqs {
		if r.early {
			r.done <- r.err
		}
	}
	if !durable {
		err = s.flushLog()
	}
	s.noteCommit(g, start)
	s.durMu.Lock()
	if err == nil {
		s.durable = g.seq
	}
	err = s.broken
	close(s.advanced) // wakes Sync: durable advanced, or the store broke
	s.advanced = make(chan struct{})
	s.durMu.Unlock()
	for _, r := range g.reqs {
		if r.early {
			continue
		}
		if err != nil {
			r.done <- err
			continue
		}
		r.done <- r.err
	}
}

// noteCommit updates the average commit time and reports the commit.
func (s *Store) noteCommit(g *group, start time.Time) {
	d := time.Since(start)
	if len(g.writes) > 0 {
		// An average over the last eight or so commits.
		s.commitNs += (int64(d) - s.commitNs) / 8
	}
	if s.opts.OnCommit != nil {
		s.opts.OnCommit(len(g.reqs), d)
	}
}

// flushLog makes the written groups durable: an fdatasync of the log or,
// if that fails, a checkpoint of every logged group into bbolt in a new
// epoch of the log (renewEpoch). If both fail, the store is broken: the
// groups are answered already and readable, but may not survive a crash of
// the machine, so no transaction is accepted from then on.
func (s *Store) flushLog() error {
	err := s.log.flush()
	if err == nil {
		return nil
	}
	s.opts.Logger.Error("bolt: the log's fdatasync failed; checkpointing into the database instead", "err", err)
	if cerr := s.renewEpoch(); cerr != nil {
		s.log.stale = true
		err = fmt.Errorf("bolt: acknowledged transactions could not be made durable (%v; checkpoint: %v): %w", err, cerr, kv.ErrBroken)
		s.opts.Logger.Error("bolt: store broken: no more transactions accepted", "err", err)
		s.durMu.Lock()
		s.broken = err
		s.durMu.Unlock()
		return err
	}
	return nil
}

// brokenErr returns the error that broke the store, or nil.
func (s *Store) brokenErr() error {
	s.durMu.Lock()
	defer s.durMu.Unlock()
	return s.broken
}

// logGroup writes g to the log and makes it visible in logged; durable
// reports whether it is durable already: a group too large for the log is
// committed to bbolt directly.
func (s *Store) logGroup(g *group) (durable bool, err error) {
	w := s.log
	if w.stale {
		if err := s.renewEpoch(); err != nil {
			return false, err
		}
	}
	size := recordSize(g)
	if size > w.max/2 {
		g.lsn = w.lsn + 1
		if err := s.checkpoint(g); err != nil {
			// bbolt may have made the commit durable all the same,
			// with g.lsn as the applied sequence number.
			w.stale = true
			return false, err
		}
		w.lsn = g.lsn
		return true, nil
	}
	if !w.fits(size) {
		// The other segment is reused once its records are in bbolt.
		if err := s.checkpoint(nil); err != nil {
			return false, err
		}
		w.switchSegment()
	}
	lsn := w.lsn + 1
	if err := w.write(w.encode(g, lsn), lsn); err != nil {
		// The record may be whole in the page cache even though the
		// write failed; the next group reuses its sequence number.
		w.stale = true
		return false, err
	}
	g.lsn = lsn
	s.ovMu.Lock()
	s.logged = append(s.logged, g)
	n := len(s.logged)
	s.ovMu.Unlock()
	if n >= checkpointGroups {
		select {
		case s.ckKick <- struct{}{}:
		default:
		}
	}
	return false, nil
}

// renewEpoch is called by the writer after a group failed to be made
// durable. That group's record may survive (a failed fdatasync does not say
// that nothing reached the disk, and a restart after kill -9 reads the page
// cache), under the sequence number the next group reuses: if both were
// replayed, either could win. So every logged group is checkpointed, a new
// epoch is stored with the applied sequence number in the same commit, and
// the log goes on from the start of the other segment (whose records are
// all in bbolt now), where a scan of the new epoch begins; the records of
// the old epoch are never replayed.
func (s *Store) renewEpoch() error {
	w := s.log
	epoch, err := randomEpoch()
	if err != nil {
		return err
	}
	if err := s.checkpointState(nil, epoch, w.lsn); err != nil {
		return err
	}
	w.epoch = epoch
	w.switchSegment()
	w.stale = false
	s.opts.Logger.Warn("bolt: log continues in a new epoch after a failed commit", "lsn", w.lsn)
	return nil
}

// checkpointer applies the logged groups to bbolt when enough are waiting
// or they have waited CheckpointEvery, and all of them when the store
// closes.
func (s *Store) checkpointer() {
	defer close(s.ckFinished)
	tick := time.NewTicker(s.opts.CheckpointEvery)
	defer tick.Stop()
	failing := false
	for {
		select {
		case <-s.ckStop:
			s.ckErr = s.checkpoint(nil)
			return
		case <-s.ckKick:
		case <-tick.C:
		}
		err := s.checkpoint(nil)
		if err != nil && !failing {
			// The log keeps the groups; the writer reports the
			// error once it needs the log space.
			s.opts.Logger.Warn("bolt: checkpoint failed; retrying", "err", err)
		}
		failing = err != nil
	}
}

// checkpoint applies the logged groups, and then extra if it is not nil
// (a group too large for the log), to bbolt in one durable commit.
func (s *Store) checkpoint(extra *group) error { return s.checkpointState(extra, 0, 0) }

// checkpointState is checkpoint that, when epoch is not 0, also stores it
// as the log's epoch, with applied as the last applied sequence number if
// no group is logged (the writer's last one: all are in bbolt then).
func (s *Store) checkpointState(extra *group, epoch, applied uint64) error {
	s.ckMu.Lock()
	defer s.ckMu.Unlock()
	s.ovMu.RLock()
	groups := s.logged
	s.ovMu.RUnlock()
	if extra != nil {
		groups = append(groups[:len(groups):len(groups)], extra)
	}
	if len(groups) == 0 && epoch == 0 {
		return nil
	}
	last := applied
	if len(groups) > 0 {
		last = groups[len(groups)-1].lsn
	}
	err := s.db.Update(func(tx *bbolt.Tx) error {
		b := tx.Bucket([]byte(bucketName))
		for _, g := range groups {
			for _, k := range g.keys {
				var err error
				if v := g.writes[k]; v == nil {
					err = b.Delete([]byte(k))
				} else {
					err = b.Put([]byte(k), v)
				}
				if err != nil {
					return fmt.Errorf("apply %q: %w", k, err)
				}
			}
		}
		if err := putLogState(tx, last, epoch); err != nil {
			return err
		}
		s.hwm = tx.Size()
		return nil
	})
	if err != nil {
		return fmt.Errorf("bolt: commit: %w", err)
	}
	n := len(groups)
	if extra != nil {
		n--
	}
	s.ovMu.Lock()
	s.logged = slices.Clone(s.logged[n:])
	s.ovMu.Unlock()
	if err := s.ensureSlack(); err != nil {
		// Commits stay durable without it, only slower.
		s.opts.Logger.Warn("bolt: cannot preallocate the database file", "err", err)
	}
	return nil
}

// ensureSlack extends the database file with written zeros when fewer than
// Slack/2 bytes remain past the pages bbolt uses, so that bbolt overwrites
// allocated blocks instead of filling holes. It runs in Open or under ckMu,
// so no bbolt write runs at the same time; bbolt does not touch the file
// past its own size.
func (s *Store) ensureSlack() error {
	if s.opts.Slack <= 0 || s.filesz-s.hwm >= s.opts.Slack/2 {
		return nil
	}
	f, err := os.OpenFile(s.path, os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("bolt: open for preallocation: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("bolt: stat: %w", err)
	}
	// Zeros are only ever written past the real end of the file, which
	// bbolt keeps beyond every page it uses.
	size := fi.Size()
	s.filesz = size
	if size-s.hwm >= s.opts.Slack/2 {
		return nil
	}
	const chunk = 1 << 20
	target := s.hwm + max(s.opts.Slack, s.hwm/8)
	target = (target + chunk - 1) / chunk * chunk
	zeros := make([]byte, chunk)
	for off := size; off < target; {
		n := min(int64(chunk), target-off)
		if _, err := f.WriteAt(zeros[:n], off); err != nil {
			return fmt.Errorf("bolt: preallocate: %w", err)
		}
		off += n
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("bolt: sync preallocation: %w", err)
	}
	s.filesz = target
	return nil
}
