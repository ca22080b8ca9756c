// Package kv is the transactional key-value interface the metadata service
// stores its state in. Keys are plain byte strings ordered bytewise, so that a
// single-node embedded backend (bbolt) and a replicated one (etcd) can share
// the same key layout and callers.
package kv

import (
	"context"
	"errors"
	"fmt"
)

// ErrStop may be returned by a Scan callback to end the scan early without an error.
var ErrStop = errors.New("kv: stop scan")

// ErrConflict reports that a transaction conflicted with a concurrent one.
// Store.Update retries such transactions itself; it is exported for backends.
var ErrConflict = errors.New("kv: transaction conflict")

// ErrNotLeader is returned (wrapped) by a Store that may no longer write
// because another metadata server has taken the store over. Nothing of the
// refused transaction was applied; the client should retry elsewhere.
var ErrNotLeader = errors.New("kv: this server is no longer the writer of the store")

// ErrBroken is returned (wrapped) by a Store that acknowledged transactions
// it then failed to make durable (the disk failed): it accepts no more.
var ErrBroken = errors.New("kv: store broken: acknowledged transactions may not be durable")

// ErrNotApplied is returned (wrapped) for a transaction that was not
// applied because the store could not commit it or one it followed; the
// caller may run it again.
var ErrNotApplied = errors.New("kv: transaction not applied")

// ErrClosed is returned by a Store after Close.
var ErrClosed = errors.New("kv: store closed")

// Reader reads within a transaction. Returned slices belong to the caller.
type Reader interface {
	// Get returns the value of key and whether it exists.
	Get(key []byte) (value []byte, ok bool, err error)
	// Scan calls fn for each key in [start, end) in ascending order, at most
	// limit keys when limit > 0. A nil end means no upper bound. fn may return
	// ErrStop to end the scan. The slices passed to fn are valid only during
	// the call.
	Scan(start, end []byte, limit int, fn func(key, value []byte) error) error
}

// Txn reads and writes within a read-write transaction. Reads observe the
// transaction's own writes.
type Txn interface {
	Reader
	// Put sets key to value.
	Put(key, value []byte) error
	// Delete removes key; deleting a missing key is not an error.
	Delete(key []byte) error
}

// Store is a transactional key-value store.
type Store interface {
	// View runs fn in a read-only, consistent snapshot.
	View(ctx context.Context, fn func(Reader) error) error
	// Update runs fn in a serializable read-write transaction and commits it
	// durably before returning nil. If fn returns an error nothing it wrote
	// is applied and Update returns that error. fn may be called more than
	// once (on conflicts), so it must not have effects outside the
	// transaction other than recording its results.
	Update(ctx context.Context, fn func(Txn) error) error
	// Close releases the store; pending transactions finish first.
	Close() error
}

// Chain runs a sequence of transactions without waiting for each to be
// logged (the bbolt backend's Store.NewChain): each runs at once, after
// those before it, and Wait returns once all are logged. If one fails to
// commit, none after it is applied, and Update or Wait returns an error
// wrapping ErrNotApplied.
type Chain interface {
	// Update runs fn and returns its error.
	Update(ctx context.Context, fn func(Txn) error) error
	// Wait waits until every transaction run so far is logged.
	Wait(ctx context.Context) error
}

// CallSafely runs fn(t), a transaction function given to Store.Update, and
// returns its error. If fn panics, the panic is recovered and returned as an
// error quoting its value ("kv: transaction panicked: ..."), so that a bug in
// one transaction fails that transaction alone, not the server and the
// transactions batched with it. Backends call fn through it and treat its
// error as fn's: nothing fn wrote is applied.
func CallSafely(fn func(Txn) error, t Txn) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("kv: transaction panicked: %v", p)
		}
	}()
	return fn(t)
}

// PrefixEnd returns the smallest key greater than every key with the given
// prefix, or nil if there is none (prefix is all 0xff).
func PrefixEnd(prefix []byte) []byte {
	end := append([]byte(nil), prefix...)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return nil
}
