package bolt

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Reading the log. A scan reads each segment from its start and finds every
// intact record of the current epoch in it: where the bytes at an offset are
// not one, it searches forward, on the magic number, for the next one that
// is, and the bytes in between are a gap. The log's design leaves gaps
// where nothing is lost: zeros ahead of the records, what is left of
// earlier passes behind the new ones (records of earlier epochs, records of
// this one with lower sequence numbers, the middle of a record cut by a
// newer one), and the record that was being written when the process died
// (the torn tail). A gap is damage in the middle of the log when the log's
// order says that its record was followed by records that are intact:
//
//   - Within a segment, a pass writes records from the start with
//     increasing sequence numbers, so a gap followed in the same segment by a
//     record with a higher sequence number than every record before it is
//     inside the pass: damage. Before the first record of the segment that
//     holds the newest record come the records of the other segment, which
//     the writer left for it.
//   - A gap whose header is intact (magic number and epoch) names its record's
//     sequence number. If that is above every record before it and some
//     intact record has a higher one, the record was followed by others, in
//     either segment: damage. (The torn tail names the highest sequence
//     number of all.)
//   - The segment that does not hold the newest record may begin with the
//     torn tail: the first record of a new pass, with its header written. Its
//     other records were all checkpointed when the writer left it, and that
//     torn write may have damaged them, so it is not searched for damage.
//
// What is left is a torn tail, or junk of earlier passes. One torn write
// is taken for damage: the first record of a new pass whose header block did
// not reach the disk while a later block did, damaging a checkpointed record
// of the older pass under it. Open then refuses although nothing
// acknowledged is lost, and its error says that RecoverLog drops nothing.

// recordMagicBytes is recordMagic as it is on disk.
var recordMagicBytes = binary.BigEndian.AppendUint32(nil, recordMagic)

// item is an intact record of the epoch found in a segment, or the gap up
// to the next one.
type item struct {
	off, end int64
	rec      *record // nil: a gap
	// For a gap: what is wrong at off and, when the bytes at off are the
	// header of a record of the epoch, the sequence number it names.
	why    string
	hdrLSN uint64
	hdrOK  bool
}

// parseSegment returns the intact records of the epoch in a segment and the
// gaps between them, in file order; together they cover data.
func parseSegment(data []byte, epoch uint64) []item {
	var items []item
	for off := 0; off < len(data); {
		r, n, why := decodeRecord(data[off:], epoch)
		if why == "" {
			items = append(items, item{off: int64(off), end: int64(off + n), rec: &r})
			off += n
			continue
		}
		g := item{off: int64(off), why: why}
		g.hdrLSN, g.hdrOK = epochHeader(data[off:], epoch)
		off = resync(data, off+1, epoch)
		g.end = int64(off)
		items = append(items, g)
	}
	return items
}

// resync returns the offset of the next intact record of the epoch in data
// from from on, or len(data).
func resync(data []byte, from int, epoch uint64) int {
	for from < len(data) {
		i := bytes.Index(data[from:], recordMagicBytes)
		if i < 0 {
			break
		}
		at := from + i
		if _, _, why := decodeRecord(data[at:], epoch); why == "" {
			return at
		}
		from = at + 1
	}
	return len(data)
}

// epochHeader returns the sequence number in the record header at the start
// of b if it has the magic number and the epoch.
func epochHeader(b []byte, epoch uint64) (uint64, bool) {
	if len(b) < headerSize || binary.BigEndian.Uint32(b[offMagic:]) != recordMagic ||
		binary.BigEndian.Uint64(b[offEpoch:]) != epoch {
		return 0, false
	}
	return binary.BigEndian.Uint64(b[offLSN:]), true
}

// decodeRecord decodes the record at the start of b and returns it with its
// size, or says why there is no intact record of the epoch there.
func decodeRecord(b []byte, epoch uint64) (record, int, string) {
	if len(b) < headerSize {
		return record{}, 0, "no record header (end of the segment)"
	}
	if binary.BigEndian.Uint32(b[offMagic:]) != recordMagic {
		return record{}, 0, "no record header"
	}
	if binary.BigEndian.Uint64(b[offEpoch:]) != epoch {
		return record{}, 0, "record of another epoch"
	}
	n := int64(binary.BigEndian.Uint32(b[offLength:]))
	if n > int64(len(b)-headerSize) {
		return record{}, 0, "record cut short"
	}
	rec := b[:headerSize+n]
	if binary.BigEndian.Uint32(rec[offChecksum:]) != checksum(rec) {
		return record{}, 0, "checksum mismatch"
	}
	r, ok := decodePayload(rec[headerSize:])
	if !ok {
		return record{}, 0, "malformed payload"
	}
	r.lsn = binary.BigEndian.Uint64(rec[offLSN:])
	return r, int(headerSize + n), ""
}

