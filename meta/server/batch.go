package server

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/rdmafs/rdmafs/meta/core"
	"github.com/rdmafs/rdmafs/meta/metapb"
	"github.com/rdmafs/rdmafs/meta/reqid"
)

// maxBatchCalls bounds the calls of one Batch.
const maxBatchCalls = 4096

// batchService is the service as gRPC serves it: core's methods, and Batch,
// which runs a batch's calls in order through the same handlers. The batch
// passed the interceptors as a whole (a mount token may not send one), so
// its calls are authenticated; each is counted in the metrics by its method.
type batchService struct {
	*core.Service
	m        *metrics
	handlers map[string]grpc.MethodHandler
}

func newBatchService(svc *core.Service, m *metrics) *batchService {
	b := &batchService{Service: svc, m: m, handlers: map[string]grpc.MethodHandler{}}
	for _, md := range metapb.Meta_ServiceDesc.Methods {
		if md.MethodName != "Batch" && md.MethodName != "Recalls" { // no long poll holds a batch back
			b.handlers[md.MethodName] = md.Handler
		}
	}
	return b
}

// Batch implements metapb.MetaServer.
func (b *batchService) Batch(ctx context.Context, req *metapb.BatchRequest) (*metapb.BatchReply, error) {
	if len(req.Calls) > maxBatchCalls {
		return nil, status.Errorf(codes.InvalidArgument, "batch of %d calls: at most %d", len(req.Calls), maxBatchCalls)
	}
	// A retried batch is a retry of each of its calls.
	outer, _, _ := reqid.FromIncoming(ctx)
	// The calls share a group commit: the reply waits for all of them to
	// be logged. If one could not be applied, none after it was, and the
	// whole batch fails to be retried; the calls applied before it answer
	// the retry from their request records.
	ctx, wait := b.Chained(ctx)
	out, err := b.runCalls(ctx, req.Calls, outer.Retry)
	if werr := wait(ctx); werr != nil {
		return nil, werr
	}
	return out, err
}

// runCalls runs the calls of a batch in order and returns their results.
func (b *batchService) runCalls(ctx context.Context, calls []*metapb.BatchCall, retry bool) (*metapb.BatchReply, error) {
	out := &metapb.BatchReply{Results: make([]*metapb.BatchResult, len(calls))}
	for i, c := range calls {
		reply, err := b.call(ctx, c, retry)
		res := &metapb.BatchResult{}
		if err == nil {
			res.Reply, err = proto.Marshal(reply)
		}
		if err != nil {
			if res.Status, err = proto.Marshal(status.Convert(err).Proto()); err != nil {
				return nil, fmt.Errorf("batch: encode a failure: %w", err)
			}
		}
		out.Results[i] = res
	}
	return out, nil
}

// call runs one call of a batch.
func (b *batchService) call(ctx context.Context, c *metapb.BatchCall, retry bool) (proto.Message, error) {
	h := b.handlers[c.Method]
	if h == nil {
		return nil, status.Errorf(codes.Unimplemented, "batch: unknown method %q", c.Method)
	}
	if c.IdClient != 0 {
		ctx = reqid.NewIncoming(ctx, reqid.ID{Client: c.IdClient, Seq: c.IdSeq, Millis: c.IdMillis, Retry: retry || c.IdRetry})
	}
	start := time.Now()
	reply, err := h(b, ctx, func(m any) error { return proto.Unmarshal(c.Request, m.(proto.Message)) }, nil)
	b.m.observe(c.Method, start, err)
	if err != nil {
		return nil, err
	}
	return reply.(proto.Message), nil
}
