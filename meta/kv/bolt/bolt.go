// Package bolt is the embedded kv.Store backend on bbolt, with group commit:
// concurrent Update calls are coalesced into one bbolt write transaction and
// one fsync, while each keeps its own all-or-nothing semantics.
package bolt

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
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
	// Linger bounds how long the committer waits for transactions of
	// writers that are between two Update calls (default 500µs; negative
	// disables it).
	Linger time.Duration
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
}

// Store is a kv.Store on a bbolt file.
type Store struct {
	db       *bbolt.DB
	opts     Options
	reqs     chan *request
	mu       sync.RWMutex // guards closed against sends on reqs
	closed   bool
	finished chan struct{}
	path     string
	hwm      int64        // bytes of the file bbolt uses (committer only)
	filesz   int64        // file size when last checked; the file never shrinks (committer only)
	inflight atomic.Int64 // Update calls not yet returned
	peak     atomic.Int64 // highest inflight since the committer last reset it
}

type request struct {
	ctx  context.Context
	fn   func(kv.Txn) error
	done chan error
}

// Open opens (creating if needed) the database in dir.
func Open(dir string, opts Options) (*Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("bolt: create data dir: %w", err)
	}
	path := filepath.Join(dir, FileName)
	// The freelist is rebuilt at open instead of being written at every
	// commit: fewer pages per fsync, same durability.
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: 2 * time.Second, NoFreelistSync: true, FreelistType: bbolt.FreelistMapType})
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
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Slack == 0 {
		opts.Slack = 4 << 20
	}
	s := &Store{db: db, opts: opts, path: path, reqs: make(chan *request, opts.MaxBatch), finished: make(chan struct{})}
	if err := db.View(func(tx *bbolt.Tx) error { s.hwm = tx.Size(); return nil }); err != nil {
		db.Close()
		return nil, fmt.Errorf("bolt: read size: %w", err)
	}
	if err := s.ensureSlack(); err != nil {
		db.Close()
		return nil, err
	}
	go s.committer()
	return s, nil
}

// View implements kv.Store.
func (s *Store) View(ctx context.Context, fn func(kv.Reader) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.db.View(func(tx *bbolt.Tx) error {
		return fn(&reader{b: tx.Bucket([]byte(bucketName))})
	})
}

// Update implements kv.Store. Transactions are queued for the committer,
// which runs them one after another inside one bbolt transaction and commits
// them with one fsync.
func (s *Store) Update(ctx context.Context, fn func(kv.Txn) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	r := &request{ctx: ctx, fn: fn, done: make(chan error, 1)}
	n := s.inflight.Add(1)
	for p := s.peak.Load(); n > p && !s.peak.CompareAndSwap(p, n); p = s.peak.Load() {
	}
	defer s.inflight.Add(-1)
	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		return kv.ErrClosed
	}
	s.reqs <- r
	s.mu.RUnlock()
	// Once queued the outcome must be awaited: returning early would leave
	// the caller unsure whether its transaction committed. The committer
	// skips requests whose context ended before they ran.
	return <-r.done
}

// Close waits for queued transactions and closes the database.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return kv.ErrClosed
	}
	s.closed = true
	close(s.reqs)
	s.mu.Unlock()
	<-s.finished
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("bolt: close: %w", err)
	}
	return nil
}

func (s *Store) committer() {
	defer close(s.finished)
	batch := make([]*request, 0, s.opts.MaxBatch)
	results := make([]error, 0, s.opts.MaxBatch)
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
		// Under concurrent load the writers of the previous group are
		// sending their next transactions right now: linger briefly until
		// as many transactions are queued as there were concurrent writers
		// recently, so that they share the fsync; never for a single writer.
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
		results = results[:0]
		for range batch {
			results = append(results, nil)
		}
		start := time.Now()
		err := s.db.Update(func(tx *bbolt.Tx) error {
			b := tx.Bucket([]byte(bucketName))
			for i, r := range batch {
				if err := r.ctx.Err(); err != nil {
					results[i] = err
					continue
				}
				t := &txn{reader: reader{b: b}, writes: map[string][]byte{}}
				if err := callSafely(r.fn, t); err != nil {
					results[i] = err
					continue
				}
				if err := t.apply(b); err != nil {
					return err
				}
			}
			s.hwm = tx.Size()
			return nil
		})

		if s.opts.OnCommit != nil {
			s.opts.OnCommit(len(batch), time.Since(start))
		}
		for i, r := range batch {
			if err != nil && results[i] == nil {
				results[i] = fmt.Errorf("bolt: commit: %w", err)
			}
			r.done <- results[i]
		}
		if err == nil {
			if err := s.ensureSlack(); err != nil {
				// Commits stay durable without it, only slower.
				s.opts.Logger.Warn("bolt: cannot preallocate the database file", "err", err)
			}
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

// txn buffers writes so that a failing transaction inside a group commit
// leaves no trace; reads see the buffered writes first.
type txn struct {
	reader
	writes map[string][]byte // nil value: deleted
}

// Get implements kv.Reader, seeing the transaction's own writes.
func (t *txn) Get(key []byte) ([]byte, bool, error) {
	if v, ok := t.writes[string(key)]; ok {
		if v == nil {
			return nil, false, nil
		}
		return append([]byte{}, v...), true, nil
	}
	return t.reader.Get(key)
}

// Put implements kv.Txn.
func (t *txn) Put(key, value []byte) error {
	if len(key) == 0 {
		return errors.New("bolt: empty key")
	}
	if value == nil {
		value = []byte{}
	}
	t.writes[string(key)] = append([]byte{}, value...)
	return nil
}

// Delete implements kv.Txn.
func (t *txn) Delete(key []byte) error {
	t.writes[string(key)] = nil // tombstone
	return nil
}

// Scan merges the buffered writes into the bucket's ordered keys.
func (t *txn) Scan(start, end []byte, limit int, fn func(k, v []byte) error) error {
	var pending []string
	for k := range t.writes {
		kb := []byte(k)
		if bytes.Compare(kb, start) >= 0 && (end == nil || bytes.Compare(kb, end) < 0) {
			pending = append(pending, k)
		}
	}
	if len(pending) == 0 {
		return t.reader.Scan(start, end, limit, fn)
	}
	sort.Strings(pending)
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
		if k == nil && len(pending) == 0 {
			return nil
		}
		var cont bool
		var err error
		switch {
		case len(pending) > 0 && (k == nil || pending[0] <= string(k)):
			pk := pending[0]
			pending = pending[1:]
			if k != nil && pk == string(k) {
				k, v = c.Next()
			}
			pv := t.writes[pk]
			if pv == nil {
				continue
			}
			cont, err = emit([]byte(pk), pv)
		default:
			cont, err = emit(k, v)
			k, v = c.Next()
		}
		if err != nil || !cont {
			return err
		}
	}
}

func (t *txn) apply(b *bbolt.Bucket) error {
	for k, v := range t.writes {
		var err error
		if v == nil {
			err = b.Delete([]byte(k))
		} else {
			err = b.Put([]byte(k), v)
		}
		if err != nil {
			return fmt.Errorf("bolt: apply %q: %w", k, err)
		}
	}
	return nil
}
