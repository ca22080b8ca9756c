package client

import (
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/rdmafs/rdmafs/meta/metapb"
	"github.com/rdmafs/rdmafs/meta/reqid"
)

// Calls behind: a mount answers some namespace changes before meta has
// applied them (a create of a name meta reserved for it, an unlink) and
// queues them. They go to meta in order, in batches (one Batch call runs
// them one after the other): with the next call the mount makes, or, when
// none comes within a short linger, on their own. A later call that depends
// on one — it names the same inode or directory, a lookup the same name,
// Sync any — goes after it: in the same batch, behind it, or once its batch
// has returned. So the mount's calls take effect at meta in the order the
// kernel saw them, and most changes answered early travel with a call the
// mount makes anyway instead of costing a round trip of their own.

// BehindTimeout is how long calls sent behind keep trying the meta servers
// (the same request ids throughout, so that a retry after a restart is
// applied once). A call still failing then is reported lost.
const BehindTimeout = 10 * time.Minute

// maxBehind bounds the calls queued or in flight behind; past it the caller
// makes its calls itself.
const maxBehind = 1024

// defaultLinger is how long calls queued behind wait for another call to
// travel with before they are sent on their own (Client.SetLinger). They
// are answered already, and another mount's access recalls the lease and
// sends them at once, so the linger costs no caller a wait; long enough, it
// lets the commit of an fsync that follows a burst of answered calls (an
// application's create, chown and locks) carry them in its own round trip.
const defaultLinger = 5 * time.Millisecond

// pkey names what a call touches: an inode (name "") or a name in a
// directory.
type pkey struct {
	ino  uint64
	name string
}

// bgCall is a call sent behind; done is closed when it has returned.
type bgCall struct {
	method string // short name, as in BatchCall
	args   proto.Message
	id     reqid.ID
	keys   []pkey
	done   chan struct{}
	cb     func(error)
	// check, if set, vets a successful result's reply before cb gets it.
	check func(reply []byte) error
}

// behind is the grpc.ClientConnInterface of a Client over its failover: it
// queues and batches the calls sent behind and orders every call after the
// calls behind it depends on.
type behind struct {
	fo    *failover
	slots chan struct{} // maxBehind
	// send is held by whoever sends queued calls (a batch of them is in
	// flight): batches go one at a time, in order.
	send     chan struct{}
	kick     chan struct{}
	stop     chan struct{}
	n        atomic.Int64 // calls queued or in flight
	linger   atomic.Int64 // time.Duration
	noBatch  atomic.Bool  // the server has no Batch (an older one)
	mu       sync.Mutex
	queue    []*bgCall
	pending  map[pkey][]*bgCall // queued or in flight
	stopOnce sync.Once
}

func newBehind(fo *failover) *behind {
	b := &behind{fo: fo, slots: make(chan struct{}, maxBehind), send: make(chan struct{}, 1),
		kick: make(chan struct{}, 1), stop: make(chan struct{}), pending: map[pkey][]*bgCall{}}
	b.linger.Store(int64(defaultLinger))
	go b.sender()
	return b
}

func (b *behind) close() { b.stopOnce.Do(func() { close(b.stop) }) }

// batchMethod is the full name of Batch.
const batchMethod = metapb.Meta_Batch_FullMethodName

// Invoke implements grpc.ClientConnInterface.
func (b *behind) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	if b.n.Load() == 0 {
		return b.fo.Invoke(ctx, method, args, reply, opts...)
	}
	if r, ok := args.(*metapb.LockRequest); ok && r.Wait {
		// A lock that may wait at meta goes alone, after what it depends
		// on: in a batch it would hold back the calls queued meanwhile as
		// long as it waits.
		if b.dependsOn(waitKeys(args)) {
			if err := b.flush(ctx); err != nil {
				return err
			}
		}
		return b.fo.Invoke(ctx, method, args, reply, opts...)
	}
	if !b.dependsOn(waitKeys(args)) {
		// Independent: it takes the queued calls along if no batch is in
		// flight, else it goes alone.
		select {
		case b.send <- struct{}{}:
			return b.sendWith(ctx, method, args, reply, opts)
		default:
			return b.fo.Invoke(ctx, method, args, reply, opts...)
		}
	}
	// Dependent: once no batch is in flight, what it depends on has
	// returned or is queued, and goes first in its batch.
	select {
	case b.send <- struct{}{}:
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
	return b.sendWith(ctx, method, args, reply, opts)
}

