// Package dump exports every key of a metadata store to a stream and
// imports such a stream into an empty store, so that a file system can move
// between backends (bbolt and etcd). The format is described in
// docs/metadata-dump.md: a magic line, then length-prefixed DumpRecord
// messages (a header, the key/value pairs in key order, a trailer with the
// count and a SHA-256 of the pairs).
package dump

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"io"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/rdmafs/rdmafs/meta/keys"
	"github.com/rdmafs/rdmafs/meta/kv"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// Magic starts every dump.
const Magic = "rdmafs-metadata-dump\n"

// FormatVersion is the version written in the header.
const FormatVersion = 1

// MaxRecord bounds the size of one encoded record.
const MaxRecord = 16 << 20

// ErrMalformed reports a stream that is not a valid dump.
var ErrMalformed = errors.New("dump: malformed dump")

// Stats describes a dump or load.
type Stats struct {
	Records   uint64
	Bytes     uint64
	ClusterID string
}

// Write exports every key of store, read in one consistent snapshot, to w.
// source is recorded in the header (e.g. the store's location).
func Write(ctx context.Context, store kv.Store, w io.Writer, source string) (Stats, error) {
	bw := bufio.NewWriterSize(w, 1<<20)
	var st Stats
	err := store.View(ctx, func(r kv.Reader) error {
		st = Stats{}
		cl := &metapb.ClusterRecord{}
		if v, ok, err := r.Get(keys.Cluster()); err != nil {
			return err
		} else if !ok {
			return errors.New("dump: the store holds no file system (no cluster record)")
		} else if err := proto.Unmarshal(v, cl); err != nil {
			return fmt.Errorf("dump: cluster record: %w", err)
		}
		st.ClusterID = cl.ClusterId
		if _, err := bw.WriteString(Magic); err != nil {
			return err
		}
		hdr := &metapb.DumpRecord{Header: &metapb.DumpHeader{FormatVersion: FormatVersion, ClusterId: cl.ClusterId,
			CreatedNs: time.Now().UnixNano(), Source: source}}
		if err := writeRecord(bw, hdr); err != nil {
			return err
		}
		h := sha256.New()
		if err := r.Scan(nil, nil, 0, func(k, v []byte) error {
			if err := ctx.Err(); err != nil {
				return err
			}
			hashPair(h, k, v)
			st.Records++
			st.Bytes += uint64(len(k) + len(v))
			return writeRecord(bw, &metapb.DumpRecord{Key: k, Value: v})
		}); err != nil {
			return err
		}
		return writeRecord(bw, &metapb.DumpRecord{Trailer: &metapb.DumpTrailer{Records: st.Records, Sha256: h.Sum(nil)}})
	})
	if err != nil {
		return st, fmt.Errorf("dump: %w", err)
	}
	if err := bw.Flush(); err != nil {
		return st, fmt.Errorf("dump: write: %w", err)
	}
	return st, nil
}

func hashPair(h hash.Hash, k, v []byte) {
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], uint32(len(k)))
	h.Write(n[:])
	h.Write(k)
	binary.BigEndian.PutUint32(n[:], uint32(len(v)))
	h.Write(n[:])
	h.Write(v)
}

func writeRecord(w *bufio.Writer, rec *metapb.DumpRecord) error {
	b, err := proto.Marshal(rec)
	if err != nil {
		return err
	}
	if len(b) > MaxRecord {
		return fmt.Errorf("dump: record of %d bytes exceeds %d", len(b), MaxRecord)
	}
	var n [binary.MaxVarintLen64]byte
	if _, err := w.Write(n[:binary.PutUvarint(n[:], uint64(len(b)))]); err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

// Reader decodes a dump stream.
type Reader struct {
	r      *bufio.Reader
	Header *metapb.DumpHeader
	h      hash.Hash
	n      uint64
	last   []byte
	done   bool
}

// NewReader checks the magic line and the header.
func NewReader(r io.Reader) (*Reader, error) {
	d := &Reader{r: bufio.NewReaderSize(r, 1<<20), h: sha256.New()}
	magic := make([]byte, len(Magic))
	if _, err := io.ReadFull(d.r, magic); err != nil || string(magic) != Magic {
		return nil, fmt.Errorf("%w: missing the %q magic line (not an rdmafs metadata dump)", ErrMalformed, Magic[:len(Magic)-1])
	}
	rec, err := d.record()
	if err != nil {
		return nil, err
	}
	if rec.Header == nil {
		return nil, fmt.Errorf("%w: the first record is not a header", ErrMalformed)
	}
	if rec.Header.FormatVersion != FormatVersion {
		return nil, fmt.Errorf("%w: format version %d, this rdmafs reads version %d", ErrMalformed, rec.Header.FormatVersion, FormatVersion)
	}
	d.Header = rec.Header
	return d, nil
}

func (d *Reader) record() (*metapb.DumpRecord, error) {
	n, err := binary.ReadUvarint(d.r)
	if err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%w: truncated after %d records (no trailer)", ErrMalformed, d.n)
		}
		return nil, fmt.Errorf("%w: record length after %d records: %v", ErrMalformed, d.n, err)
	}
	if n > MaxRecord {
		return nil, fmt.Errorf("%w: record of %d bytes exceeds %d", ErrMalformed, n, MaxRecord)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(d.r, b); err != nil {
		return nil, fmt.Errorf("%w: truncated record after %d records: %v", ErrMalformed, d.n, err)
	}
	rec := &metapb.DumpRecord{}
	if err := proto.Unmarshal(b, rec); err != nil {
		return nil, fmt.Errorf("%w: record %d: %v", ErrMalformed, d.n+1, err)
	}
	return rec, nil
}

