package client

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rdmafs/rdmafs/meta/metapb"
	"github.com/rdmafs/rdmafs/meta/reqid"
)

// DefaultFailoverTimeout bounds the retries of a call without a deadline.
const DefaultFailoverTimeout = 2 * time.Minute

// failover is a grpc.ClientConnInterface over several meta servers.
type failover struct {
	conns   []*grpc.ClientConn
	addrs   []string
	cur     atomic.Int64 // index (mod len) of the server that answered last
	client  uint64       // random id of this client for request ids
	seq     atomic.Uint64
	timeout atomic.Int64 // time.Duration; 0: DefaultFailoverTimeout

	// mutations counts the mutating calls that returned; synced is the
	// count a successful Sync call covered.
	mutations atomic.Uint64
	synced    atomic.Uint64
}

func randomClientID() uint64 {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		// crypto/rand does not fail on Linux; a time-based id is still
		// unique enough to tell clients apart.
		return uint64(time.Now().UnixNano())
	}
	return binary.BigEndian.Uint64(b[:])
}

func (f *failover) close() error {
	var errs []error
	for _, c := range f.conns {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}

// readOnly reports the methods that change nothing and need no request id.
func readOnly(method string) bool {
	switch method {
	case "Lookup", "GetAttr", "Readlink", "ReadDir", "GetXattr", "ListXattr", "StatFS",
		"Status", "GetLayout", "GetStripes", "Info", "Inventory", "KeepAlive", "Heartbeat", "Sync",
		"Recalls": // its releases may be applied twice
		return true
	}
	return false
}

// retryable reports whether err means that the server could not be
// reached or is not the serving one, so another server should be tried.
func retryable(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable:
		return true
	}
	return false
}

// Invoke implements grpc.ClientConnInterface.
func (f *failover) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	short := method[strings.LastIndexByte(method, '/')+1:]
	if short == "Sync" {
		return f.sync(ctx, method, args, reply, opts...)
	}
	var id reqid.ID
	if !readOnly(short) {
		id = f.newID()
	}
	if isSyncedCommit(args) {
		return f.syncedCommit(ctx, method, args, reply, id, opts...)
	}
	return f.invoke(ctx, method, args, reply, id, opts...)
}

// syncedCommit makes a commit that meta answers once it is durable with
// everything before it (CommitStripesRequest.Sync): like a Sync, it covers
// the mutating calls that returned before it was sent, and itself if no
// other returned meanwhile, so that the fsync's Sync that follows costs no
// round trip.
func (f *failover) syncedCommit(ctx context.Context, method string, args, reply any, id reqid.ID, opts ...grpc.CallOption) error {
	m := f.mutations.Load()
	if err := f.invoke(ctx, method, args, reply, id, opts...); err != nil {
		return err
	}
	f.coverSince(m)
	return nil
}

// coverSince records that a call that returned durable (a synced commit, or
// a batch ending with one) covers the m mutating calls that had returned
// when it was sent, and itself if no other returned meanwhile.
func (f *failover) coverSince(m uint64) {
	if f.mutations.Load() == m+1 {
		m++ // only this call returned meanwhile
	}
	f.covered(m)
}

// covered records that a durable point covers the first m mutating calls
// that returned.
func (f *failover) covered(m uint64) {
	for s := f.synced.Load(); s < m && !f.synced.CompareAndSwap(s, m); s = f.synced.Load() {
	}
}

// isSyncedCommit reports whether args is a commit meta answers once durable.
func isSyncedCommit(args any) bool {
	r, ok := args.(*metapb.CommitStripesRequest)
	return ok && r.Sync
}

// newID returns a new request id of this client.
func (f *failover) newID() reqid.ID {
	return reqid.ID{Client: f.client, Seq: f.seq.Add(1), Millis: uint64(time.Now().UnixMilli())}
}

// invoke makes the call, moving on to the next server while the current one
// is unavailable; a mutating call carries its request id id (zero for a
// call that changes nothing).
func (f *failover) invoke(ctx context.Context, method string, args, reply any, id reqid.ID, opts ...grpc.CallOption) error {
	withID := id.Client != 0
	if withID {
		// Counted when it returns, whatever the outcome: a failed call
		// may have been applied.
		defer f.mutations.Add(1)
	}
	if _, ok := ctx.Deadline(); !ok {
		to := time.Duration(f.timeout.Load())
		if to <= 0 {
			to = DefaultFailoverTimeout
		}
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, to)
		defer cancel()
	}
	n := int64(len(f.conns))
	start := f.cur.Load()
	var last error
	for attempt := 0; ; attempt++ {
		i := (start + int64(attempt)) % n
		cctx := ctx
		if withID {
			id.Retry = id.Retry || attempt > 0
			cctx = reqid.AppendOutgoing(ctx, id)
		}
		err := f.conns[i].Invoke(cctx, method, args, reply, opts...)
		if err == nil {
			if f.cur.Load() != i {
				f.cur.Store(i)
			}
			return nil
		}
		if !retryable(err) || ctx.Err() != nil {
			if last != nil && ctx.Err() != nil {
				return fmt.Errorf("meta servers %v unavailable (last: %v%s): %w", f.addrs, last, tlsHint(last), err)
			}
			return err
		}
		last = err
		// After a full round over all servers, wait a little: the
		// servers may be electing a new leader.
		if int64(attempt+1)%n == 0 {
			d := time.Duration(min(attempt+1, 20)) * 25 * time.Millisecond
			select {
			case <-ctx.Done():
				return status.Error(codes.Unavailable, fmt.Sprintf("meta servers %v unavailable: %v%s", f.addrs, last, tlsHint(last)))
			case <-time.After(d):
			}
		}
	}
}

// sync makes a Sync call unless every mutating call that returned before it
// is covered by a Sync that succeeded: an fsync after nothing changed costs
// no round trip.
func (f *failover) sync(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	m := f.mutations.Load()
	if f.synced.Load() >= m {
		return nil
	}
	if err := f.invoke(ctx, method, args, reply, reqid.ID{}, opts...); err != nil {
		return err
	}
	f.covered(m)
	return nil
}

// NewStream implements grpc.ClientConnInterface; streams are not retried.
func (f *failover) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	return f.conns[f.cur.Load()%int64(len(f.conns))].NewStream(ctx, desc, method, opts...)
}

// tlsHint explains the connection errors of a TLS mismatch between client
// and server, which gRPC reports only as a broken connection.
func tlsHint(err error) string {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "reading server preface: EOF"):
		return " (the server may require TLS: give --tls-ca, and --tls-cert/--tls-key if it requires client certificates)"
	case strings.Contains(msg, "tls: first record does not look like a TLS handshake"):
		return " (the server does not speak TLS: drop --tls-ca, or give the server --tls-cert/--tls-key)"
	case strings.Contains(msg, "certificate required"):
		return " (the server requires a client certificate: give --tls-cert and --tls-key)"
	}
	return ""
}
