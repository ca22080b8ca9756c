// Package bolt is the embedded kv.Store backend on bbolt, with pipelined
// group commit: transactions run one after another as they arrive, against
// the durable state plus the writes of the transactions before them that are
// not durable yet, while a single writer commits the previous group with one
// bbolt transaction and one fsync. Each transaction keeps its own
// all-or-nothing semantics, and its outcome is reported only once it and
// everything it read are durable.
package bolt

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/rdmafs/rdmafs/meta/kv"
)

// FileName is the name of the database file inside the data directory.
const FileName = "meta.db"

// bucketName is the one bucket that holds every key.
const bucketName = "rdmafs"

// Options tunes a Store.
type Options struct {
	// MaxBatch bounds the number of transactions committed together
	// (default 1024).
	MaxBatch int
	// Linger is how long the writer waits for one more transaction when
	// fewer are waiting than there were concurrent writers recently: the
	// writers of the previous group, between two Update calls (default
	// 500µs; negative disables waiting).
	Linger time.Duration
	// MaxLinger bounds the whole wait before a group commit while
	// transactions keep arriving (default 10×Linger).
	MaxLinger time.Duration
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
}

// Store is a kv.Store on a bbolt file.
type Store struct {
	db   *bbolt.DB
	opts Options
	path string

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

	hwm      int64        // bytes of the file bbolt uses (writer only)
	filesz   int64        // file size when last checked; the file never shrinks (writer only)
	inflight atomic.Int64 // Update calls not yet returned
	peak     atomic.Int64 // highest inflight since the writer last reset it
}

// group is the transactions committed together.
type group struct {
	seq  uint64
	reqs []*request
	// writes merges the writes of the group's successful transactions in
	// the order they ran; a nil value is a deletion.
	writes map[string][]byte
}

// pendingWrite is the latest value a run transaction wrote to a key that
// is not durable yet.
type pendingWrite struct {
	value []byte // nil: deleted
	seq   uint64 // the group of the transaction that wrote it
}

type request struct {
	err  error      // what fn returned (set under mu)
	done chan error // the outcome, once the request's group is durable
}

// errRunAgain tells Update that its transaction read writes of a group that
// failed to commit, so nothing of it was applied and it must run again.
var errRunAgain = errors.New("bolt: run the transaction again")

// Open opens (creating if needed) the database in dir.
func Open(dir string, opts Options) (*Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("bolt: create data dir: %w", err)
	}
	path := filepath.Join(dir, FileName)
	// The freelist is rebuilt at open instead of being written at every
	// commit: fewer pages per fsync, same durability.
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: 2 * time.Second, NoFreelistSync: true,
		FreelistType: bbolt.FreelistMapType, MaxSize: opts.maxSize})
	if err != nil {
		return nil, fmt.Errorf("bolt: open %s: %w", path, err)
	}
	if err := db.Update(func(tx *bbolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists([]byte(bucketName))
		return err
	}); err != nil {
		db.Close()
		return nil, fmt.Errorf("bolt: create bucket: %w", err)
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
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Slack == 0 {
		opts.Slack = 4 << 20
	}
	s := &Store{db: db, opts: opts, path: path, open: newGroup(1), pending: map[string]pendingWrite{},
		kick: make(chan struct{}, 1), finished: make(chan struct{})}
	s.taken = sync.NewCond(&s.mu)

	if err := db.View(func(tx *bbolt.Tx) error { s.hwm = tx.Size(); return nil }); err != nil {
		db.Close()
		return nil, fmt.Errorf("bolt: read size: %w", err)
	}
	if err := s.ensureSlack(); err != nil {
		db.Close()
		return nil, err
	}
	go s.writer()
	return s, nil
}

func newGroup(seq uint64) *group { return &group{seq: seq, writes: map[string][]byte{}} }

// View implements kv.Store. It reads the durable state only.
func (s *Store) View(ctx context.Context, fn func(kv.Reader) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.db.View(func(tx *bbolt.Tx) error {
		return fn(&reader{b: tx.Bucket([]byte(bucketName))})
	})
}