// NewStream implements grpc.ClientConnInterface.
func (b *behind) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	return b.fo.NewStream(ctx, desc, method, opts...)
}

// waitKeys returns what a call depends on: nil for everything (Sync).
func waitKeys(args any) []pkey {
	switch r := args.(type) {
	case *metapb.SyncRequest:
		return nil
	case *metapb.LookupRequest:
		if r.Lease {
			// The grant lists the directory: after every change in it.
			return []pkey{{r.Parent, r.Name}, {ino: r.Parent}}
		}
		return []pkey{{r.Parent, r.Name}}
	case *metapb.ReleaseRequest:
		keys := []pkey{{ino: r.Ino}}
		for _, ino := range r.More {
			keys = append(keys, pkey{ino: ino})
		}
		return keys
	}
	keys := []pkey{}
	if r, ok := args.(interface{ GetIno() uint64 }); ok && r.GetIno() != 0 {
		keys = append(keys, pkey{ino: r.GetIno()})
	}
	if r, ok := args.(interface{ GetParent() uint64 }); ok && r.GetParent() != 0 {
		keys = append(keys, pkey{ino: r.GetParent()})
	}
	if r, ok := args.(interface{ GetNewParent() uint64 }); ok && r.GetNewParent() != 0 {
		keys = append(keys, pkey{ino: r.GetNewParent()})
	}
	return keys
}

// dependsOn reports whether a call on keys (nil: on everything) must go
// after calls queued or in flight.
func (b *behind) dependsOn(keys []pkey) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if keys == nil {
		return len(b.pending) > 0
	}
	for _, k := range keys {
		if len(b.pending[k]) > 0 {
			return true
		}
	}
	return false
}

// sendWith makes the call with the queued calls before it in one batch
// (alone if none is queued). The caller holds send; it is released here.
func (b *behind) sendWith(ctx context.Context, method string, args, reply any, opts []grpc.CallOption) error {
	calls := b.take()
	if len(calls) == 0 {
		<-b.send
		return b.fo.Invoke(ctx, method, args, reply, opts...)
	}
	short := method[strings.LastIndexByte(method, '/')+1:]
	var id reqid.ID
	if !readOnly(short) {
		id = b.fo.newID()
	}
	if b.noBatch.Load() {
		b.sendEach(ctx, calls)
		<-b.send
		return b.fo.invoke(ctx, method, args, reply, id, opts...)
	}
	m, ok := args.(proto.Message)
	if !ok {
		b.requeue(calls)
		<-b.send
		return b.fo.Invoke(ctx, method, args, reply, opts...)
	}
	self := &bgCall{method: short, args: m, id: id}
	before := b.fo.mutations.Load()
	results, err := b.sendBatch(ctx, append(calls, self))
	if err != nil {
		// The calls behind go again, with the next batch.
		b.requeue(calls)
		<-b.send
		if status.Code(err) == codes.Unimplemented {
			b.noBatch.Store(true)
			return b.fo.invoke(ctx, method, args, reply, id, opts...)
		}
		return err
	}
	b.finish(calls, results)
	<-b.send
	if err := resultErr(results[len(calls)]); err != nil {
		return err
	}
	if isSyncedCommit(args) {
		// Meta made the batch durable after its last call: as a Sync.
		b.fo.coverSince(before)
	}
	return proto.Unmarshal(results[len(calls)].Reply, reply.(proto.Message))
}

