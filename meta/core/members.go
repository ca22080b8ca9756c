package core

import (
	"context"
	"log/slog"
	"sort"
	"sync"
	"syscall"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/rdmafs/rdmafs/meta/keys"
	"github.com/rdmafs/rdmafs/meta/kv"
	"github.com/rdmafs/rdmafs/meta/metaerr"
	"github.com/rdmafs/rdmafs/meta/metapb"
	"github.com/rdmafs/rdmafs/meta/placement"
)

// MaxDeletesPerHeartbeat bounds the chunk deletions sent in one heartbeat reply.
const MaxDeletesPerHeartbeat = 4096

// member is the live state of a chunkserver.
type member struct {
	rec    *metapb.ChunkserverRecord
	lastHB time.Time // zero: no heartbeat since this process started
	up     bool
	free   uint64
	used   uint64
	load   float64
	chunks uint64
	// downSince is when the chunkserver was last seen going down (or when
	// this process started, for one never heard from): repair starts a
	// grace period after it.
	downSince time.Time
}

// retiring reports whether the chunkserver is being drained.
func (mb *member) retiring() bool { return mb.rec.Retiring }

// placeable reports whether new shards may go to the chunkserver: it is up
// and not being drained.
func (mb *member) placeable() bool { return mb.up && !mb.retiring() }

// members is the registry of chunkservers: registrations are stored, the
// up/down state and statistics live in memory and come from heartbeats.
type members struct {
	mu   sync.Mutex
	byID map[string]*member
}

func (m *members) init() { m.byID = map[string]*member{} }

// load adds a stored registration, down since now (the repair grace period
// counts from a restart). With takeover the chunkserver counts as up, as if
// it had sent a heartbeat at now (see Config.Takeover).
func (m *members) load(rec *metapb.ChunkserverRecord, takeover bool, now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	mb := &member{rec: rec, used: rec.Used, free: rec.Capacity - min(rec.Used, rec.Capacity), downSince: now}
	if takeover {
		mb.up, mb.lastHB = true, now
	}
	m.byID[rec.Id] = mb
}

// sweep marks down the chunkservers whose heartbeats stopped and returns
// how many it marked.
func (m *members) sweep(now time.Time, timeout time.Duration, log *slog.Logger) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for id, mb := range m.byID {
		if mb.up && now.Sub(mb.lastHB) > timeout {
			mb.up = false
			mb.downSince = now
			n++
			log.Warn("chunkserver down: heartbeat timeout", "id", id, "address", mb.rec.Address, "last_heartbeat", mb.lastHB)
		}
	}
	return n
}

// place chooses live chunkservers for the n shards of a stripe, each with at
// least minFree bytes free and none in exclude or in taken. When fewer than
// n qualify but at least need do, the stripe is placed degraded: the result
// has n entries and the ones without a chunkserver have an empty ID. Fewer
// than need live chunkservers is metaerr.Unavailable (EHOSTDOWN: writers
// wait it out); enough live ones but too few with space is ENOSPC.
func (m *members) place(n, need int, minFree uint64, exclude, taken map[string]bool) ([]placement.Candidate, error) {
	m.mu.Lock()
	cands := make([]placement.Candidate, 0, len(m.byID))
	live := 0
	for id, mb := range m.byID {
		if !mb.placeable() || exclude[id] || taken[id] {
			continue
		}
		live++
		if mb.free >= minFree {
			cands = append(cands, placement.Candidate{ID: id, Zone: mb.rec.Zone, Free: mb.free})
		}
	}
	m.mu.Unlock()
	switch {
	case len(cands) >= need:
	case live >= need:
		return nil, metaerr.New(syscall.ENOSPC, "only %d of %d live chunkservers have %d bytes free for a shard; %d needed", len(cands), live, minFree, need)
	default:
		return nil, metaerr.Unavailable("%d live chunkservers can take a shard, %d needed", live, need)
	}
	out := make([]placement.Candidate, 0, n)
	if k := min(n, len(cands)); k > 0 {
		sort.Slice(cands, func(i, j int) bool { return cands[i].ID < cands[j].ID })
		chosen, err := placement.Choose(cands, k, nil)
		if err != nil {
			return nil, err
		}
		out = append(out, chosen...)
	}
	return append(out, make([]placement.Candidate, n-len(out))...), nil
}

