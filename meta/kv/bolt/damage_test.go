package bolt

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rdmafs/rdmafs/meta/kv"
)

// Each group of a log fixture puts one key, k001 for sequence number 1 and
// so on, with a value of valueSize bytes: 21 records fill a 64 KiB segment,
// fewer than checkpointGroups, so only segment switches checkpoint.
const valueSize = 3000

// logFixture is the crash image of a store that logged groups 1 to n, and
// where each record is.
type logFixture struct {
	img     string
	n       uint64
	applied uint64 // the last sequence number in bbolt
	at      map[uint64]recordLoc
}

type recordLoc struct {
	seg      int
	off, end int64
}

func (f *logFixture) path(seg int) string {
	return filepath.Join(f.img, []string{LogFile0, LogFile1}[seg])
}

func fixtureKey(lsn uint64) string { return fmt.Sprintf("k%03d", lsn) }

// writeLog logs n groups in a store with 64 KiB segments (1-21 in segment 0,
// 22-42 in segment 1, 43-63 in segment 0 again, ...) and returns its crash
// image.
func writeLog(t *testing.T, n uint64) *logFixture {
	t.Helper()
	dir, _, s := openSmallLog(t)
	for lsn := uint64(1); lsn <= n; lsn++ {
		putKV(t, s, fixtureKey(lsn), strings.Repeat("v", valueSize-4)+fixtureKey(lsn))
	}
	// The writer is idle: Update returned.
	epoch, last := s.log.epoch, s.log.lsn
	if last != n {
		t.Fatalf("logged %d groups, last sequence number %d", n, last)
	}
	f := &logFixture{img: crashImage(t, dir), n: n, at: map[uint64]recordLoc{}}
	st, err := readLogState(s.db)
	if err != nil {
		t.Fatal(err)
	}
	f.applied = st.applied
	l, err := readLog(f.img, epoch)
	if err != nil {
		t.Fatal(err)
	}
	for seg, items := range l.segs {
		for _, it := range items {
			if it.rec != nil {
				f.at[it.rec.lsn] = recordLoc{seg: seg, off: it.off, end: it.end}
			}
		}
	}
	return f
}

// mutation damages a fixture's log files.
type mutation func(t *testing.T, f *logFixture)

func rewrite(t *testing.T, path string, fn func(b []byte) []byte) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, fn(b), 0o600); err != nil {
		t.Fatal(err)
	}
}

// flip inverts the byte at offset at of record lsn.
func flip(lsn uint64, at int64) mutation {
	return func(t *testing.T, f *logFixture) {
		r := f.at[lsn]
		rewrite(t, f.path(r.seg), func(b []byte) []byte { b[r.off+at] ^= 0xff; return b })
	}
}

const payloadByte = headerSize + 20 // inside the value

// cut truncates the file in the middle of record lsn.
func cut(lsn uint64) mutation {
	return func(t *testing.T, f *logFixture) {
		r := f.at[lsn]
		rewrite(t, f.path(r.seg), func(b []byte) []byte { return b[:(r.off+r.end)/2] })
	}
}

// fill overwrites record lsn, and to the end of the file if toEnd, with
// zeros or with random bytes.
func fill(lsn uint64, toEnd, random bool) mutation {
	return func(t *testing.T, f *logFixture) {
		r := f.at[lsn]
		rewrite(t, f.path(r.seg), func(b []byte) []byte {
			end := r.end
			if toEnd {
				end = int64(len(b))
			}
			junk := b[r.off:end]
			rng := rand.New(rand.NewPCG(lsn, 1))
			for i := range junk {
				junk[i] = 0
				if random {
					junk[i] = byte(rng.Uint32())
				}
			}
			return b
		})
	}
}