// Next returns the next key/value pair, or io.EOF after a trailer that
// matches the pairs read. Keys must be strictly ascending and non-empty.
func (d *Reader) Next() (key, value []byte, err error) {
	if d.done {
		return nil, nil, io.EOF
	}
	rec, err := d.record()
	if err != nil {
		return nil, nil, err
	}
	switch {
	case rec.Header != nil:
		return nil, nil, fmt.Errorf("%w: a second header at record %d", ErrMalformed, d.n+1)
	case rec.Trailer != nil:
		if len(rec.Key) != 0 || len(rec.Value) != 0 {
			return nil, nil, fmt.Errorf("%w: trailer with a key", ErrMalformed)
		}
		if rec.Trailer.Records != d.n {
			return nil, nil, fmt.Errorf("%w: the trailer counts %d records, the dump holds %d", ErrMalformed, rec.Trailer.Records, d.n)
		}
		if !bytes.Equal(rec.Trailer.Sha256, d.h.Sum(nil)) {
			return nil, nil, fmt.Errorf("%w: checksum mismatch (the dump is corrupt)", ErrMalformed)
		}
		if _, err := d.r.ReadByte(); err != io.EOF {
			return nil, nil, fmt.Errorf("%w: data after the trailer", ErrMalformed)
		}
		d.done = true
		return nil, nil, io.EOF
	}
	if len(rec.Key) == 0 {
		return nil, nil, fmt.Errorf("%w: record %d has an empty key", ErrMalformed, d.n+1)
	}
	if d.last != nil && bytes.Compare(rec.Key, d.last) <= 0 {
		return nil, nil, fmt.Errorf("%w: record %d: keys out of order", ErrMalformed, d.n+1)
	}
	d.last = rec.Key
	d.n++
	hashPair(d.h, rec.Key, rec.Value)
	if rec.Value == nil {
		rec.Value = []byte{}
	}
	return rec.Key, rec.Value, nil
}

// LoadOptions tunes Load.
type LoadOptions struct {
	// BatchKeys bounds the keys written per transaction (default 256).
	BatchKeys int
	// BatchBytes bounds the bytes written per transaction (default 512 KiB).
	BatchBytes int
}

// Load imports a dump into store, which must be empty. The cluster record
// is written last, in the same transaction as the final batch and only
// after the trailer verified the whole dump: until then the store is not
// formatted and no meta server will serve it, so an interrupted load leaves
// a store that must be wiped and loaded again, never a partial file system.
func Load(ctx context.Context, store kv.Store, r io.Reader, opts LoadOptions) (Stats, error) {
	if opts.BatchKeys <= 0 {
		opts.BatchKeys = 256
	}
	if opts.BatchBytes <= 0 {
		opts.BatchBytes = 512 << 10
	}
	var st Stats
	if err := store.View(ctx, func(r kv.Reader) error {
		found := false
		if err := r.Scan(nil, nil, 1, func(k, v []byte) error { found = true; return kv.ErrStop }); err != nil {
			return err
		}
		if found {
			return errors.New("dump: load: the target store is not empty (load only into a new, empty store)")
		}
		return nil
	}); err != nil {
		return st, err
	}
	d, err := NewReader(r)
	if err != nil {
		return st, err
	}
	st.ClusterID = d.Header.ClusterId
	var cluster []byte
	type pair struct{ k, v []byte }
	var batch []pair
	size := 0
	flush := func(final bool) error {
		err := store.Update(ctx, func(t kv.Txn) error {
			for _, p := range batch {
				if err := t.Put(p.k, p.v); err != nil {
					return err
				}
			}
			if final {
				return t.Put(keys.Cluster(), cluster)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("dump: load: write: %w", err)
		}
		batch, size = batch[:0], 0
		return nil
	}
	for {
		k, v, err := d.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return st, err
		}
		st.Records++
		st.Bytes += uint64(len(k) + len(v))
		if bytes.Equal(k, keys.Cluster()) {
			cluster = v
			continue
		}
		batch = append(batch, pair{k, v})
		size += len(k) + len(v)
		if len(batch) >= opts.BatchKeys || size >= opts.BatchBytes {
			if err := flush(false); err != nil {
				return st, err
			}
		}
	}
	if cluster == nil {
		return st, fmt.Errorf("%w: no cluster record", ErrMalformed)
	}
	cl := &metapb.ClusterRecord{}
	if err := proto.Unmarshal(cluster, cl); err != nil || cl.ClusterId != d.Header.ClusterId {
		return st, fmt.Errorf("%w: the cluster record does not match the header", ErrMalformed)
	}
	return st, flush(true)
}