// sendCalls sends calls taken from the queue (the caller holds send): in one
// batch, or one by one to a server without Batch. If the batch fails they
// are queued again as retries — unless final is set: then they fail with
// the batch's error (the sender gives up on them after BehindTimeout).
func (b *behind) sendCalls(ctx context.Context, calls []*bgCall, final bool) error {
	if !b.noBatch.Load() {
		results, err := b.sendBatch(ctx, calls)
		switch {
		case err == nil:
			b.finish(calls, results)
			return nil
		case status.Code(err) != codes.Unimplemented && !final:
			b.requeue(calls)
			return err
		case status.Code(err) != codes.Unimplemented:
			fail := &metapb.BatchResult{}
			fail.Status, _ = proto.Marshal(status.Convert(err).Proto())
			results := make([]*metapb.BatchResult, len(calls))
			for i := range results {
				results[i] = fail
			}
			b.finish(calls, results)
			return err
		}
		b.noBatch.Store(true)
	}
	b.sendEach(ctx, calls)
	return nil
}

// sendBatch sends calls as one Batch and returns their results.
func (b *behind) sendBatch(ctx context.Context, calls []*bgCall) ([]*metapb.BatchResult, error) {
	req := &metapb.BatchRequest{Calls: make([]*metapb.BatchCall, len(calls))}
	for i, c := range calls {
		body, err := proto.Marshal(c.args)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "batch: encode %s: %v", c.method, err)
		}
		req.Calls[i] = &metapb.BatchCall{Method: c.method, Request: body,
			IdClient: c.id.Client, IdSeq: c.id.Seq, IdMillis: c.id.Millis, IdRetry: c.id.Retry}
	}
	reply := &metapb.BatchReply{}
	if err := b.fo.Invoke(ctx, batchMethod, req, reply); err != nil {
		return nil, err
	}
	if len(reply.Results) != len(calls) {
		return nil, status.Errorf(codes.Internal, "batch: %d results for %d calls", len(reply.Results), len(calls))
	}
	return reply.Results, nil
}

// sendEach sends calls one by one, for a server without Batch.
func (b *behind) sendEach(ctx context.Context, calls []*bgCall) {
	results := make([]*metapb.BatchResult, len(calls))
	for i, c := range calls {
		err := b.fo.invoke(ctx, "/"+metapb.Meta_ServiceDesc.ServiceName+"/"+c.method, c.args, replyOf(c.method), c.id)
		results[i] = &metapb.BatchResult{}
		if err != nil {
			results[i].Status, _ = proto.Marshal(status.Convert(err).Proto())
		}
	}
	b.finish(calls, results)
}

// replyOf returns an empty reply message of a method sent behind.
func replyOf(method string) proto.Message {
	switch method {
	case "Create":
		return &metapb.EntryReply{}
	case "Unlink":
		return &metapb.DirReply{}
	}
	return &metapb.Empty{}
}

// resultErr returns the error a batch result reports, or nil.
func resultErr(r *metapb.BatchResult) error {
	if len(r.Status) == 0 {
		return nil
	}
	st := &spb.Status{}
	if err := proto.Unmarshal(r.Status, st); err != nil {
		return status.Errorf(codes.Internal, "batch: decode a failure: %v", err)
	}
	return status.ErrorProto(st)
}

// take removes and returns the queued calls.
func (b *behind) take() []*bgCall {
	b.mu.Lock()
	defer b.mu.Unlock()
	calls := b.queue
	b.queue = nil
	return calls
}

// requeue puts calls whose batch failed back at the head of the queue, as
// retries.
func (b *behind) requeue(calls []*bgCall) {
	for _, c := range calls {
		c.id.Retry = true
	}
	b.mu.Lock()
	b.queue = append(calls, b.queue...)
	b.mu.Unlock()
	b.wake()
}