// withAddresses returns copies of shards with the chunkservers' addresses.
func (m *members) withAddresses(shards []*metapb.Shard) []*metapb.Shard {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]*metapb.Shard, len(shards))
	for i, sh := range shards {
		c := &metapb.Shard{ChunkId: sh.ChunkId, ServerId: sh.ServerId}
		if mb, ok := m.byID[sh.ServerId]; ok {
			c.Address = mb.rec.Address
			c.Transports = mb.rec.Transports
		}
		out[i] = c
	}
	return out
}

// memberCount returns how many chunkservers are registered and not
// retiring, up or down, and in how many zones when every one of them has a
// zone (0 when one has none).
func (m *members) memberCount() (n, zones int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	seen := map[string]bool{}
	labelled := true
	for _, mb := range m.byID {
		if !mb.retiring() {
			n++
			seen[mb.rec.Zone] = true
			labelled = labelled && mb.rec.Zone != ""
		}
	}
	if !labelled {
		return n, 0
	}
	return n, len(seen)
}

// canKeep reports whether a new version of shards can be written in place:
// every shard is placed on a chunkserver that is up, not retiring, not
// excluded and has at least minFree bytes free.
func (m *members) canKeep(shards []*metapb.Shard, minFree uint64, exclude map[string]bool) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, sh := range shards {
		mb, ok := m.byID[sh.ServerId]
		if !ok || !mb.placeable() || exclude[sh.ServerId] || mb.free < minFree {
			return false
		}
	}
	return true
}

func (m *members) isUp(id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	mb, ok := m.byID[id]
	return ok && mb.up
}

func validServerID(id string) bool {
	if id == "" || len(id) > 255 {
		return false
	}
	for i := 0; i < len(id); i++ {
		if id[i] <= ' ' || id[i] >= 0x7f {
			return false
		}
	}
	return true
}

// Register implements metapb.MetaServer. A chunkserver registers with a
// stable id; registering again updates its address, zone and capacity.
func (s *Service) Register(ctx context.Context, req *metapb.RegisterRequest) (*metapb.RegisterReply, error) {
	if !validServerID(req.Id) {
		return nil, metaerr.New(syscall.EINVAL, "register: chunkserver id %q must be 1..255 printable bytes without spaces", req.Id)
	}
	if req.Address == "" {
		return nil, metaerr.New(syscall.EINVAL, "register: chunkserver %s has no address", req.Id)
	}
	now := s.now()
	rec := &metapb.ChunkserverRecord{Id: req.Id, Address: req.Address, Transports: req.Transports, Zone: req.Zone,
		Capacity: req.Capacity, Used: req.Used, RegisteredNs: now.UnixNano()}
	if err := s.update(ctx, func(t kv.Txn) error {
		old := &metapb.ChunkserverRecord{}
		if ok, err := getMsg(t, keys.Chunkserver(req.Id), old); err != nil {
			return err
		} else if ok {
			rec.Retiring = old.Retiring // a drain survives re-registration
		}
		return putMsg(t, keys.Chunkserver(req.Id), rec)
	}); err != nil {
		return nil, err
	}
	s.members.mu.Lock()
	mb, ok := s.members.byID[req.Id]
	if !ok {
		mb = &member{}
		s.members.byID[req.Id] = mb
	}
	mb.rec, mb.lastHB, mb.up = rec, now, true
	mb.used, mb.free = req.Used, req.Capacity-min(req.Used, req.Capacity)
	s.members.mu.Unlock()
	s.log.Info("chunkserver registered", "id", req.Id, "address", req.Address, "zone", req.Zone, "capacity", req.Capacity, "transports", req.Transports)
	// A chunkd registering again has restarted: the tasks it ran are gone.
	if err := s.failTasks(ctx, "lost: its chunkserver restarted", func(t *repairTask) bool { return t.target == req.Id }); err != nil {
		return nil, err
	}
	return &metapb.RegisterReply{HeartbeatIntervalMs: max(s.cfg.HeartbeatTimeout/4, 10*time.Millisecond).Milliseconds(), ClusterId: s.cluster.ClusterId}, nil
}