// logScan is what the two segments hold for an epoch.
type logScan struct {
	files [2]string // paths, for messages
	segs  [2][]item
}

// scanLog scans the contents of the two segments for the records of epoch.
func scanLog(files [2]string, data [2][]byte, epoch uint64) *logScan {
	l := &logScan{files: files}
	for i := range data {
		l.segs[i] = parseSegment(data[i], epoch)
	}
	return l
}

// maxLSN returns the highest sequence number of an intact record in
// segment i (0 if none).
func (l *logScan) maxLSN(i int) uint64 {
	var m uint64
	for _, it := range l.segs[i] {
		if it.rec != nil {
			m = max(m, it.rec.lsn)
		}
	}
	return m
}

// records returns every intact record of the epoch, by sequence number. An
// epoch never gives a sequence number out twice.
func (l *logScan) records() []record {
	var recs []record
	for _, items := range l.segs {
		for _, it := range items {
			if it.rec != nil {
				recs = append(recs, *it.rec)
			}
		}
	}
	slices.SortStableFunc(recs, func(a, b record) int { return cmp.Compare(a.lsn, b.lsn) })
	return slices.CompactFunc(recs, func(a, b record) bool { return a.lsn == b.lsn })
}

// damage returns the gaps that are damage in the middle of the log (see the
// comment at the top of this file), lowest sequence number first.
func (l *logScan) damage() []LogDamage {
	newest := [2]uint64{l.maxLSN(0), l.maxLSN(1)}
	cur := 0
	if newest[1] > newest[0] {
		cur = 1
	}
	top := newest[cur]
	var out []LogDamage
	for i, items := range l.segs {
		if i != cur && len(items) > 0 && items[0].rec == nil && items[0].hdrOK && items[0].hdrLSN > top {
			continue // begins with the torn tail
		}
		base := uint64(0)
		if i == cur {
			base = newest[1-i]
		}
		out = append(out, segmentDamage(l.files[i], items, base, top)...)
	}
	slices.SortStableFunc(out, func(a, b LogDamage) int { return cmp.Compare(a.LSN, b.LSN) })
	return out
}

// segmentDamage returns the gaps of a segment that are damage, given the
// highest sequence number before the segment's first record in the log's
// order (base) and the highest of the whole log (top).
func segmentDamage(file string, items []item, base, top uint64) []LogDamage {
	later := make([]uint64, len(items)+1) // later[j]: highest from item j on
	for j := len(items) - 1; j >= 0; j-- {
		later[j] = later[j+1]
		if r := items[j].rec; r != nil {
			later[j] = max(later[j], r.lsn)
		}
	}
	var out []LogDamage
	before := base
	for j, it := range items {
		if it.rec != nil {
			before = max(before, it.rec.lsn)
			continue
		}
		named := it.hdrOK && it.hdrLSN > before
		if later[j+1] > before || named && top > it.hdrLSN {
			d := LogDamage{File: file, Offset: it.off, LSN: before + 1, Reason: it.why}
			if named {
				d.LSN, d.LSNKnown = it.hdrLSN, true
			}
			out = append(out, d)
		}
	}
	return out
}

// replayPlan is what the log gives to apply on top of the database: the
// records from the one after the last applied on, while the sequence is
// unbroken, and the range of sequence numbers it cannot give (the first
// one missing up to the highest intact one beyond it).
type replayPlan struct {
	replay  []record
	dropped LSNRange
}

// plan returns the replay plan for a database that holds every record up
// to applied.
func (l *logScan) plan(applied uint64) replayPlan {
	var p replayPlan
	next := applied + 1
	recs := l.records()
	for _, r := range recs {
		if r.lsn < next {
			continue
		}
		if r.lsn > next {
			break
		}
		p.replay = append(p.replay, r)
		next++
	}
	if n := len(recs); n > 0 && recs[n-1].lsn >= next {
		p.dropped = LSNRange{First: next, Last: recs[n-1].lsn}
	}
	return p
}