// finish completes calls with their results.
func (b *behind) finish(calls []*bgCall, results []*metapb.BatchResult) {
	b.mu.Lock()
	for _, c := range calls {
		for _, k := range c.keys {
			list := b.pending[k]
			for i, p := range list {
				if p == c {
					list = append(list[:i], list[i+1:]...)
					break
				}
			}
			if len(list) == 0 {
				delete(b.pending, k)
			} else {
				b.pending[k] = list
			}
		}
	}
	b.mu.Unlock()
	for i, c := range calls {
		close(c.done)
		b.n.Add(-1)
		<-b.slots
		err := resultErr(results[i])
		if err == nil && c.check != nil {
			err = c.check(results[i].Reply)
		}
		if c.cb != nil {
			c.cb(err)
		}
	}
}

func (b *behind) wake() {
	select {
	case b.kick <- struct{}{}:
	default:
	}
}

// sender sends queued calls that no other call took along within the linger.
func (b *behind) sender() {
	t := time.NewTimer(time.Hour)
	t.Stop()
	for {
		select {
		case <-b.kick:
		case <-b.stop:
			return
		}
		t.Reset(time.Duration(b.linger.Load()))
		select {
		case <-t.C:
		case <-b.stop:
			return
		}
		select {
		case b.send <- struct{}{}:
		case <-b.stop:
			return
		}
		if calls := b.take(); len(calls) > 0 {
			ctx, cancel := context.WithTimeout(context.Background(), BehindTimeout)
			b.sendCalls(ctx, calls, true)
			cancel()
		}
		<-b.send
		b.mu.Lock()
		more := len(b.queue) > 0
		b.mu.Unlock()
		if more {
			b.wake()
		}
	}
}

// goCall queues the call method(args) behind and calls cb with its outcome
// once it has returned; until then, calls on keys go after it. With
// maxBehind calls queued or in flight it does nothing and returns false.
func (b *behind) goCall(method string, args proto.Message, keys []pkey, cb func(error)) bool {
	return b.goCallChecked(method, args, keys, nil, cb)
}

// goCallChecked is goCall with check, which vets (and may decode) a
// successful result's reply before cb gets the outcome.
func (b *behind) goCallChecked(method string, args proto.Message, keys []pkey, check func(reply []byte) error, cb func(error)) bool {
	select {
	case b.slots <- struct{}{}:
	default:
		return false
	}
	c := &bgCall{method: method, args: args, id: b.fo.newID(), keys: keys, done: make(chan struct{}), cb: cb, check: check}
	b.n.Add(1)
	b.mu.Lock()
	b.queue = append(b.queue, c)
	for _, k := range keys {
		b.pending[k] = append(b.pending[k], c)
	}
	b.mu.Unlock()
	b.wake()
	return true
}

