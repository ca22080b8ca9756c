package core

import (
	"context"
	"fmt"
	"syscall"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/rdmafs/rdmafs/meta/keys"
	"github.com/rdmafs/rdmafs/meta/kv"
	"github.com/rdmafs/rdmafs/meta/metaerr"
	"github.com/rdmafs/rdmafs/meta/metapb"
	"github.com/rdmafs/rdmafs/meta/reqid"
)

// updateOnce is updateLogged for a mutating request that must take effect
// exactly once. When the call carries a request id (reqid), the reply is
// stored with the request id in the same transaction; a retry of the call
// (after a failover, possibly on another metadata server) finds it and gets
// the original reply instead of running the operation again. fn must leave
// the reply in *out when it succeeds. replayed reports a stored reply, in
// which case fn did not run and the caller must skip in-memory side effects.
func updateOnce[T proto.Message](s *Service, ctx context.Context, out *T, fn func(t kv.Txn) error) (replayed bool, err error) {
	id, ok, err := reqid.FromIncoming(ctx)
	if err != nil {
		return false, metaerr.New(syscall.EINVAL, "%v", err)
	}
	if !ok {
		return false, s.updateLogged(ctx, fn)
	}
	key := keys.Request(id.Millis, id.Client, id.Seq)
	err = s.updateLogged(ctx, func(t kv.Txn) error {
		replayed = false
		if id.Retry {
			// Only a retry can find a record: first attempts write the
			// record blindly and save a read.
			rec := &metapb.RequestRecord{}
			if found, err := getMsg(t, key, rec); err != nil {
				return err
			} else if found {
				var zero T
				m := zero.ProtoReflect().New().Interface().(T)
				if err := proto.Unmarshal(rec.Reply, m); err != nil {
					return fmt.Errorf("request %v: stored reply: %w", id, err)
				}
				*out = m
				replayed = true
				return nil
			}
		}
		if err := fn(t); err != nil {
			return err
		}
		reply, err := proto.Marshal(*out)
		if err != nil {
			return fmt.Errorf("request %v: encode reply: %w", id, err)
		}
		return putMsg(t, key, &metapb.RequestRecord{CommittedNs: s.now().UnixNano(), Reply: reply})
	})
	if replayed && err == nil {
		s.log.Info("replayed the stored outcome of a retried request", "request", id.String())
	}
	return replayed, err
}

// storedReply returns the stored reply of a retried request, for handlers
// that check in-memory state (a session) before their transaction and would
// refuse a retry whose first attempt changed that state.
func storedReply[T proto.Message](s *Service, ctx context.Context) (T, bool, error) {
	var zero T
	id, ok, err := reqid.FromIncoming(ctx)
	if err != nil || !ok || !id.Retry {
		return zero, false, nil
	}
	rec := &metapb.RequestRecord{}
	found := false
	if err := s.view(ctx, func(r kv.Reader) error {
		var err error
		found, err = getMsg(r, keys.Request(id.Millis, id.Client, id.Seq), rec)
		return err
	}); err != nil || !found {
		return zero, false, err
	}
	m := zero.ProtoReflect().New().Interface().(T)
	if err := proto.Unmarshal(rec.Reply, m); err != nil {
		return zero, false, metaerr.New(syscall.EIO, "request %v: stored reply: %v", id, err)
	}
	return m, true, nil
}

// maxRequestDeletes bounds the request records deleted per transaction.
const maxRequestDeletes = 1000

// expireRequests deletes the request records of requests first sent more
// than RequestTTL ago: a client retries a request within its failover
// timeout, never after that long. Records are keyed by the time of the first
// attempt, so only expired records are read.
func (s *Service) expireRequests(ctx context.Context) error {
	cutoff := uint64(max(s.now().Add(-s.cfg.RequestTTL).UnixMilli(), 0))
	start, end := keys.RequestPrefix(), keys.RequestsBefore(cutoff)
	for {
		var old [][]byte
		if err := s.view(ctx, func(r kv.Reader) error {
			old = old[:0]
			return r.Scan(start, end, maxRequestDeletes, func(k, v []byte) error {
				old = append(old, append([]byte{}, k...))
				return nil
			})
		}); err != nil {
			return err
		}
		if len(old) == 0 {
			return nil
		}
		if err := s.update(ctx, func(t kv.Txn) error {
			for _, k := range old {
				if err := t.Delete(k); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			return err
		}
		if len(old) < maxRequestDeletes {
			return nil
		}
	}
}

// requestSweepEvery is how often Run looks for expired request records.
func (s *Service) requestSweepEvery() time.Duration {
	return max(min(s.cfg.RequestTTL/4, time.Minute), 10*time.Millisecond)
}
