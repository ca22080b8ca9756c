package bolt

import (
	"fmt"
	"slices"
	"testing"
)

// fuzzEpoch is the epoch of the seed logs.
const fuzzEpoch = 7

// seedLog returns n records of epoch fuzzEpoch from sequence number first.
func seedLog(first uint64, n int) []byte {
	w := &wal{epoch: fuzzEpoch}
	var out []byte
	for i := 0; i < n; i++ {
		k := fmt.Sprintf("key%d", i)
		g := &group{writes: map[string][]byte{k: []byte("value"), "gone": nil}, keys: []string{"gone", k}}
		out = append(out, w.encode(g, first+uint64(i))...)
	}
	return out
}

// FuzzScanLog scans arbitrary bytes as the two segments of a log: the scan
// must not panic, the records and gaps of a segment must cover it in order,
// the replay plan must be the consecutive records after applied, and a
// *CorruptLogError must come exactly when there is damage or a drop.
func FuzzScanLog(f *testing.F) {
	log := seedLog(1, 4)
	damaged := slices.Clone(log)
	damaged[40] ^= 1
	f.Add(log, seedLog(5, 3), uint64(0))
	f.Add(damaged, []byte{}, uint64(0))
	f.Add(seedLog(10, 2), log, uint64(4))
	f.Add(append(slices.Clone(log), make([]byte, 64)...), damaged, uint64(2))
	f.Fuzz(func(t *testing.T, seg0, seg1 []byte, applied uint64) {
		l := scanLog([2]string{"a", "b"}, [2][]byte{seg0, seg1}, fuzzEpoch)
		for i, data := range [2][]byte{seg0, seg1} {
			var at int64
			for _, it := range l.segs[i] {
				if it.off != at || it.end <= it.off {
					t.Fatalf("segment %d: item %d-%d after %d", i, it.off, it.end, at)
				}
				at = it.end
			}
			if at != int64(len(data)) {
				t.Fatalf("segment %d: items end at %d of %d", i, at, len(data))
			}
		}
		p := l.plan(applied)
		for i, r := range p.replay {
			if r.lsn != applied+1+uint64(i) {
				t.Fatalf("replay %d is LSN %d after %d", i, r.lsn, applied)
			}
		}
		if p.dropped.Count() > 0 && p.dropped.First != applied+1+uint64(len(p.replay)) {
			t.Fatalf("dropped %v after replaying %d from %d", p.dropped, len(p.replay), applied)
		}
		err := l.check("dir", p)
		if (err != nil) != (len(l.damage()) > 0 || p.dropped.Count() > 0) {
			t.Fatalf("check: %v with %d damaged and %v dropped", err, len(l.damage()), p.dropped)
		}
		if err != nil {
			_ = err.Error()
		}
	})
}

// FuzzTornTail writes the log as the writer does — a pass in segment 0,
// one in segment 1 (after which segment 0's records are all in the
// database), then a new pass over segment 0 — and tears the last record
// written: only some of its 512-byte blocks reach the disk, the others
// keeping what the earlier pass left. The block holding its header is
// written when it is the first record of the pass (see scan.go: the one
// case a scan cannot tell from damage). A scan must find no damage, and
// replay every other record after the database's.
func FuzzTornTail(f *testing.F) {
	f.Add(uint8(5), uint8(4), uint8(3), uint8(40), uint64(0b1011))
	f.Add(uint8(20), uint8(2), uint8(1), uint8(200), uint64(0b10))
	f.Add(uint8(3), uint8(3), uint8(1), uint8(0), uint64(0))
	f.Fuzz(func(t *testing.T, n0, n1, n2, size uint8, blocks uint64) {
		if n0 == 0 || n1 == 0 || n2 == 0 {
			return
		}
		w := &wal{epoch: fuzzEpoch}
		// Record i carries a value of (i*size)%3000 bytes: sizes vary.
		rec := func(lsn uint64) []byte {
			v := make([]byte, int(lsn)*int(size)%3000)
			g := &group{writes: map[string][]byte{"k": v}, keys: []string{"k"}}
			return slices.Clone(w.encode(g, lsn))
		}
		var seg0, seg1 []byte
		lsn := uint64(0)
		for range n0 {
			lsn++
			seg0 = append(seg0, rec(lsn)...)
		}
		for range n1 {
			lsn++
			seg1 = append(seg1, rec(lsn)...)
		}
		applied := lsn // the switch to segment 0 checkpointed everything
		var pass []byte
		for range n2 {
			lsn++
			pass = append(pass, rec(lsn)...)
		}
		last := rec(lsn)
		start := len(pass) - len(last)
		if len(seg0) < len(pass) {
			seg0 = append(seg0, make([]byte, len(pass)-len(seg0))...)
		}
		torn := slices.Clone(seg0)
		copy(torn, pass[:start])
		for b := 0; b*512 < len(last); b++ {
			if blocks&(1<<(b%64)) != 0 || b == 0 && n2 == 1 {
				copy(torn[start+b*512:], last[b*512:min(len(last), (b+1)*512)])
			}
		}
		l := scanLog([2]string{"0", "1"}, [2][]byte{torn, seg1}, fuzzEpoch)
		if d := l.damage(); len(d) > 0 {
			t.Fatalf("a torn tail reported as damage: %v", d[0])
		}
		p := l.plan(applied)
		if p.dropped.Count() > 0 {
			t.Fatalf("a torn tail drops %v", p.dropped)
		}
		if got := uint64(len(p.replay)); got < uint64(n2)-1 {
			t.Fatalf("replayed %d of the %d records written whole", got, n2-1)
		}
	})
}