// Heartbeat implements metapb.MetaServer: it records liveness and statistics,
// forgets the chunk deletions the chunkserver reports done, and returns the
// chunks it should delete next.
func (s *Service) Heartbeat(ctx context.Context, req *metapb.HeartbeatRequest) (*metapb.HeartbeatReply, error) {
	now := s.now()
	s.members.mu.Lock()
	mb, ok := s.members.byID[req.Id]
	if ok {
		if !mb.up {
			s.log.Info("chunkserver up", "id", req.Id, "address", mb.rec.Address)
		}
		mb.lastHB, mb.up = now, true
		mb.free, mb.used, mb.load, mb.chunks = req.Free, req.Used, req.Load, req.ChunkCount
	}
	out := &metapb.HeartbeatReply{}
	if ok {
		s.noteScrubLocked(req.Id, req.Scrub, out)
		s.forgetDeletedLocked(req.Id, req.Deleted)
	}
	s.members.mu.Unlock()
	if !ok {
		return &metapb.HeartbeatReply{Reregister: true}, nil
	}
	if len(req.Deleted) > 0 {
		if len(req.Deleted) > 4*MaxDeletesPerHeartbeat {
			return nil, metaerr.New(syscall.EINVAL, "heartbeat reports %d deletions (at most %d)", len(req.Deleted), 4*MaxDeletesPerHeartbeat)
		}
		if err := s.update(ctx, func(t kv.Txn) error {
			for _, d := range req.Deleted {
				if err := t.Delete(keys.GC(req.Id, d.ChunkId, d.Version)); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			return nil, err
		}
	}
	// Only durable deletions go out: a chunk version that an operation
	// answered early made garbage is referenced again if that operation
	// does not survive a crash of this machine.
	if err := s.sync(ctx); err != nil {
		return nil, err
	}
	prefix := keys.GCPrefix(req.Id)
	err := s.view(ctx, func(r kv.Reader) error {
		out.Delete = out.Delete[:0]
		return r.Scan(prefix, kv.PrefixEnd(prefix), MaxDeletesPerHeartbeat, func(k, v []byte) error {
			_, chunk, version, err := keys.ParseGC(k)
			if err != nil {
				return err
			}
			out.Delete = append(out.Delete, &metapb.ChunkRef{ChunkId: chunk, Version: version})
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// StatFS implements metapb.MetaServer: capacity is the live chunkservers'
// capacity scaled by the default layout's data fraction k/(k+m).
func (s *Service) StatFS(ctx context.Context, req *metapb.StatFSRequest) (*metapb.StatFSReply, error) {
	const bsize = 4096
	if req.Ino == TrashIno {
		// The trash reports the space of its files as its size, all used.
		var files, bytes uint64
		if err := s.view(ctx, func(r kv.Reader) error {
			var err error
			files, bytes, err = trashUsage(r)
			return err
		}); err != nil {
			return nil, err
		}
		return &metapb.StatFSReply{BlockSize: bsize, Blocks: (bytes + bsize - 1) / bsize, Files: files, NameMax: NameMax}, nil
	}
	var quota *metapb.QuotaRecord
	if req.Ino != 0 && s.quotas.hasDirs() {
		if err := s.view(ctx, func(r kv.Reader) error {
			var err error
			quota, err = s.quotaStatFS(r, req.Ino)
			return err
		}); err != nil {
			return nil, err
		}
	}
	var capacity, free uint64
	s.members.mu.Lock()
	for _, mb := range s.members.byID {
		if mb.up {
			capacity += mb.rec.Capacity
			free += min(mb.free, mb.rec.Capacity)
		}
	}
	s.members.mu.Unlock()
	k, n := uint64(s.def.K), uint64(s.def.K+s.def.M)
	scale := func(b uint64) uint64 { return b / n * k / bsize }
	files := uint64(max(s.inodes.Load(), 0))
	const filesMax = 1 << 40
	out := &metapb.StatFSReply{BlockSize: bsize, Blocks: scale(capacity), BlocksFree: scale(free), BlocksAvail: scale(free),
		Files: filesMax, FilesFree: filesMax - min(files, filesMax), NameMax: NameMax}
	if quota != nil {
		// df inside a directory with a quota shows the quota as the size.
		if q := quota.SpaceLimit; q > 0 {
			out.Blocks = q / bsize
			left := (q - min(q, quota.SpaceUsed)) / bsize
			out.BlocksFree, out.BlocksAvail = min(out.BlocksFree, left), min(out.BlocksAvail, left)
		}
		if q := quota.InodeLimit; q > 0 {
			out.Files, out.FilesFree = q, q-min(q, quota.InodesUsed)
		}
	}
	return out, nil
}

// Status implements metapb.MetaServer: membership, counts and degraded
// stripes; a brief request skips the scans (metapb.StatusRequest.Brief).
func (s *Service) Status(ctx context.Context, req *metapb.StatusRequest) (*metapb.StatusReply, error) {
	out := &metapb.StatusReply{ClusterId: s.cluster.ClusterId, DefaultLayout: metapb.LayoutOf(s.def), Sessions: uint64(s.Sessions()),
		TrashSeconds: int64(s.trashTime() / time.Second)}
	s.members.mu.Lock()
	for id, mb := range s.members.byID {
		var last int64
		if !mb.lastHB.IsZero() {
			last = mb.lastHB.UnixNano()
		}
		out.Chunkservers = append(out.Chunkservers, &metapb.ChunkserverStatus{Id: id, Address: mb.rec.Address,
			Transports: mb.rec.Transports, Zone: mb.rec.Zone, Up: mb.up, Capacity: mb.rec.Capacity, Used: mb.used,
			Free: mb.free, Load: mb.load, ChunkCount: mb.chunks, LastHeartbeatNs: last, Retiring: mb.retiring()})
	}
	out.Scrub = s.scrubStatusLocked(out.Chunkservers)
	s.members.mu.Unlock()
	sort.Slice(out.Chunkservers, func(i, j int) bool { return out.Chunkservers[i].Id < out.Chunkservers[j].Id })
	if req.GetBrief() {
		rs := s.RepairStats()
		for _, cs := range out.Chunkservers {
			cs.Shards = rs.ShardsOn[cs.Id]
		}
		s.statusProgress(out, rs)
		return out, nil
	}
	quotas, err := s.listQuotas(ctx, nil)
	if err != nil {
		return nil, err
	}
	out.Quotas = quotas.Quotas
	pending := map[string]uint64{}
	shards := map[string]uint64{}
	var health Health
	now := s.now()
	err = s.view(ctx, func(r kv.Reader) error {
		out.Files, out.Directories, out.Stripes, out.DegradedStripes, out.PendingDeletes = 0, 0, 0, 0, 0
		out.SharedBytes, out.UniqueBytes = 0, 0
		var err error
		if out.TrashFiles, out.TrashBytes, err = trashUsage(r); err != nil {
			return err
		}
		clear(pending)
		clear(shards)
		health = Health{}
		if err := r.Scan(keys.InodePrefix(), []byte{keys.PrefixInode + 1}, 0, func(k, v []byte) error {
			rec := &metapb.InodeRecord{}
			if err := proto.Unmarshal(v, rec); err != nil {
				return err
			}
			if isDir(rec.Attr) {
				out.Directories++
			} else {
				out.Files++
			}
			return nil
		}); err != nil {
			return err
		}
		if err := r.Scan([]byte{keys.PrefixStripe}, []byte{keys.PrefixStripe + 1}, 0, func(k, v []byte) error {
			st := &metapb.StripeRecord{}
			if err := proto.Unmarshal(v, st); err != nil {
				return err
			}
			if st.Version == 0 {
				return nil
			}
			out.Stripes++
			if st.Layout == nil {
				return nil
			}
			if len(st.Shards) == 0 {
				health.Healthy++ // inline: its bytes are in metadata
				return nil
			}
			shared, err := stillShared(r, st)
			if err != nil {
				return err
			}
			if shared {
				out.SharedBytes += st.Length
			} else {
				out.UniqueBytes += st.Length
			}
			s.lockRepair()
			states := s.classifyLocked(st, now)
			s.unlockRepair()
			_, lost, degraded := healthOf(states, int(st.Layout.K))
			switch {
			case lost:
				health.Lost++
			case degraded:
				health.Degraded++
			default:
				health.Healthy++
			}
			for _, sh := range st.Shards {
				shards[sh.ServerId]++
			}
			if lost || degraded {
				out.DegradedStripes++
			}
			return nil
		}); err != nil {
			return err
		}
		return r.Scan([]byte{keys.PrefixGC}, []byte{keys.PrefixGC + 1}, 0, func(k, v []byte) error {
			id, _, _, err := keys.ParseGC(k)
			if err != nil {
				return err
			}
			pending[id]++
			out.PendingDeletes++
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	for _, cs := range out.Chunkservers {
		cs.PendingDeletes = pending[cs.Id]
		cs.Shards = shards[cs.Id]
	}
	rs := s.RepairStats()
	rs.Health = health // exact as of now, not as of the last scan
	s.statusProgress(out, rs)
	return out, nil
}

// statusProgress fills in out the progress of repair (its stats rs), scrub
// and relayout.
func (s *Service) statusProgress(out *metapb.StatusReply, rs RepairStats) {
	out.Repair = rs.pb()
	out.Scrub.RepairedTotal = rs.CorruptRepaired
	s.verifyStatus(out.Scrub)
	out.Relayout = s.relayoutStatus()
}
