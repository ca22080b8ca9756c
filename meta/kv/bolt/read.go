package bolt

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"

	bbolt "go.etcd.io/bbolt"

	"github.com/rdmafs/rdmafs/meta/kv"
)

// reader reads the durable state: bbolt, overlaid with the logged groups
// that are not in bbolt yet (newest last). It copies values out so they
// outlive the transaction.
type reader struct {
	b      *bbolt.Bucket
	logged []*group
}

// loggedValue returns the newest logged write of key.
func (r *reader) loggedValue(key string) (v []byte, ok bool) {
	for i := len(r.logged) - 1; i >= 0; i-- {
		if v, ok := r.logged[i].writes[key]; ok {
			return v, true
		}
	}
	return nil, false
}

// Get implements kv.Reader.
func (r *reader) Get(key []byte) ([]byte, bool, error) {
	v, ok := r.loggedValue(string(key))
	if !ok {
		v = r.b.Get(key)
	}
	if v == nil {
		return nil, false, nil
	}
	return append([]byte{}, v...), true, nil
}

// Scan implements kv.Reader.
func (r *reader) Scan(start, end []byte, limit int, fn func(k, v []byte) error) error {
	var o overlay
	o.addLogged(r.logged, start, end)
	return o.merge(r.b, start, end, limit, fn)
}

// overlay collects the writes a scan must merge into bbolt's keys: for each
// key only the newest, in key order once sorted.
type overlay struct {
	writes []write
	seen   map[string]bool
}

type write struct {
	key   string
	value []byte // nil: deleted
}

// add records the write of key unless a newer one was added.
func (o *overlay) add(key string, value []byte) {
	if o.seen == nil {
		o.seen = map[string]bool{}
	}
	if !o.seen[key] {
		o.seen[key] = true
		o.writes = append(o.writes, write{key, value})
	}
}

// addSorted adds the writes of the keys in [start, end) of sorted, whose
// values get returns.
func (o *overlay) addSorted(sorted []string, start, end []byte, get func(string) []byte) {
	i, _ := slices.BinarySearch(sorted, string(start))
	for _, k := range sorted[i:] {
		if end != nil && k >= string(end) {
			break
		}
		o.add(k, get(k))
	}
}

// addLogged adds the logged writes in [start, end), newest first.
func (o *overlay) addLogged(logged []*group, start, end []byte) {
	for i := len(logged) - 1; i >= 0; i-- {
		g := logged[i]
		o.addSorted(g.keys, start, end, func(k string) []byte { return g.writes[k] })
	}
}

// merge calls fn for the keys in [start, end) of b and of the overlay, the
// overlay's value winning, deleted keys left out, at most limit keys when
// limit > 0.
func (o *overlay) merge(b *bbolt.Bucket, start, end []byte, limit int, fn func(k, v []byte) error) error {
	over := o.writes
	slices.SortFunc(over, func(a, b write) int { return strings.Compare(a.key, b.key) })
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
	c := b.Cursor()
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

// Scan merges the transaction's writes, the pending and the logged writes
// into the bucket's ordered keys.
func (t *txn) Scan(start, end []byte, limit int, fn func(k, v []byte) error) error {
	var o overlay
	for k, v := range t.writes {
		if k >= string(start) && (end == nil || k < string(end)) {
			o.add(k, v)
		}
	}
	o.addSorted(t.sorted, start, end, func(k string) []byte { return t.pending[k].value })
	o.addLogged(t.logged, start, end)
	return o.merge(t.b, start, end, limit, fn)
}