// Update implements kv.Store. fn runs at once, serialized with the other
// transactions, and joins the open group; Update returns when the writer
// has committed that group.
func (s *Store) Update(ctx context.Context, fn func(kv.Txn) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	n := s.inflight.Add(1)
	for p := s.peak.Load(); n > p && !s.peak.CompareAndSwap(p, n); p = s.peak.Load() {
	}
	defer s.inflight.Add(-1)
	r := &request{done: make(chan error, 1)}
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
		s.taken.Wait()
	}
	if s.closed {
		return kv.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	// A read transaction per run: the writer may need every read
	// transaction closed to grow the memory map while it commits.
	tx, err := s.db.Begin(false)
	if err != nil {
		return fmt.Errorf("bolt: begin: %w", err)
	}
	t := &txn{reader: reader{b: tx.Bucket([]byte(bucketName))}, pending: s.pending, sorted: s.sorted, writes: map[string][]byte{}}
	r.err = callSafely(fn, t)
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
	s.arrived = time.Now()
	// Wake the writer when it may be idle, or when the group it lingers
	// for is complete; otherwise it wakes by itself once arrivals pause.
	if len(g.reqs) == 1 || s.want > 0 && len(g.reqs) >= s.want {
		select {
		case s.kick <- struct{}{}:
		default:
		}
	}
	return nil
}

