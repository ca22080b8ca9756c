// Package reqid carries the ids of mutating metadata requests in gRPC
// metadata, so that a request retried on another metadata server after a
// failover is executed exactly once.
package reqid

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"google.golang.org/grpc/metadata"
)

// Metadata keys.
const (
	// HeaderID carries "<client hex>-<seq>-<millis>"; client is random per
	// client process, seq counts its requests and millis is the Unix time
	// in milliseconds of the first attempt (the server orders and expires
	// outcomes by it).
	HeaderID = "rdmafs-request-id"
	// HeaderRetry is "1" on the second and later attempts of a request.
	HeaderRetry = "rdmafs-retry"
)

// ID identifies one request.
type ID struct {
	Client, Seq uint64
	// Millis is the Unix time in milliseconds of the first attempt. The
	// server keys the stored outcome by it first, so that the outcomes of
	// the requests committed together sit next to each other.
	Millis uint64
	// Retry is set when the request may have been executed already.
	Retry bool
}

// String formats the id as sent in HeaderID.
func (id ID) String() string { return fmt.Sprintf("%016x-%d-%d", id.Client, id.Seq, id.Millis) }

// Parse parses a HeaderID value.
func Parse(s string) (ID, error) {
	parts := strings.Split(s, "-")
	if len(parts) != 3 || len(parts[0]) != 16 {
		return ID{}, fmt.Errorf("reqid: malformed request id %q (want 16 hex digits, '-', sequence number, '-', milliseconds)", s)
	}
	c, q := parts[0], parts[1]
	client, err := strconv.ParseUint(c, 16, 64)
	if err != nil {
		return ID{}, fmt.Errorf("reqid: malformed client in request id %q: %w", s, err)
	}
	seq, err := strconv.ParseUint(q, 10, 64)
	if err != nil {
		return ID{}, fmt.Errorf("reqid: malformed sequence number in request id %q: %w", s, err)
	}
	millis, err := strconv.ParseUint(parts[2], 10, 64)
	if err != nil {
		return ID{}, fmt.Errorf("reqid: malformed time in request id %q: %w", s, err)
	}
	return ID{Client: client, Seq: seq, Millis: millis}, nil
}

// AppendOutgoing adds id to the outgoing metadata of ctx.
func AppendOutgoing(ctx context.Context, id ID) context.Context {
	kv := []string{HeaderID, id.String()}
	if id.Retry {
		kv = append(kv, HeaderRetry, "1")
	}
	return metadata.AppendToOutgoingContext(ctx, kv...)
}

// FromIncoming returns the request id of an incoming call, if it has one.
func FromIncoming(ctx context.Context) (ID, bool, error) {
	v := metadata.ValueFromIncomingContext(ctx, HeaderID)
	if len(v) == 0 {
		return ID{}, false, nil
	}
	id, err := Parse(v[0])
	if err != nil {
		return ID{}, false, err
	}
	r := metadata.ValueFromIncomingContext(ctx, HeaderRetry)
	id.Retry = len(r) > 0 && r[0] == "1"
	return id, true, nil
}

// NewIncoming returns ctx with id as incoming metadata (for tests and
// in-process calls).
func NewIncoming(ctx context.Context, id ID) context.Context {
	md := metadata.Pairs(HeaderID, id.String())
	if id.Retry {
		md.Set(HeaderRetry, "1")
	}
	return metadata.NewIncomingContext(ctx, md)
}
