package bolt

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/rdmafs/rdmafs/meta/kv"
	"github.com/rdmafs/rdmafs/meta/kv/kvtest"
)

func TestConformance(t *testing.T) {
	kvtest.Run(t, func(t *testing.T) kv.Store {
		s, err := Open(t.TempDir(), Options{})
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

func TestReopenKeepsData(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Update(context.Background(), func(tx kv.Txn) error { return tx.Put([]byte("k"), []byte("v")) }); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Update(context.Background(), func(tx kv.Txn) error { return nil }); err != kv.ErrClosed {
		t.Fatalf("Update after Close: %v", err)
	}
	s, err = Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var v []byte
	s.View(context.Background(), func(r kv.Reader) (err error) { v, _, err = r.Get([]byte("k")); return err })
	if string(v) != "v" {
		t.Fatalf("after reopen k = %q", v)
	}
}

// TestGroupCommit checks that concurrent transactions share commits (and so
// fsyncs) while each keeps its own outcome.
func TestGroupCommit(t *testing.T) {
	var mu sync.Mutex
	commits, txns := 0, 0
	s, err := Open(t.TempDir(), Options{OnCommit: func(n int, d time.Duration) {
		mu.Lock()
		commits++
		txns += n
		mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const workers, each = 16, 30
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < each; i++ {
				fail := i%5 == 0
				err := s.Update(context.Background(), func(tx kv.Txn) error {
					tx.Put([]byte(fmt.Sprintf("w%02d-%03d", w, i)), []byte("v"))
					if fail {
						return errBoom
					}
					return nil
				})
				if fail != (err == errBoom) {
					t.Errorf("worker %d txn %d: %v", w, i, err)
				}
			}
		}(w)
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if txns != workers*each || 4*commits > 3*txns {
		t.Fatalf("%d transactions in %d commits: no group commit", txns, commits)
	}
	n := 0
	s.View(context.Background(), func(r kv.Reader) error {
		return r.Scan([]byte("w"), nil, 0, func(k, v []byte) error { n++; return nil })
	})
	if n != workers*each*4/5 {
		t.Fatalf("%d keys stored, want %d (failed transactions must leave nothing)", n, workers*each*4/5)
	}
	t.Logf("%d transactions in %d commits", txns, commits)
}

var errBoom = errors.New("boom")

// TestPreallocation checks that the file keeps zero-filled slack beyond the
// pages in use as the database grows.
func TestPreallocation(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, Options{Slack: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	size := func() int64 {
		fi, err := os.Stat(filepath.Join(dir, FileName))
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size()
	}
	if got := size(); got < 1<<19 {
		t.Fatalf("new database file of %d bytes has no slack", got)
	}
	val := make([]byte, 4000)
	for i := 0; i < 2000; i++ {
		if err := s.Update(context.Background(), func(tx kv.Txn) error {
			return tx.Put([]byte(fmt.Sprintf("k%06d", i)), val)
		}); err != nil {
			t.Fatal(err)
		}
	}
	// Checkpoints preallocate after their commit.
	if err := s.checkpoint(nil); err != nil {
		t.Fatal(err)
	}
	var used int64
	s.db.View(func(tx *bbolt.Tx) error { used = tx.Size(); return nil })
	if got := size(); got-used < 1<<19 || used < 4<<20 {
		t.Fatalf("file %d bytes, %d used: slack not kept", got, used)
	}
}

// TestPipeline checks that a transaction sees the writes of the transactions
// that ran before it while their group is still being committed, and that
// it is answered only after that group is durable.
func TestPipeline(t *testing.T) {
	ctx := context.Background()
	release := make(chan struct{})
	var once sync.Once
	s, err := Open(t.TempDir(), Options{OnCommit: func(int, time.Duration) {
		// Hold the first group's answers until the second transaction ran.
		once.Do(func() { <-release })
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	first := make(chan error, 1)
	go func() { first <- s.Update(ctx, func(tx kv.Txn) error { return tx.Put([]byte("a"), []byte("1")) }) }()
	// Wait until the first group is committed (its answers held back).
	for {
		var ok bool
		s.View(ctx, func(r kv.Reader) (err error) { _, ok, err = r.Get([]byte("a")); return err })
		if ok {
			break
		}
		time.Sleep(time.Millisecond)
	}
	second := make(chan error, 1)
	var seen string
	ran := make(chan struct{})
	go func() {
		second <- s.Update(ctx, func(tx kv.Txn) error {
			v, _, err := tx.Get([]byte("a"))
			seen = string(v)
			close(ran)
			if err != nil {
				return err
			}
			return tx.Put([]byte("b"), v)
		})
	}()
	<-ran
	select {
	case err := <-second:
		t.Fatalf("second transaction answered before the first was: %v", err)
	case err := <-first:
		t.Fatalf("first transaction answered before OnCommit returned: %v", err)
	case <-time.After(20 * time.Millisecond):
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if err := <-second; err != nil {
		t.Fatal(err)
	}
	if seen != "1" {
		t.Fatalf("second transaction read a = %q, want the first's write", seen)
	}
}

// TestFailedCommit makes a group commit fail (the file may not grow): its
// transactions get the error, and a transaction that ran meanwhile on top of
// its writes runs again without them.
func TestFailedCommit(t *testing.T) {
	ctx := context.Background()
	committed, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	// A small log: the big write below goes to bbolt directly, where it
	// exceeds the maximum size.
	s, err := Open(t.TempDir(), Options{Slack: -1, maxSize: 1 << 20, LogSegment: 64 << 10, OnCommit: func(int, time.Duration) {
		// Hold the first group's answers until the second transaction ran.
		once.Do(func() {
			close(committed)
			<-release
		})
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	big := make([]byte, 2<<20)
	first := make(chan error, 1)
	var firstRuns atomic.Int32
	go func() {
		first <- s.Update(ctx, func(tx kv.Txn) error {
			firstRuns.Add(1)
			return tx.Put([]byte("big"), big)
		})
	}()
	<-committed
	var seen []bool
	secondRan := make(chan struct{}, 2)
	second := make(chan error, 1)
	go func() {
		second <- s.Update(ctx, func(tx kv.Txn) error {
			_, ok, err := tx.Get([]byte("big"))
			seen = append(seen, ok)
			secondRan <- struct{}{}
			if err != nil {
				return err
			}
			if ok {
				return errBoom // as a create would fail with EEXIST
			}
			return tx.Put([]byte("small"), []byte("v"))
		})
	}()
	<-secondRan
	close(release)
	if err := <-first; err == nil || !errors.Is(err, bolterrors.ErrMaxSizeReached) {
		t.Fatalf("first transaction: %v, want the commit's error", err)
	}
	if err := <-second; err != nil {
		t.Fatalf("second transaction: %v (saw big: %v), want success after running again", err, seen)
	}
	if len(seen) != 2 || !seen[0] || seen[1] {
		t.Fatalf("second transaction saw big: %v, want [true false] (ran on the failed write, then again without it)", seen)
	}
	if firstRuns.Load() != 1 {
		t.Fatalf("first transaction ran %d times", firstRuns.Load())
	}
	s.View(ctx, func(r kv.Reader) error {
		if _, ok, _ := r.Get([]byte("big")); ok {
			t.Error("the failed write is stored")
		}
		if v, _, _ := r.Get([]byte("small")); string(v) != "v" {
			t.Errorf("small = %q", v)
		}
		return nil
	})
}

// TestTooLarge checks that keys bbolt refuses fail their transaction alone.
func TestTooLarge(t *testing.T) {
	s, err := Open(t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	err = s.Update(context.Background(), func(tx kv.Txn) error {
		return tx.Put(make([]byte, bbolt.MaxKeySize+1), []byte("v"))
	})
	if err == nil {
		t.Fatal("a key over bbolt's limit was accepted")
	}
}

// crashImage copies the store's files as they are on disk now, as a crash
// would leave them: the log holds what was acknowledged since the last
// checkpoint.
func crashImage(t *testing.T, dir string) string {
	t.Helper()
	img := t.TempDir()
	for _, name := range []string{FileName, LogFile0, LogFile1} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(img, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return img
}

func mustUpdate(t *testing.T, s *Store, fn func(tx kv.Txn) error) {
	t.Helper()
	if err := s.Update(context.Background(), fn); err != nil {
		t.Fatal(err)
	}
}

func putKV(t *testing.T, s *Store, kvs ...string) {
	t.Helper()
	mustUpdate(t, s, func(tx kv.Txn) error {
		for i := 0; i+1 < len(kvs); i += 2 {
			if err := tx.Put([]byte(kvs[i]), []byte(kvs[i+1])); err != nil {
				return err
			}
		}
		return nil
	})
}

// contents returns every key=value of the store, in order, as View sees
// them, after checking that Get agrees with Scan.
func contents(t *testing.T, s *Store) string {
	t.Helper()
	var out []string
	err := s.View(context.Background(), func(r kv.Reader) error {
		return r.Scan(nil, nil, 0, func(k, v []byte) error {
			got, ok, err := r.Get(k)
			if err != nil || !ok || string(got) != string(v) {
				return fmt.Errorf("Get(%q) = %q %v %v, Scan says %q", k, got, ok, err, v)
			}
			out = append(out, string(k)+"="+string(v))
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(out, " ")
}

func reopen(t *testing.T, dir string, opts Options) *Store {
	t.Helper()
	s, err := Open(dir, opts)
	if err != nil {
		t.Fatalf("open after a crash: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestLogReplay checks that acknowledged transactions that were only in the
// log when the process died are in the store after Open, on top of what was
// checkpointed, and visible before any checkpoint.
func TestLogReplay(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, Options{CheckpointEvery: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	putKV(t, s, "a", "1", "b", "1", "d", "1")
	if err := s.checkpoint(nil); err != nil {
		t.Fatal(err)
	}
	putKV(t, s, "a", "2")
	mustUpdate(t, s, func(tx kv.Txn) error { return tx.Delete([]byte("b")) })
	putKV(t, s, "c", "1", "e", "")
	const want = "a=2 c=1 d=1 e="
	if got := contents(t, s); got != want {
		t.Fatalf("before a checkpoint: %s, want %s", got, want)
	}
	img := crashImage(t, dir)
	r := reopen(t, img, Options{})
	if got := contents(t, r); got != want {
		t.Fatalf("after replay: %s, want %s", got, want)
	}
	putKV(t, r, "f", "1")
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	r = reopen(t, img, Options{})
	if got := contents(t, r); got != want+" f=1" {
		t.Fatalf("after a clean reopen: %s", got)
	}
}

// TestTornRecord checks that a record damaged by a crash during its write
// (so never acknowledged) ends the replay, keeping what came before.
func TestTornRecord(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, Options{CheckpointEvery: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	putKV(t, s, "a", "1")
	putKV(t, s, "b", "1")
	last := s.log.off // the writer is idle: Update returned
	putKV(t, s, "c", "1")
	img := crashImage(t, dir)
	f, err := os.OpenFile(filepath.Join(img, LogFile0), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{0xff}, last+headerSize+1); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if got := contents(t, reopen(t, img, Options{})); got != "a=1 b=1" {
		t.Fatalf("after a torn record: %s, want a=1 b=1", got)
	}
}

// TestParseSegment checks what a segment scan finds: the intact records of
// the epoch, and gaps where a record is damaged, of another epoch, or where
// zeros follow; a record left from the segment's previous pass (a lower
// sequence number) is found too.
func TestParseSegment(t *testing.T) {
	w := &wal{epoch: 7}
	rec := func(lsn uint64, k string) []byte {
		g := &group{writes: map[string][]byte{k: []byte("v")}, keys: []string{k}}
		return append([]byte{}, w.encode(g, lsn)...)
	}
	// shape returns the record sequence numbers and gaps ("-") in order.
	shape := func(data []byte, epoch uint64) string {
		var out []string
		for _, it := range parseSegment(data, epoch) {
			if it.rec == nil {
				out = append(out, "-")
				continue
			}
			out = append(out, fmt.Sprint(it.rec.lsn))
		}
		return strings.Join(out, " ")
	}
	good := slices.Concat(rec(3, "a"), rec(4, "b"))
	w.epoch = 6
	stale := rec(5, "c")
	w.epoch = 7
	bad := slices.Concat(good, rec(5, "c"))
	bad[len(bad)-1] ^= 1
	for _, tt := range []struct {
		name  string
		data  []byte
		epoch uint64
		want  string
	}{
		{"intact", good, 7, "3 4"},
		{"another epoch", good, 8, "-"},
		{"older record", slices.Concat(good, rec(2, "old"), rec(5, "c")), 7, "3 4 2 5"},
		{"earlier epoch", slices.Concat(good, stale), 7, "3 4 -"},
		{"damaged", bad, 7, "3 4 -"},
		{"damaged then intact", slices.Concat(bad, rec(6, "d")), 7, "3 4 - 6"},
		{"zeros", append(slices.Clone(good), make([]byte, 100)...), 7, "3 4 -"},
		{"empty", nil, 7, ""},
	} {
		if got := shape(tt.data, tt.epoch); got != tt.want {
			t.Errorf("%s: %q, want %q", tt.name, got, tt.want)
		}
	}
}

// smallLogOptions gives a store two 64 KiB log segments and no timed
// checkpoint, so that tests fill and switch segments with little data.
var smallLogOptions = Options{LogSegment: 64 << 10, CheckpointEvery: time.Hour}

// openSmallLog opens a store with smallLogOptions in a new directory; it is
// closed when the test ends.
func openSmallLog(t *testing.T) (string, Options, *Store) {
	t.Helper()
	dir := t.TempDir()
	s, err := Open(dir, smallLogOptions)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return dir, smallLogOptions, s
}

// TestLogSegments writes far more than the log holds, so that both segments
// are reused several times, then replays a crash image.
func TestLogSegments(t *testing.T) {
	dir, _, s := openSmallLog(t)
	val := strings.Repeat("v", 2000)
	want := map[string]string{}
	for i := 0; i < 400; i++ {
		k, v := fmt.Sprintf("k%02d", i%50), fmt.Sprintf("%s%d", val, i)
		putKV(t, s, k, v)
		want[k] = v
	}
	img := crashImage(t, dir)
	r := reopen(t, img, Options{LogSegment: 64 << 10})
	var keys []string
	for k := range want {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var exp []string
	for _, k := range keys {
		exp = append(exp, k+"="+want[k])
	}
	if got := contents(t, r); got != strings.Join(exp, " ") {
		t.Fatalf("after replay the store differs from what was acknowledged")
	}
}

// TestLargeGroup checks that a group too large for the log is committed to
// bbolt directly, after the logged groups before it and before those after.
func TestLargeGroup(t *testing.T) {
	dir, opts, s := openSmallLog(t)
	putKV(t, s, "k", "1", "x", "1")
	big := strings.Repeat("b", 40<<10)
	putKV(t, s, "k", "2", "big", big)
	mustUpdate(t, s, func(tx kv.Txn) error { return tx.Delete([]byte("x")) })
	want := "big=" + big + " k=2"
	if got := contents(t, s); got != want {
		t.Fatalf("live store differs")
	}
	if got := contents(t, reopen(t, crashImage(t, dir), opts)); got != want {
		t.Fatalf("after replay the store differs")
	}
}

// TestCloseCheckpoints checks that after Close bbolt holds everything, so
// the log is not needed to read the database file.
func TestCloseCheckpoints(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, Options{CheckpointEvery: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	putKV(t, s, "a", "1")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := bbolt.Open(filepath.Join(dir, FileName), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.View(func(tx *bbolt.Tx) error {
		if v := tx.Bucket([]byte(bucketName)).Get([]byte("a")); string(v) != "1" {
			t.Errorf("bbolt after Close: a = %q", v)
		}
		return nil
	})
}

// TestCheckpointFailureKeepsLog makes checkpoints fail (bbolt may not grow):
// acknowledged transactions stay readable and in the log, Close reports
// the failure, and the next Open applies them.
func TestCheckpointFailureKeepsLog(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, Options{Slack: -1, maxSize: 1 << 20, CheckpointEvery: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	val := strings.Repeat("v", 50<<10)
	for i := 0; i < 30; i++ {
		putKV(t, s, fmt.Sprintf("k%02d", i), val)
	}
	if err := s.checkpoint(nil); err == nil {
		t.Fatal("checkpoint of 1.5 MB into a database limited to 1 MiB succeeded")
	}
	if got := strings.Count(contents(t, s), "="); got != 30 {
		t.Fatalf("%d keys readable after the failed checkpoint, want 30", got)
	}
	if err := s.Close(); err == nil {
		t.Fatal("Close did not report the failed checkpoint")
	}
	r := reopen(t, dir, Options{})
	if got := strings.Count(contents(t, r), "="); got != 30 {
		t.Fatalf("%d keys after reopening, want 30", got)
	}
}

// TestFailedSyncThenSegmentSwitch makes the fdatasync of a record fail
// after the write: the group is made durable by a checkpoint into bbolt
// instead, and its transaction succeeds. The log goes on in a new epoch
// from the other segment; a restart must replay the later groups and no
// record of the old epoch.
func TestFailedSyncThenSegmentSwitch(t *testing.T) {
	dir, opts, s := openSmallLog(t)
	var fail atomic.Bool
	errIO := errors.New("injected EIO")
	s.log.sync = func(f *os.File) error {
		if fail.Load() {
			return errIO
		}
		return fdatasync(f)
	}
	val := strings.Repeat("v", 10000)
	for i := 0; i < 5; i++ {
		putKV(t, s, fmt.Sprintf("k%d", i), val)
	}
	fail.Store(true)
	if err := s.Update(context.Background(), func(tx kv.Txn) error { return tx.Put([]byte("checkpointed"), []byte("x")) }); err != nil {
		t.Fatalf("Update whose log record could not be synced but was checkpointed: %v", err)
	}
	fail.Store(false)
	putKV(t, s, "acked", strings.Repeat("a", 20000))
	want := contents(t, s)
	if !strings.Contains(want, "checkpointed=") || !strings.Contains(want, "acked=") {
		t.Fatalf("live store: an acknowledged write is missing")
	}
	got := contents(t, reopen(t, crashImage(t, dir), opts))
	if got != want {
		t.Fatalf("after replay: checkpointed group present: %v, acked group present: %v (want both)",
			strings.Contains(got, "checkpointed="), strings.Contains(got, "acked="))
	}
}

// TestEarlyReply holds the log's fdatasync: UpdateLogged returns before it,
// readers see the write, a crash image of that moment has it only in the
// log's page cache (which a copy of the files reads), Update and Sync wait
// for the fdatasync, and afterwards a restart has everything.
func TestEarlyReply(t *testing.T) {
	dir, opts, s := openSmallLog(t)
	ctx := context.Background()
	entered, release := make(chan struct{}, 16), make(chan struct{})
	var hold atomic.Bool
	s.log.sync = func(f *os.File) error {
		if hold.Load() {
			entered <- struct{}{}
			<-release
		}
		return fdatasync(f)
	}
	putKV(t, s, "before", "1")
	hold.Store(true)
	if err := s.UpdateLogged(ctx, func(tx kv.Txn) error { return tx.Put([]byte("early"), []byte("2")) }); err != nil {
		t.Fatal(err)
	}
	<-entered // the writer is in the fdatasync of early's group
	if got := contents(t, s); !strings.Contains(got, "early=2") {
		t.Fatalf("an acknowledged early write is not readable: %s", got)
	}
	durable := make(chan error, 1)
	go func() {
		durable <- s.Update(ctx, func(tx kv.Txn) error { return tx.Put([]byte("durable"), []byte("3")) })
	}()
	synced := make(chan error, 1)
	go func() { synced <- s.Sync(ctx) }()
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	if err := s.Sync(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Sync during a held fdatasync: %v, want the context's deadline", err)
	}
	cancel()
	select {
	case err := <-durable:
		t.Fatalf("Update returned (%v) while the fdatasync before its group was held", err)
	case err := <-synced:
		t.Fatalf("Sync returned (%v) while the fdatasync was held", err)
	default:
	}
	hold.Store(false)
	close(release)
	if err := <-synced; err != nil {
		t.Fatal(err)
	}
	if err := <-durable; err != nil {
		t.Fatal(err)
	}
	if err := s.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	want := contents(t, s)
	if got := contents(t, reopen(t, crashImage(t, dir), opts)); got != want {
		t.Fatalf("after replay:\n%s\nwant\n%s", got, want)
	}
}

// TestBrokenStore makes both the log's fdatasync and the checkpoint that
// replaces it fail after an early reply: the store refuses transactions
// from then on, and Sync reports it.
func TestBrokenStore(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, Options{Slack: -1, maxSize: 1 << 20, LogSegment: 4 << 20, CheckpointEvery: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	errIO := errors.New("injected EIO")
	var fail atomic.Bool
	s.log.sync = func(f *os.File) error {
		if fail.Load() {
			return errIO
		}
		return fdatasync(f)
	}
	// 1.5 MB in the log: the checkpoint of it cannot fit in 1 MiB.
	val := strings.Repeat("v", 50<<10)
	for i := 0; i < 30; i++ {
		putKV(t, s, fmt.Sprintf("k%02d", i), val)
	}
	fail.Store(true)
	if err := s.UpdateLogged(ctx, func(tx kv.Txn) error { return tx.Put([]byte("early"), []byte("x")) }); err != nil {
		t.Fatalf("UpdateLogged: %v (it is answered before the fdatasync)", err)
	}
	if err := s.Sync(ctx); !errors.Is(err, kv.ErrBroken) {
		t.Fatalf("Sync after a failed fdatasync and checkpoint: %v, want ErrBroken", err)
	}
	if err := s.Update(ctx, func(tx kv.Txn) error { return tx.Put([]byte("later"), []byte("y")) }); !errors.Is(err, kv.ErrBroken) {
		t.Fatalf("Update on a broken store: %v, want ErrBroken", err)
	}
}
