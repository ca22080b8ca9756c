package bolt

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
)

// The write-ahead log is two segment files, written in turn, each from its
// start: a group's record is appended to the current segment with one write
// and then made durable with one fdatasync. When the current segment is full the writer moves to
// the other one, once every record in it has been checkpointed into bbolt.
// Segments are extended with written zeros ahead of the records, so that an
// append overwrites allocated blocks and fdatasync writes no file metadata.
//
// Records of earlier passes stay behind the new ones. A record belongs to
// the current epoch (a random number chosen at every Open, stored in bbolt)
// and has a sequence number one above the record before it (or above a
// group committed to bbolt directly). A record is appended only after the
// one before it is durable, so the durable records form one run of
// consecutive sequence numbers, and only the last one written can be torn
// by a crash. A log scan (scan.go) finds them and tells a torn tail from
// damage in the middle, which Open refuses (CorruptLogError).

// Names of the log segments in the data directory.
const (
	LogFile0 = "meta.log.0"
	LogFile1 = "meta.log.1"
)

// Record layout: a header, then per write the key length (u32), the key, the
// value length (u32; deleted: tombstone) and the value. The checksum
// (CRC-32C) covers the epoch, the sequence number and the payload.
const (
	recordMagic  = 0x5244574c // "RDWL"
	headerSize   = 32
	tombstone    = ^uint32(0)
	extendChunk  = 1 << 20
	offMagic     = 0
	offLength    = 4
	offEpoch     = 8
	offLSN       = 16
	offChecksum  = 24
	checksumFrom = offEpoch
	checksumTo   = offChecksum
)

// record is one logged group: its sequence number and its writes in key
// order (a nil value is a deletion).
type record struct {
	lsn    uint64
	keys   []string
	values [][]byte
}

// wal is the log. Only the writer goroutine uses it after Open.
type wal struct {
	files [2]*os.File
	size  [2]int64 // bytes written (zeros or records) from each start
	cur   int      // the segment appended to
	off   int64    // where the next record goes in it
	lsn   uint64   // the last sequence number given out
	epoch uint64
	max   int64 // segment size
	buf   []byte
	// stale is set when a group failed to be made durable: a record of it
	// may be on disk or in the page cache under the sequence number the
	// next group gets, so the log must go on in a new epoch (renewEpoch).
	stale bool
	sync  func(*os.File) error // fdatasync; tests inject failures
}

// openWAL opens (creating if needed) the two segments in dir.
func openWAL(dir string, segment int64) (*wal, error) {
	w := &wal{max: segment, sync: fdatasync}
	created := false
	for i, name := range []string{LogFile0, LogFile1} {
		path := filepath.Join(dir, name)
		_, statErr := os.Stat(path)
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			w.close()
			return nil, fmt.Errorf("bolt: open log %s: %w", path, err)
		}
		w.files[i] = f
		fi, err := f.Stat()
		if err != nil {
			w.close()
			return nil, fmt.Errorf("bolt: stat log %s: %w", path, err)
		}
		w.size[i] = fi.Size()
		created = created || errors.Is(statErr, os.ErrNotExist)
	}
	if created {
		// The new files' directory entries must be durable before a
		// record in them is acknowledged.
		if err := syncDir(dir); err != nil {
			w.close()
			return nil, err
		}
	}
	return w, nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("bolt: open data dir: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("bolt: sync data dir: %w", err)
	}
	return nil
}

func (w *wal) close() error {
	var errs []error
	for _, f := range w.files {
		if f != nil {
			errs = append(errs, f.Close())
		}
	}
	return errors.Join(errs...)
}

// recordSize returns the encoded size of a group's record.
func recordSize(g *group) int64 {
	n := int64(headerSize)
	for _, k := range g.keys {
		n += 8 + int64(len(k)) + int64(len(g.writes[k]))
	}
	return n
}