// storeKeys returns the keys of the store, checking every value.
func storeKeys(t *testing.T, s *Store) []string {
	t.Helper()
	var keys []string
	err := s.View(context.Background(), func(r kv.Reader) error {
		return r.Scan(nil, nil, 0, func(k, v []byte) error {
			if len(v) != valueSize || !bytes.HasSuffix(v, k) {
				return fmt.Errorf("value of %q damaged", k)
			}
			keys = append(keys, string(k))
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

// checkKeys checks that the store holds exactly groups 1 to last.
func checkKeys(t *testing.T, s *Store, last uint64) {
	t.Helper()
	var want []string
	for lsn := uint64(1); lsn <= last; lsn++ {
		want = append(want, fixtureKey(lsn))
	}
	if got := storeKeys(t, s); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("store holds %d keys %v...; want groups 1 to %d", len(got), got[:min(len(got), 3)], last)
	}
}

// TestTornTail checks that what a crash can leave at the end of the log (a
// record cut short, garbage or zeros after the last whole record, a record
// whose header or payload is half written, the first record of a new pass
// over an older one) does not stop Open, which keeps every record before
// it.
func TestTornTail(t *testing.T) {
	for _, tt := range []struct {
		name   string
		groups uint64
		damage mutation
		keep   uint64 // the last group kept
	}{
		{"cut mid-record", 8, cut(8), 7},
		{"garbage tail", 8, fill(8, true, true), 7},
		{"zeroed tail", 8, fill(8, true, false), 7},
		{"garbage last record", 8, fill(8, false, true), 7},
		{"payload of the last record", 8, flip(8, payloadByte), 7},
		{"header of the last record", 8, flip(8, offMagic), 7},
		{"first record of segment 1", 22, flip(22, payloadByte), 21},
		{"cut first record of segment 1", 22, cut(22), 21},
		{"first record of a new pass over an older one", 43, flip(43, payloadByte), 42},
		{"garbage over an older pass", 46, fill(46, false, true), 45},
		{"zeros over an older pass", 46, fill(46, false, false), 45},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := writeLog(t, tt.groups)
			tt.damage(t, f)
			s := reopen(t, f.img, smallLogOptions)
			checkKeys(t, s, tt.keep)
			// The log goes on in a new epoch over the torn one.
			putKV(t, s, fixtureKey(tt.keep+1), strings.Repeat("v", valueSize-4)+fixtureKey(tt.keep+1))
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			checkKeys(t, reopen(t, f.img, smallLogOptions), tt.keep+1)
		})
	}
}

// TestCorruptionInTheMiddle checks that a damaged record followed by intact
// ones of a later sequence number, in the same segment or in the other
// one, makes Open fail with a *CorruptLogError that names it, writing
// nothing; and that RecoverLog then cuts the log there, keeping every
// record before it (and every record the database already held).
func TestCorruptionInTheMiddle(t *testing.T) {
	for _, tt := range []struct {
		name     string
		groups   uint64
		damage   mutation
		lsn      uint64 // the damaged record
		lsnKnown bool
		keep     uint64 // the last group kept by RecoverLog
	}{
		{"payload", 8, flip(4, payloadByte), 4, true, 3},
		{"header", 8, flip(4, offMagic), 4, false, 3},
		{"zeroed record", 8, fill(4, false, false), 4, false, 3},
		{"first record", 8, flip(1, payloadByte), 1, true, 0},
		{"first record of segment 1", 29, flip(22, payloadByte), 22, true, 21},
		{"segment 1", 29, flip(25, offLength), 25, true, 24},
		{"older segment 0", 29, flip(10, payloadByte), 10, true, 29},
		{"first record of older segment 0", 29, flip(1, payloadByte), 1, true, 29},
		{"last record of older segment 0", 29, flip(21, payloadByte), 21, true, 29},
		{"older segment 1", 43, flip(30, payloadByte), 30, true, 43},
		{"first record of a new pass over an older one", 46, flip(43, payloadByte), 43, true, 42},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := writeLog(t, tt.groups)
			tt.damage(t, f)
			before := imageFiles(t, f.img)
			_, err := Open(f.img, smallLogOptions)
			var ce *CorruptLogError
			if !errors.As(err, &ce) || !errors.Is(err, ErrCorruptLog) {
				t.Fatalf("Open of a log damaged in the middle: %v, want a *CorruptLogError", err)
			}
			d, at := ce.Damage[0], f.at[tt.lsn]
			if d.File != f.path(at.seg) || d.Offset != at.off || d.LSN != tt.lsn || d.LSNKnown != tt.lsnKnown {
				t.Fatalf("damage reported: %+v, want %s at %d, LSN %d (named: %v)", d, f.path(at.seg), at.off, tt.lsn, tt.lsnKnown)
			}
			drop := LSNRange{}
			if tt.keep < tt.groups {
				drop = LSNRange{First: tt.keep + 1, Last: tt.groups}
			}
			if ce.Drop != drop {
				t.Fatalf("Drop = %v, want %v", ce.Drop, drop)
			}
			msg := err.Error()
			t.Log(msg)
			for _, want := range []string{d.File, fmt.Sprintf("byte offset %d", d.Offset), fmt.Sprintf("LSN %d", tt.lsn),
				fmt.Sprintf(RecoverCommand, f.img)} {
				if !strings.Contains(msg, want) {
					t.Fatalf("error lacks %q: %s", want, msg)
				}
			}
			if after := imageFiles(t, f.img); after != before {
				t.Fatalf("the refused Open changed %s", after)
			}
			rep, err := RecoverLog(f.img, RecoverOptions{DryRun: true})
			if err != nil {
				t.Fatal(err)
			}
			if after := imageFiles(t, f.img); after != before {
				t.Fatalf("a dry run changed %s", after)
			}
			if rep.Dropped != drop || len(rep.Damage) == 0 || rep.Damage[0] != d {
				t.Fatalf("dry run: %+v", rep)
			}
			rep, err = RecoverLog(f.img, RecoverOptions{})
			if err != nil {
				t.Fatal(err)
			}
			replayed := LSNRange{}
			if last := min(tt.keep, tt.groups); last > f.applied {
				replayed = LSNRange{First: f.applied + 1, Last: last}
			}
			if rep.Dropped != drop || rep.Replayed != replayed || rep.Applied != f.applied {
				t.Fatalf("RecoverLog: %+v, want replayed %v, dropped %v", rep, replayed, drop)
			}
			s := reopen(t, f.img, smallLogOptions)
			checkKeys(t, s, tt.keep)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			if rep, err = RecoverLog(f.img, RecoverOptions{}); err != nil || len(rep.Damage) != 0 || rep.Dropped.Count() != 0 {
				t.Fatalf("RecoverLog after a clean close: %+v %v", rep, err)
			}
		})
	}
}

// imageFiles returns a digest of the store's files (their contents), to
// tell whether anything was written.
func imageFiles(t *testing.T, dir string) string {
	t.Helper()
	var out []string
	for _, name := range []string{FileName, LogFile0, LogFile1} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprintf("%s:%d:%x", name, len(b), crc32.ChecksumIEEE(b)))
	}
	return strings.Join(out, " ")
}

// TestRecoverLogRefusesMissingStore checks that RecoverLog does not create
// a store.
func TestRecoverLogRefusesMissingStore(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "none")
	if _, err := RecoverLog(dir, RecoverOptions{}); err == nil {
		t.Fatal("RecoverLog on a directory without a database succeeded")
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("RecoverLog created %s", dir)
	}
}