// waitAll waits until every call queued or in flight behind has returned.
func (b *behind) waitAll(ctx context.Context) error {
	b.mu.Lock()
	seen := map[*bgCall]bool{}
	var all []*bgCall
	for _, list := range b.pending {
		for _, c := range list {
			if !seen[c] {
				seen[c] = true
				all = append(all, c)
			}
		}
	}
	b.mu.Unlock()
	if len(all) > 0 {
		// The queued ones go now, not after the linger; if they fail,
		// the sender retries them.
		if err := b.flush(ctx); err != nil && ctx.Err() != nil {
			return err
		}
	}
	for _, c := range all {
		select {
		case <-c.done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// CreateBehind queues req behind and calls done with the outcome: a create
// of the session the caller answers before meta applies it, with an inode
// number from NextIno, of a name a lookup reserved. It returns false,
// queuing nothing, when too many calls are behind already (the caller then
// makes the call itself).
func (s *Session) CreateBehind(req *metapb.CreateRequest, done func(error)) bool {
	return s.c.bg.goCall("Create", req, []pkey{{ino: req.Parent}, {req.Parent, req.Name}, {ino: req.Ino}}, done)
}

// CarryInline gives data, the whole content of ino, a file created with
// CreateBehind and closed since, to its create if that is still queued and
// is the last call queued on ino: meta then commits the data with the
// create, as stripe 0's first version kept inline, with mtime and ctime
// timeNs, and the data needs no call of its own. It reports whether it did;
// the caller must not change data afterwards. The create's outcome reaches
// its done, also if meta kept the file but not the data and the commit
// made in its place failed.
func (s *Session) CarryInline(ino uint64, data []byte, timeNs int64) bool {
	b := s.c.bg
	b.mu.Lock()
	defer b.mu.Unlock()
	list := b.pending[pkey{ino: ino}]
	if len(list) == 0 {
		return false
	}
	c := list[len(list)-1]
	cr, ok := c.args.(*metapb.CreateRequest)
	if !ok || cr.Ino != ino || len(cr.InlineData) > 0 || !slices.Contains(b.queue, c) {
		return false
	}
	cr.InlineData, cr.InlineTimeNs = data, timeNs
	c.check = func(reply []byte) error { return s.checkCarried(ino, data, timeNs, reply) }
	return true
}

// checkCarried checks that meta kept the data a create carried (the size in
// its reply): a meta server that predates CreateRequest.inline_data ignores
// it, and the data is then committed by a call of its own, as the first
// version of stripe 0, which it is.
func (s *Session) checkCarried(ino uint64, data []byte, timeNs int64, reply []byte) error {
	r := &metapb.EntryReply{}
	if err := proto.Unmarshal(reply, r); err != nil {
		return status.Errorf(codes.Internal, "create of inode %d: decode the reply: %v", ino, err)
	}
	if r.GetAttr().GetSize() == uint64(len(data)) {
		return nil
	}
	// Straight to the server, not behind: the caller holds the right to
	// send, and the calls queued after the create go after this one.
	ctx, cancel := context.WithTimeout(context.Background(), BehindTimeout)
	defer cancel()
	return s.c.fo.Invoke(ctx, metapb.Meta_CommitStripes_FullMethodName, &metapb.CommitStripesRequest{Ino: ino, Size: uint64(len(data)), MtimeNs: timeNs,
		Stripes: []*metapb.StripeCommit{{Stripe: 0, Length: uint64(len(data)), Inline: true, Data: data}}}, &metapb.CommitStripesReply{})
}

// UnlinkBehind is CreateBehind for an unlink of the inode req.Ino (done gets
// ENOENT if the name was removed, or given to another inode, meanwhile).
func (s *Session) UnlinkBehind(req *metapb.UnlinkRequest, done func(error)) bool {
	return s.c.bg.goCall("Unlink", req, []pkey{{ino: req.Parent}, {req.Parent, req.Name}, {ino: req.Ino}}, done)
}

// CommitBehind is CommitStripes sent behind, with the next batch of calls
// (at the latest after commitBehindWait), for a commit the caller waits for but no
// application does: the data of a file closed under its directory's lease,
// which a recall sends with the other calls behind. It returns meta's reply
// once the batch has returned, or makes the call itself when too many calls
// are behind already. The commit goes after the calls queued on req.Ino
// (the file's create).
func (c *Client) CommitBehind(ctx context.Context, req *metapb.CommitStripesRequest) (*metapb.CommitStripesReply, error) {
	reply := &metapb.CommitStripesReply{}
	done := make(chan error, 1)
	decode := func(b []byte) error {
		if err := proto.Unmarshal(b, reply); err != nil {
			return status.Errorf(codes.Internal, "commit of inode %d: decode the reply: %v", req.Ino, err)
		}
		return nil
	}
	if !c.bg.goCallChecked("CommitStripes", req, []pkey{{ino: req.Ino}}, decode, func(err error) { done <- err }) {
		return c.CommitStripes(ctx, req)
	}
	// A longer linger (Client.SetLinger) does not hold the commit longer:
	// a recall of the lease waits for it.
	wait := time.NewTimer(commitBehindWait)
	defer wait.Stop()
	for {
		select {
		case err := <-done:
			if err != nil {
				return nil, err
			}
			return reply, nil
		case <-wait.C:
			if err := c.bg.flush(ctx); err != nil && ctx.Err() != nil {
				return nil, err
			}
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
}

// commitBehindWait is how long a commit sent behind waits for a batch to
// carry it before it sends the queued calls itself.
const commitBehindWait = 2 * defaultLinger

// LockBehind is CreateBehind for a lock or unlock that does not wait
// (req.Wait false); done gets EAGAIN if meta found a conflicting lock.
func (s *Session) LockBehind(req *metapb.LockRequest, done func(error)) bool {
	return s.c.bg.goCall("Lock", req, []pkey{{ino: req.Ino}}, done)
}

// SetAttrBehind is CreateBehind for a change of req.Ino's attributes.
func (s *Session) SetAttrBehind(req *metapb.SetAttrRequest, done func(error)) bool {
	return s.c.bg.goCall("SetAttr", req, []pkey{{ino: req.Ino}}, done)
}

// maxReleaseMore bounds the inodes one Release sent behind carries (meta's
// limit: core.MaxReleasesPerCall).
const maxReleaseMore = 1024

// ReleaseBehind queues the release of the session's open of ino (a file
// closed) and calls done with the outcome of the call that carries it. If
// ino's create is still queued, the create opens nothing instead, and done
// gets nil at once. Releases queued one after the other go as one call. It
// returns false, queuing nothing, when too many calls are behind already.
func (s *Session) ReleaseBehind(ino uint64, done func(error)) bool {
	b := s.c.bg
	b.mu.Lock()
	for _, c := range b.queue {
		if cr, ok := c.args.(*metapb.CreateRequest); ok && cr.Ino == ino && cr.SessionId != 0 {
			cr.SessionId, cr.OpenFlags = 0, 0
			b.mu.Unlock()
			if done != nil {
				done(nil)
			}
			return true
		}
	}
	if n := len(b.queue); n > 0 {
		last := b.queue[n-1]
		if r, ok := last.args.(*metapb.ReleaseRequest); ok && len(r.More) < maxReleaseMore {
			r.More = append(r.More, ino)
			k := pkey{ino: ino}
			last.keys = append(last.keys, k)
			b.pending[k] = append(b.pending[k], last)
			if prev := last.cb; done != nil {
				last.cb = func(err error) {
					if prev != nil {
						prev(err)
					}
					done(err)
				}
			}
			b.mu.Unlock()
			return true
		}
	}
	b.mu.Unlock()
	return b.goCall("Release", &metapb.ReleaseRequest{Ino: ino, SessionId: s.id}, []pkey{{ino: ino}}, done)
}

// SetLinger sets how long calls queued behind wait for another call to
// travel with before they are sent on their own (default 1ms). Tests set it
// long to see what sends them otherwise.
func (c *Client) SetLinger(d time.Duration) { c.bg.linger.Store(int64(d)) }

// WaitBehind waits until every call sent behind so far has returned.
func (s *Session) WaitBehind(ctx context.Context) error { return s.c.bg.waitAll(ctx) }

// WaitIno sends the calls queued behind at once if one of them is on ino
// (a close waits for the file's create), and waits until those on ino have
// returned.
func (s *Session) WaitIno(ctx context.Context, ino uint64) error {
	b := s.c.bg
	if b.n.Load() == 0 || !b.dependsOn([]pkey{{ino: ino}}) {
		return nil
	}
	return b.flush(ctx)
}

// flush sends the queued calls at once, after the batch in flight, and
// returns once they have returned.
func (b *behind) flush(ctx context.Context) error {
	select {
	case b.send <- struct{}{}:
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
	defer func() { <-b.send }()
	if calls := b.take(); len(calls) > 0 {
		return b.sendCalls(ctx, calls, false)
	}
	return nil
}