// Close waits for the transactions that ran and closes the database.
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
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("bolt: close: %w", err)
	}
	return nil
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
		if len(s.open.reqs) == 0 {
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return
			}
			<-s.kick
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
		if want := min(int(s.peak.Load()), s.opts.MaxBatch); len(s.open.reqs) < want && s.opts.Linger > 0 && !s.closed {
			start := time.Now()
			deadline := start.Add(s.opts.MaxLinger)
			s.want = want
			for len(s.open.reqs) < want && !s.closed {
				until := start.Add(s.opts.Linger)
				if s.arrived.After(start) {
					until = s.arrived.Add(s.opts.Linger)
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
// transactions. If the commit fails, the transactions that ran after g's
// (and may have read its writes) run again.
func (s *Store) commit(g *group) {
	start := time.Now()
	var err error
	if len(g.writes) > 0 {
		keys := make([]string, 0, len(g.writes))
		for k := range g.writes {
			keys = append(keys, k)
		}
		slices.Sort(keys) // bbolt inserts in key order fastest
		err = s.db.Update(func(tx *bbolt.Tx) error {
			b := tx.Bucket([]byte(bucketName))
			for _, k := range keys {
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
			s.hwm = tx.Size()
			return nil
		})
		if err != nil {
			err = fmt.Errorf("bolt: commit: %w", err)
		}
	}
	if s.opts.OnCommit != nil {
		s.opts.OnCommit(len(g.reqs), time.Since(start))
	}
	var again []*request
	s.mu.Lock()
	if err == nil {
		for k := range g.writes {
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
		again = s.open.reqs
		s.open = newGroup(s.open.seq + 1)
		s.taken.Broadcast()
	}
	s.mu.Unlock()
	for _, r := range again {
		r.done <- errRunAgain
	}
	for _, r := range g.reqs {
		switch {
		case err != nil:
			// What fn returned may rest on writes of g that were
			// not applied.
			r.done <- err
		default:
			r.done <- r.err
		}
	}
	if err == nil {
		if err := s.ensureSlack(); err != nil {
			// Commits stay durable without it, only slower.
			s.opts.Logger.Warn("bolt: cannot preallocate the database file", "err", err)
		}
	}
}

// ensureSlack extends the database file with written zeros when fewer than
// Slack/2 bytes remain past the pages bbolt uses, so that bbolt overwrites
// allocated blocks instead of filling holes. Only the committer (or Open)
// calls it, so no bbolt write runs at the same time; bbolt does not touch
// the file past its own size.
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

func callSafely(fn func(kv.Txn) error, t kv.Txn) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("bolt: transaction panicked: %v", p)
		}
	}()
	return fn(t)
}

// reader reads a bucket; it copies values out so they outlive the transaction.
type reader struct {
	b *bbolt.Bucket
}

// Get implements kv.Reader.
func (r *reader) Get(key []byte) ([]byte, bool, error) {
	v := r.b.Get(key)
	if v == nil {
		return nil, false, nil
	}
	return append([]byte{}, v...), true, nil
}

// Scan implements kv.Reader.
func (r *reader) Scan(start, end []byte, limit int, fn func(k, v []byte) error) error {
	c := r.b.Cursor()
	n := 0
	for k, v := c.Seek(start); k != nil; k, v = c.Next() {
		if end != nil && bytes.Compare(k, end) >= 0 {
			break
		}
		if limit > 0 && n >= limit {
			break
		}
		n++
		if err := fn(k, v); err != nil {
			if errors.Is(err, kv.ErrStop) {
				return nil
			}
			return err
		}
	}
	return nil
}

// txn runs one transaction: reads see its own buffered writes first, then
// the pending writes of the transactions that ran before it, then the
// durable state.
type txn struct {
	reader
	pending map[string]pendingWrite // not durable yet; read only
	sorted  []string                // the keys of pending in order; read only
	writes  map[string][]byte       // this transaction's; nil value: deleted
}

// Get implements kv.Reader, seeing the transaction's own writes.
func (t *txn) Get(key []byte) ([]byte, bool, error) {
	v, ok := t.writes[string(key)]
	if !ok {
		var p pendingWrite
		if p, ok = t.pending[string(key)]; ok {
			v = p.value
		}
	}
	if ok {
		if v == nil {
			return nil, false, nil
		}
		return append([]byte{}, v...), true, nil
	}
	return t.reader.Get(key)
}

// Put implements kv.Txn. It refuses what bbolt would refuse, so that one
// transaction cannot fail the commit of its whole group.
func (t *txn) Put(key, value []byte) error {
	switch {
	case len(key) == 0:
		return errors.New("bolt: empty key")
	case len(key) > bbolt.MaxKeySize:
		return fmt.Errorf("bolt: key of %d bytes exceeds %d", len(key), bbolt.MaxKeySize)
	case int64(len(value)) > bbolt.MaxValueSize:
		return fmt.Errorf("bolt: value of %d bytes exceeds %d", len(value), bbolt.MaxValueSize)
	}
	if value == nil {
		value = []byte{}
	}
	t.writes[string(key)] = append([]byte{}, value...)
	return nil
}

// Delete implements kv.Txn.
func (t *txn) Delete(key []byte) error {
	if len(key) == 0 || len(key) > bbolt.MaxKeySize {
		return nil // no such key can exist
	}
	t.writes[string(key)] = nil // tombstone
	return nil
}

// Scan merges the buffered and pending writes into the bucket's ordered
// keys.
func (t *txn) Scan(start, end []byte, limit int, fn func(k, v []byte) error) error {
	type write struct {
		key   string
		value []byte
	}
	var over []write
	in := func(k string) bool {
		return k >= string(start) && (end == nil || k < string(end))
	}
	for k, v := range t.writes {
		if in(k) {
			over = append(over, write{k, v})
		}
	}
	i, _ := slices.BinarySearch(t.sorted, string(start))
	for _, k := range t.sorted[i:] {
		if !in(k) {
			break
		}
		if _, mine := t.writes[k]; !mine {
			over = append(over, write{k, t.pending[k].value})
		}
	}
	if len(over) == 0 {
		return t.reader.Scan(start, end, limit, fn)
	}
	sort.Slice(over, func(i, j int) bool { return over[i].key < over[j].key })
	n := 0
	emit := func(k, v []byte) (bool, error) {
		if limit > 0 && n >= limit {
			return false, nil
		}
		n++
		if err := fn(k, v); err != nil {
			if errors.Is(err, kv.ErrStop) {
				return false, nil
			}
			return false, err
		}
		return true, nil
	}
	c := t.b.Cursor()
	k, v := c.Seek(start)
	for {
		if k != nil && end != nil && bytes.Compare(k, end) >= 0 {
			k = nil
		}
		if k == nil && len(over) == 0 {
			return nil
		}
		var cont bool
		var err error
		switch {
		case len(over) > 0 && (k == nil || over[0].key <= string(k)):
			w := over[0]
			over = over[1:]
			if k != nil && w.key == string(k) {
				k, v = c.Next()
			}
			if w.value == nil {
				continue
			}
			cont, err = emit([]byte(w.key), w.value)
		default:
			cont, err = emit(k, v)
			k, v = c.Next()
		}
		if err != nil || !cont {
			return err
		}
	}
}
