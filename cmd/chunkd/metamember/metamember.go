// Package metamember connects chunkd to the metadata service: it implements
// chunkserver.Membership and chunkserver.RepairPlanner with the metadata
// client's Register, Heartbeat and RepairPoll calls, converting between
// chunkd's types and meta's protobufs (metapb).
//
// Why it lives here, with cmd/chunkd: the chunkserver library and the meta
// tree are siblings that do not import each other; the chunkserver library
// states what it needs of the metadata service as Go interfaces (Membership,
// RepairPlanner) and knows nothing of metapb. This adapter is the one place
// that knows both, so it belongs above both, with the command that wires chunkd
// together (and the test harness fs/fstest, which wires a whole cluster). Under
// chunkserver/ it made the chunkserver tree depend on meta's protobufs; under
// meta/ it would make meta depend on the chunkserver library (and through it on
// rdma), an arrow pointing up (DESIGN.md lists chunkserver above meta).
package metamember

import (
	"context"
	"fmt"
	"time"

	"github.com/rdmafs/rdmafs/chunkserver"
	"github.com/rdmafs/rdmafs/chunkserver/chunk"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// Member registers a chunkserver and sends its heartbeats. chunkd deletes the
// versions a heartbeat reply names and reports those it deleted (or found gone)
// in the next heartbeat, so that the service forgets them.
type Member struct {
	meta metapb.MetaClient
}

// New returns a Member that talks to the metadata service through meta.
func New(meta metapb.MetaClient) *Member { return &Member{meta: meta} }

var _ chunkserver.Membership = (*Member)(nil)

// Register implements chunkserver.Membership.
func (m *Member) Register(ctx context.Context, info chunkserver.Info) error {
	_, err := m.meta.Register(ctx, &metapb.RegisterRequest{
		Id: info.ID, Address: info.Addr, Transports: []string{info.Transport}, Zone: info.Zone,
		Capacity: uint64(max(info.Capacity, 0)), Used: uint64(max(info.Used, 0)),
	})
	if err != nil {
		return fmt.Errorf("register chunkserver %s: %w", info.ID, err)
	}
	return nil
}

// Heartbeat implements chunkserver.Membership.
func (m *Member) Heartbeat(ctx context.Context, st chunkserver.Stats) (chunkserver.HeartbeatReply, error) {
	deleted := make([]*metapb.ChunkRef, len(st.Deleted))
	for i, k := range st.Deleted {
		deleted[i] = &metapb.ChunkRef{ChunkId: k.Chunk, Version: k.Version}
	}
	sc := st.Scrub
	r, err := m.meta.Heartbeat(ctx, &metapb.HeartbeatRequest{
		Id: st.ID, Free: uint64(max(st.Free, 0)), Used: uint64(max(st.Used, 0)),
		ChunkCount: uint64(max(st.Versions, 0)), Load: st.Load, Deleted: deleted,
		Scrub: &metapb.ScrubReport{RequestedNs: unixNano(sc.Requested), PassStartedNs: unixNano(sc.PassStarted),
			PassBytes: uint64(max(sc.PassBytes, 0)), PassTotal: uint64(max(sc.PassTotal, 0)), LastPassDoneNs: unixNano(sc.LastPassDone),
			BytesTotal: uint64(max(sc.BytesTotal, 0)), ErrorsTotal: uint64(max(sc.ErrorsTotal, 0)), CorruptPending: uint64(max(sc.CorruptPending, 0))},
	})
	if err != nil {
		return chunkserver.HeartbeatReply{}, fmt.Errorf("heartbeat of chunkserver %s: %w", st.ID, err)
	}
	if r.Reregister {
		return chunkserver.HeartbeatReply{}, chunkserver.ErrNotRegistered
	}
	out := chunkserver.HeartbeatReply{Garbage: make([]chunk.Key, len(r.Delete)), ScrubInterval: time.Duration(max(r.ScrubIntervalNs, 0))}
	for i, ref := range r.Delete {
		out.Garbage[i] = chunk.Key{Chunk: ref.ChunkId, Version: ref.Version}
	}
	if r.ScrubRequestedNs > 0 {
		out.ScrubRequested = time.Unix(0, r.ScrubRequestedNs)
	}
	return out, nil
}

// unixNano is t in nanoseconds since the epoch, 0 for the zero time.
func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// Inventory implements chunkserver.Membership.
func (m *Member) Inventory(ctx context.Context, id string, taken time.Time, versions []chunk.Key, last bool) error {
	req := &metapb.InventoryRequest{Id: id, TakenNs: unixNano(taken), Last: last, Chunks: make([]*metapb.ChunkRef, len(versions))}
	for i, k := range versions {
		req.Chunks[i] = &metapb.ChunkRef{ChunkId: k.Chunk, Version: k.Version}
	}
	if _, err := m.meta.Inventory(ctx, req); err != nil {
		return fmt.Errorf("inventory of chunkserver %s: %w", id, err)
	}
	return nil
}

var _ chunkserver.RepairPlanner = (*Member)(nil)

// RepairPoll implements chunkserver.RepairPlanner with the RepairPoll call.
func (m *Member) RepairPoll(ctx context.Context, id string, results []chunkserver.RepairResult, corrupt []chunk.Key, want int) ([]chunkserver.RepairTask, error) {
	req := &metapb.RepairPollRequest{Id: id, Want: uint32(max(want, 0))}
	for _, res := range results {
		r := &metapb.RepairResult{TaskId: res.ID, Ok: res.Err == nil, Bytes: uint64(max(res.Bytes, 0)), DurationNs: res.Duration.Nanoseconds(),
			NewChunkId: res.Key.Chunk, Version: res.Key.Version, Mismatch: res.Mismatch}
		if res.Err != nil {
			r.Error = res.Err.Error()
		}
		for _, i := range res.BadShards {
			r.BadShards = append(r.BadShards, uint32(max(i, 0)))
		}
		req.Results = append(req.Results, r)
	}
	for _, k := range corrupt {
		req.Corrupt = append(req.Corrupt, &metapb.ChunkRef{ChunkId: k.Chunk, Version: k.Version})
	}
	r, err := m.meta.RepairPoll(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("repair poll of chunkserver %s: %w", id, err)
	}
	if r.Reregister {
		return nil, chunkserver.ErrNotRegistered
	}
	tasks := make([]chunkserver.RepairTask, 0, len(r.Tasks))
	for _, t := range r.Tasks {
		tasks = append(tasks, TaskFromPB(t))
	}
	return tasks, nil
}

// TaskFromPB converts a metadata service repair task into chunkd's form.
// Shards listed unavailable, or without an address, are not read.
func TaskFromPB(t *metapb.RepairTask) chunkserver.RepairTask {
	out := chunkserver.RepairTask{ID: t.TaskId, Key: chunk.Key{Chunk: t.NewChunkId, Version: t.Version}, Shard: int(t.Shard),
		K: int(t.GetLayout().GetK()), M: int(t.GetLayout().GetM()),
		Length: int64(min(t.StripeLength, 1<<62)), Unit: int64(min(t.GetLayout().GetUnit(), 1<<40)), Verify: t.Verify}
	if to := t.RelayoutTo; to != nil {
		out.To = &chunkserver.RelayoutTarget{K: int(to.K), M: int(to.M), Unit: int64(min(to.Unit, 1<<40))}
		out.Key.Version = t.NewVersion
	}
	unavailable := map[uint32]bool{}
	for _, i := range t.Unavailable {
		unavailable[i] = true
	}
	for i, sh := range t.Sources {
		out.Sources = append(out.Sources, chunkserver.ShardSource{Addr: sh.Address, Key: chunk.Key{Chunk: sh.ChunkId, Version: t.Version},
			Available: !unavailable[uint32(i)] && sh.Address != ""})
	}
	return out
}