// firstAfter returns where the first intact record with a sequence number
// of at least lsn is, for a message about records missing before it.
func (l *logScan) firstAfter(lsn uint64) (string, int64) {
	file, off, best := "", int64(-1), ^uint64(0)
	for i, items := range l.segs {
		for _, it := range items {
			if it.rec != nil && it.rec.lsn >= lsn && it.rec.lsn < best {
				file, off, best = l.files[i], it.off, it.rec.lsn
			}
		}
	}
	return file, off
}

// ErrCorruptLog is matched (errors.Is) by a *CorruptLogError.
var ErrCorruptLog = errors.New("bolt: log damaged in the middle")

// RecoverCommand is the command that runs RecoverLog on a data directory
// (a format string taking the directory); CorruptLogError names it.
const RecoverCommand = "rdmafs admin wal-recover --data %s"

// LSNRange is the log sequence numbers First to Last; it is empty when
// First is 0.
type LSNRange struct{ First, Last uint64 }

// Count returns how many sequence numbers the range holds.
func (r LSNRange) Count() uint64 {
	if r.First == 0 || r.Last < r.First {
		return 0
	}
	return r.Last - r.First + 1
}

// String returns "N records (LSN a-b)" or "no record".
func (r LSNRange) String() string {
	switch r.Count() {
	case 0:
		return "no record"
	case 1:
		return fmt.Sprintf("1 record (LSN %d)", r.First)
	}
	return fmt.Sprintf("%d records (LSN %d-%d)", r.Count(), r.First, r.Last)
}

// LogDamage is a damaged record in the middle of the log.
type LogDamage struct {
	File   string // the segment file
	Offset int64  // byte offset of the damage in File
	// LSN is the damaged record's sequence number: as its header names it
	// when LSNKnown, else the one after the last record before it.
	LSN      uint64
	LSNKnown bool
	Reason   string // what is wrong at Offset
}

// String describes the damage: file, offset, sequence number and reason.
func (d LogDamage) String() string {
	lsn := fmt.Sprintf("record LSN %d", d.LSN)
	if !d.LSNKnown {
		lsn = fmt.Sprintf("record LSN %d (expected there; its header is damaged)", d.LSN)
	}
	return fmt.Sprintf("%s at byte offset %d: %s: %s", d.File, d.Offset, lsn, d.Reason)
}

// CorruptLogError is returned by Open when the log is damaged in the middle:
// a record that is not intact is followed by intact ones of a later
// sequence number, so the damage is not a torn tail left by a crash. Open
// has then replayed nothing and written nothing; RecoverLog (the command
// RecoverCommand) cuts the log at the damage.
type CorruptLogError struct {
	Dir    string      // the data directory
	Damage []LogDamage // lowest sequence number first; at least one
	// Drop is what RecoverLog would drop: acknowledged records that the
	// database lacks and that the log cannot replay in order (empty when
	// the damaged records were all checkpointed into the database).
	Drop LSNRange
}

// Error names the first damage, what recovering drops and the command.
func (e *CorruptLogError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "bolt: the metadata log is damaged in the middle (not a torn tail: intact records of a later sequence number follow): %s", e.Damage[0])
	if n := len(e.Damage) - 1; n > 0 {
		fmt.Fprintf(&b, " (and %d more damaged place(s))", n)
	}
	b.WriteString("; nothing was replayed or written. To cut the log at the damage, keeping every record before it, stop the meta server and run `")
	fmt.Fprintf(&b, RecoverCommand, e.Dir)
	b.WriteString("` (add --dry-run to see what it does first): ")
	if e.Drop.Count() == 0 {
		b.WriteString("it drops no record the database lacks (the damaged records were already checkpointed into it)")
	} else {
		fmt.Fprintf(&b, "it drops %s that the database lacks", e.Drop)
	}
	return b.String()
}

// Is reports whether target is ErrCorruptLog.
func (e *CorruptLogError) Is(target error) bool { return target == ErrCorruptLog }

// check returns a *CorruptLogError if the log is damaged in the middle or
// the plan drops records, else nil.
func (l *logScan) check(dir string, p replayPlan) error {
	dmg := l.damage()
	if len(dmg) == 0 && p.dropped.Count() == 0 {
		return nil
	}
	if len(dmg) == 0 {
		// Not found as a gap, but a record the database needs is
		// missing before intact ones: damage all the same.
		file, off := l.firstAfter(p.dropped.First)
		dmg = []LogDamage{{File: file, Offset: off, LSN: p.dropped.First,
			Reason: "the record is missing before this one"}}
	}
	return &CorruptLogError{Dir: dir, Damage: dmg, Drop: p.dropped}
}