// encode writes g's record with sequence number lsn into w.buf.
func (w *wal) encode(g *group, lsn uint64) []byte {
	b := append(w.buf[:0], make([]byte, headerSize)...)
	for _, k := range g.keys {
		b = binary.BigEndian.AppendUint32(b, uint32(len(k)))
		b = append(b, k...)
		v := g.writes[k]
		if v == nil {
			b = binary.BigEndian.AppendUint32(b, tombstone)
			continue
		}
		b = binary.BigEndian.AppendUint32(b, uint32(len(v)))
		b = append(b, v...)
	}
	binary.BigEndian.PutUint32(b[offMagic:], recordMagic)
	binary.BigEndian.PutUint32(b[offLength:], uint32(len(b)-headerSize))
	binary.BigEndian.PutUint64(b[offEpoch:], w.epoch)
	binary.BigEndian.PutUint64(b[offLSN:], lsn)
	binary.BigEndian.PutUint32(b[offChecksum:], checksum(b))
	w.buf = b
	return b
}

// castagnoli is the CRC-32C table of the log's record checksums, made once.
// (The meta tree may not import chunkserver/store, whose Checksum is the
// same function over chunk data.)
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// checksum returns the CRC-32C of a record's header fields after the
// checksum and of its payload.
func checksum(rec []byte) uint32 {
	c := crc32.Update(0, castagnoli, rec[checksumFrom:checksumTo])
	return crc32.Update(c, castagnoli, rec[headerSize:])
}

// fits reports whether a record of n bytes fits in the current segment.
func (w *wal) fits(n int64) bool { return w.off+n <= w.max }

// switchSegment starts writing the other segment from its start; the caller
// has made sure that its records are all in bbolt.
func (w *wal) switchSegment() {
	w.cur = 1 - w.cur
	w.off = 0
}

// write writes rec (from encode, for sequence number lsn) at the end of the
// current segment: from then on it survives a crash of this process (it is
// in the page cache), but not yet one of the machine (flush makes it durable).
func (w *wal) write(rec []byte, lsn uint64) error {
	f := w.files[w.cur]
	end := w.off + int64(len(rec))
	if end > w.size[w.cur] {
		if err := w.extend(end); err != nil {
			return err
		}
	}
	if _, err := f.WriteAt(rec, w.off); err != nil {
		return fmt.Errorf("bolt: write log: %w", err)
	}
	w.off = end
	w.lsn = lsn
	return nil
}

// flush makes the records written to the current segment durable.
func (w *wal) flush() error {
	if err := w.sync(w.files[w.cur]); err != nil {
		return fmt.Errorf("bolt: sync log: %w", err)
	}
	return nil
}

// extend writes zeros to the current segment up to at least end (in steps
// of extendChunk, at most the segment size) and syncs the new size.
func (w *wal) extend(end int64) error {
	f := w.files[w.cur]
	target := min(max((end+extendChunk-1)/extendChunk*extendChunk, end), max(w.max, end))
	zeros := make([]byte, min(extendChunk, target-w.size[w.cur]))
	for off := w.size[w.cur]; off < target; {
		n := min(int64(len(zeros)), target-off)
		if _, err := f.WriteAt(zeros[:n], off); err != nil {
			return fmt.Errorf("bolt: extend log: %w", err)
		}
		off += n
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("bolt: sync log: %w", err)
	}
	w.size[w.cur] = target
	return nil
}

// scan reads both segments and finds the records of the given epoch
// (scan.go).
func (w *wal) scan(epoch uint64) (*logScan, error) {
	var data [2][]byte
	var names [2]string
	for i, f := range w.files {
		b, err := io.ReadAll(io.NewSectionReader(f, 0, w.size[i]))
		if err != nil {
			return nil, fmt.Errorf("bolt: read log %s: %w", f.Name(), err)
		}
		data[i], names[i] = b, f.Name()
	}
	return scanLog(names, data, epoch), nil
}

// decodePayload decodes a record's writes; ok is false if they do not fill
// p exactly.
func decodePayload(p []byte) (record, bool) {
	var r record
	for len(p) > 0 {
		if len(p) < 4 {
			return r, false
		}
		kl := int(binary.BigEndian.Uint32(p))
		p = p[4:]
		if kl > len(p)-4 {
			return r, false
		}
		k := string(p[:kl])
		p = p[kl:]
		vl := binary.BigEndian.Uint32(p)
		p = p[4:]
		var v []byte
		if vl != tombstone {
			if int64(vl) > int64(len(p)) {
				return r, false
			}
			v = append([]byte{}, p[:vl]...)
			p = p[vl:]
		}
		r.keys = append(r.keys, k)
		r.values = append(r.values, v)
	}
	return r, true
}
