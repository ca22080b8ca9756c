package core

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"syscall"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/rdmafs/rdmafs/meta/keys"
	"github.com/rdmafs/rdmafs/meta/kv"
	"github.com/rdmafs/rdmafs/meta/metaerr"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// Repair: the service scans the stripe table, classifies every shard (on a
// live chunkserver, on one down for less than the grace period, lost, on a
// retiring chunkserver, or to be moved by a rebalance), queues the stripes
// that need work with the most endangered first, and hands one shard at a
// time to target chunkservers that poll with RepairPoll. A finished task
// changes the stripe's placement in one transaction that checks the stripe
// still has the version and the shard the task was planned on; otherwise the
// rebuilt chunk is collected as garbage and the stripe is planned again.

// MaxRepairTasksPerPoll bounds the tasks handed out in one RepairPoll reply.
const MaxRepairTasksPerPoll = 16

// shardState classifies one shard of a stripe.
type shardState uint8

const (
	shardOK       shardState = iota // readable, nothing to do
	shardDown                       // chunkserver down, still within the grace period
	shardLost                       // must be rebuilt: down past grace, unknown server, or corrupt
	shardRetiring                   // readable, must move: its chunkserver is being drained
)

// stripeKey names a stripe.
type stripeKey struct{ ino, stripe uint64 }

// badKey is a chunk version a chunkserver reported corrupt.
type badKey struct {
	server         string
	chunk, version uint64
}

// repairItem is a stripe waiting for work.
type repairItem struct {
	key      stripeKey
	version  uint64
	length   uint64 // bytes of file data in the stripe
	layout   *metapb.Layout
	shards   []*metapb.Shard // ids only, as stored
	work     []int           // shard indexes to rebuild or move, most urgent first
	states   []shardState
	missing  int  // shards not readable: the priority
	move     bool // only moves (drain, rebalance), no lost shard
	moveFrom []bool
}

// repairTask is a shard assigned to a target chunkserver.
type repairTask struct {
	id        uint64
	key       stripeKey
	version   uint64
	shard     int
	oldChunk  uint64
	oldServer string
	target    string
	newChunk  uint64
	deadline  time.Time
	rebalance bool // counts against the source's rebalance budget
	// verify: a parity check (scrub.go), building nothing; shards are the
	// stripe's as the task was assigned.
	verify bool
	shards []*metapb.Shard
	// relayout: a shard of a stripe's conversion (relayout.go); version is
	// the new version it builds.
	relayout *relayoutJob
}

// Health counts stripes by redundancy.
type Health struct {
	Healthy, Degraded, Lost uint64
}

// SpaceUse is what the file data of the file system is, as of the last
// repair scan: bytes in stripes shared with a snapshot (each referencing
// stripe counted) and in unshared ones, and the files and bytes kept in the
// trash.
type SpaceUse struct {
	SharedBytes, UniqueBytes uint64
	TrashFiles, TrashBytes   uint64
}

// repairState is the in-memory state of repair; it is rebuilt by the next
// scan after a restart (tasks in flight then finish as stale or fail).
type repairState struct {
	queue    []*repairItem
	inflight map[uint64]*repairTask
	busy     map[stripeKey]int       // tasks in flight per stripe
	backoff  map[stripeKey]time.Time // failed recently: not before
	bad      map[badKey]time.Time    // corrupt copies reported, and when
	budget   map[string]int          // rebalance: shards still to move off a server
	nextTask uint64

	health   Health
	space    SpaceUse
	shardsOn map[string]uint64 // shards per chunkserver as of the last scan
	lastScan time.Time

	done, failed, stale, bytes uint64
	corruptRepaired            uint64 // shards reported corrupt, rebuilt
	recent                     []rateSample

	verify   verifyState   // parity checks (scrub.go)
	relayout relayoutState // conversions to another layout (relayout.go)
	// committing holds the chunks of finished repairs whose commit is
	// under way.
	committing map[chunkRef]struct{}
}

type rateSample struct {
	at    time.Time
	bytes uint64
}

// rateWindow is the period repair throughput is averaged over.
const rateWindow = 10 * time.Second

func (r *repairState) init() {
	r.inflight = map[uint64]*repairTask{}
	r.busy = map[stripeKey]int{}
	r.backoff = map[stripeKey]time.Time{}
	r.bad = map[badKey]time.Time{}
	r.budget = map[string]int{}
	r.shardsOn = map[string]uint64{}
	r.committing = map[chunkRef]struct{}{}
	r.relayout.jobs = map[stripeKey]*relayoutJob{}
}

// classify returns the state of every shard of a stripe record. The caller
// holds s.members.mu and s.repMu.
func (s *Service) classifyLocked(st *metapb.StripeRecord, now time.Time) []shardState {
	out := make([]shardState, len(st.Shards))
	for i, sh := range st.Shards {
		mb, ok := s.members.byID[sh.ServerId]
		switch {
		case !ok:
			out[i] = shardLost
		case !mb.up && now.Sub(mb.downSince) >= s.cfg.RepairGrace:
			out[i] = shardLost
		case !mb.up:
			out[i] = shardDown
		default:
			if _, bad := s.rep.bad[badKey{sh.ServerId, sh.ChunkId, st.Version}]; bad {
				out[i] = shardLost
			} else if mb.retiring() {
				out[i] = shardRetiring
			}
		}
	}
	return out
}

// healthOf summarizes shard states: readable shards against k and k+m.
func healthOf(states []shardState, k int) (readable int, lost bool, degraded bool) {
	for _, st := range states {
		if st == shardOK || st == shardRetiring {
			readable++
		}
	}
	return readable, readable < k, readable < len(states)
}

type scannedStripe struct {
	key stripeKey
	st  *metapb.StripeRecord
}

// scanStripes reads every committed stripe.
func (s *Service) scanStripes(ctx context.Context) ([]scannedStripe, error) {
	var out []scannedStripe
	err := s.view(ctx, func(r kv.Reader) error {
		out = out[:0]
		return r.Scan([]byte{keys.PrefixStripe}, []byte{keys.PrefixStripe + 1}, 0, func(k, v []byte) error {
			ino, idx, err := keys.ParseStripe(k)
			if err != nil {
				return err
			}
			st := &metapb.StripeRecord{}
			if err := proto.Unmarshal(v, st); err != nil {
				return fmt.Errorf("stripe %d of inode %d: %w", idx, ino, err)
			}
			if st.Version == 0 || st.Layout == nil {
				return nil
			}
			if st.Shared {
				if st.Shared, err = stillShared(r, st); err != nil { // for the sharing gauges
					return err
				}
			}
			out = append(out, scannedStripe{stripeKey{ino, idx}, st})
			return nil
		})
	})
	return out, err
}

// planRepairs scans the stripe table and rebuilds the repair queue: stripes
// with lost shards first, ordered by how many shards they miss (most
// endangered first), then moves off retiring chunkservers, then rebalance
// moves. Stripes with tasks in flight or failing recently are left alone.
func (s *Service) planRepairs(ctx context.Context) error {
	stripes, err := s.scanStripes(ctx)
	if err != nil {
		return err
	}
	var space SpaceUse
	if err := s.view(ctx, func(r kv.Reader) error {
		var err error
		space.TrashFiles, space.TrashBytes, err = trashUsage(r)
		return err
	}); err != nil {
		return err
	}
	now := s.now()
	s.lockRepair()
	defer s.unlockRepair()
	r := &s.rep
	var h Health
	shardsOn := map[string]uint64{}
	budget := map[string]int{}
	for id, n := range r.budget {
		budget[id] = n
	}
	for _, t := range r.inflight {
		if t.rebalance {
			budget[t.oldServer]--
		}
	}
	assigned := map[stripeKey][]int{}
	for _, t := range r.inflight {
		assigned[t.key] = append(assigned[t.key], t.shard)
	}
	queue := make([]*repairItem, 0, len(r.queue))
	var rebalance []*repairItem
	total, eligible := s.placedShardsLocked()
	referenced := map[badKey]bool{}
	for _, sc := range stripes {
		st := sc.st
		if len(st.Shards) == 0 {
			h.Healthy++ // inline: its bytes are in metadata, nothing to repair
			continue
		}
		if st.Shared {
			space.SharedBytes += st.Length
		} else {
			space.UniqueBytes += st.Length
		}
		states := s.classifyLocked(st, now)
		k := int(st.Layout.K)
		readable, lost, degraded := healthOf(states, k)
		switch {
		case lost:
			h.Lost++
		case degraded:
			h.Degraded++
		default:
			h.Healthy++
		}
		for _, sh := range st.Shards {
			shardsOn[sh.ServerId]++
			referenced[badKey{sh.ServerId, sh.ChunkId, st.Version}] = true
		}
		if lost || now.Before(r.backoff[sc.key]) {
			continue
		}
		taken := assigned[sc.key]
		it := &repairItem{key: sc.key, version: st.Version, length: st.Length, layout: st.Layout, shards: st.Shards, states: states,
			missing: len(states) - readable}
		for i, ss := range states {
			if ss == shardLost && !containsInt(taken, i) {
				it.work = append(it.work, i)
			}
		}
		for i, ss := range states {
			if ss == shardRetiring && !containsInt(taken, i) {
				it.work = append(it.work, i)
			}
		}
		if len(taken) > 0 && len(it.work) == 0 {
			continue
		}
		if len(it.work) > 0 {
			it.move = it.missing == 0
			queue = append(queue, it)
			continue
		}
		// Rebalance: one shard of a healthy stripe off an over-full server,
		// if a server below the mean holds none of the stripe.
		for i, sh := range st.Shards {
			if len(taken) > 0 || len(budget) == 0 || !s.belowMeanFreeLocked(st.Shards, total, eligible) {
				break
			}
			if budget[sh.ServerId] > 0 {
				budget[sh.ServerId]--
				it.work = []int{i}
				it.move = true
				it.moveFrom = make([]bool, len(st.Shards))
				it.moveFrom[i] = true
				rebalance = append(rebalance, it)
				break
			}
		}
	}
	sort.SliceStable(queue, func(i, j int) bool {
		a, b := queue[i], queue[j]
		if a.move != b.move {
			return !a.move
		}
		if a.missing != b.missing {
			return a.missing > b.missing
		}
		if a.key.ino != b.key.ino {
			return a.key.ino < b.key.ino
		}
		return a.key.stripe < b.key.stripe
	})
	r.queue = append(queue, rebalance...)
	if len(rebalance) == 0 {
		rebalancing := false
		for _, t := range r.inflight {
			rebalancing = rebalancing || t.rebalance
		}
		if !rebalancing {
			clear(r.budget) // done, or nothing more can move
		}
	}
	s.planVerifiesLocked(stripes, now)
	r.health = h
	r.space = space
	r.shardsOn = shardsOn
	r.lastScan = now
	// Forget corrupt reports of versions no longer placed (repaired, rewritten
	// or deleted); keep fresh ones, which a concurrent commit may not show yet.
	for bk, at := range r.bad {
		if !referenced[bk] && now.Sub(at) > time.Minute {
			delete(r.bad, bk)
		}
	}
	for k, until := range r.backoff {
		if now.After(until) {
			delete(r.backoff, k)
		}
	}
	return nil
}

// expireRepairTasks fails the tasks whose deadline passed (the target died or
// hangs); their chunks, if any were stored, are collected.
func (s *Service) expireRepairTasks(ctx context.Context) error {
	now := s.now()
	return s.failTasks(ctx, "timed out", func(t *repairTask) bool { return now.After(t.deadline) })
}

// failTasks fails the tasks in flight that match selects; the chunks they
// may have stored are collected, and conversions they were part of are
// abandoned.
func (s *Service) failTasks(ctx context.Context, why string, match func(t *repairTask) bool) error {
	s.repMu.Lock()
	var expired []*repairTask
	var abandoned []*relayoutJob
	for id, t := range s.rep.inflight {
		if !match(t) {
			continue
		}
		delete(s.rep.inflight, id)
		if t.relayout != nil {
			s.log.Warn("relayout of a stripe: task "+why, "task", t.id, "ino", t.key.ino, "stripe", t.key.stripe, "target", t.target)
			if s.rep.relayout.jobs[t.relayout.key] == t.relayout {
				s.rep.relayout.failed++
				s.abortRelayoutLocked(t.relayout)
				abandoned = append(abandoned, t.relayout)
			}
			continue
		}
		s.unbusyLocked(t)
		if t.verify {
			s.log.Warn("stripe verification "+why, "task", t.id, "ino", t.key.ino, "stripe", t.key.stripe, "worker", t.target)
			s.rep.verify.inflight--
			s.rep.verify.failed++
			s.verifyDoneLocked()
			continue // it built nothing
		}
		s.log.Warn("repair task "+why, "task", t.id, "ino", t.key.ino, "stripe", t.key.stripe, "shard", t.shard, "target", t.target)
		expired = append(expired, t)
		s.rep.failed++
	}
	s.repMu.Unlock()
	if len(expired) == 0 && len(abandoned) == 0 {
		return nil
	}
	return s.update(ctx, func(tx kv.Txn) error {
		for _, t := range expired {
			if err := tx.Put(keys.GC(t.target, t.newChunk, t.version), nil); err != nil {
				return err
			}
		}
		for _, j := range abandoned {
			if err := dropRelayoutGrant(tx, j); err != nil {
				return err
			}
		}
		return nil
	})
}

func (s *Service) unbusyLocked(t *repairTask) {
	if s.rep.busy[t.key] <= 1 {
		delete(s.rep.busy, t.key)
	} else {
		s.rep.busy[t.key]--
	}
}

// RepairPoll implements metapb.MetaServer: a chunkserver's repair worker
// reports finished tasks and corrupt chunk versions and receives new tasks.
func (s *Service) RepairPoll(ctx context.Context, req *metapb.RepairPollRequest) (*metapb.RepairPollReply, error) {
	if len(req.Results) > 4*MaxRepairTasksPerPoll || len(req.Corrupt) > MaxDeletesPerHeartbeat {
		return nil, metaerr.New(syscall.EINVAL, "repair poll: %d results and %d corrupt reports (at most %d and %d)",
			len(req.Results), len(req.Corrupt), 4*MaxRepairTasksPerPoll, MaxDeletesPerHeartbeat)
	}
	s.members.mu.Lock()
	mb, ok := s.members.byID[req.Id]
	eligible := ok && mb.placeable()
	s.members.mu.Unlock()
	if !ok {
		return &metapb.RepairPollReply{Reregister: true}, nil
	}
	if len(req.Corrupt) > 0 {
		now := s.now()
		fresh := false
		s.repMu.Lock()
		for _, c := range req.Corrupt {
			bk := badKey{req.Id, c.ChunkId, c.Version}
			if _, known := s.rep.bad[bk]; !known {
				fresh = true
				s.log.Warn("chunkserver reports a corrupt chunk version", "id", req.Id, "chunk", c.ChunkId, "version", c.Version)
			}
			s.rep.bad[bk] = now
		}
		s.repMu.Unlock()
		if fresh {
			s.kickRepair() // rebuilt now, not at the next scan
		}
	}
	for _, res := range req.Results {
		if err := s.finishRepair(ctx, req.Id, res); err != nil {
			return nil, err
		}
	}
	out := &metapb.RepairPollReply{}
	want := min(int(req.Want), MaxRepairTasksPerPoll)
	if !eligible || want <= 0 {
		return out, nil
	}
	tasks := s.assignRepairs(req.Id, want)
	if len(tasks) == 0 {
		for _, msg := range s.assignRelayouts(req.Id, want) {
			msg.Sources = s.members.withAddresses(msg.Sources)
			out.Tasks = append(out.Tasks, msg)
		}
		return s.withVerifies(out, req.Id, want-len(out.Tasks)), nil
	}
	var first uint64
	if err := s.update(ctx, func(t kv.Txn) error {
		var err error
		first, err = nextID(t, counterChunk, uint64(len(tasks)))
		return err
	}); err != nil {
		s.repMu.Lock()
		for _, pt := range tasks {
			delete(s.rep.inflight, pt.task.id)
			s.unbusyLocked(pt.task)
		}
		s.repMu.Unlock()
		return nil, err
	}
	s.repMu.Lock()
	for i, pt := range tasks {
		pt.task.newChunk = first + uint64(i)
		pt.msg.NewChunkId = pt.task.newChunk
	}
	s.repMu.Unlock()
	for _, pt := range tasks {
		pt.msg.Sources = s.members.withAddresses(pt.msg.Sources)
		out.Tasks = append(out.Tasks, pt.msg)
	}
	return s.withVerifies(out, req.Id, want-len(tasks)), nil
}

type plannedTask struct {
	task *repairTask
	msg  *metapb.RepairTask
}

// assignRepairs takes up to want shards from the queue that target may
// build: it holds no shard of their stripe, and among the live chunkservers
// that hold none its zone holds the fewest (the placement rule).
func (s *Service) assignRepairs(target string, want int) []plannedTask {
	now := s.now()
	s.lockRepair()
	defer s.unlockRepair()
	r := &s.rep
	tmb := s.members.byID[target]
	zoneOf := func(id string) string {
		if mb, ok := s.members.byID[id]; ok && mb.rec.Zone != "" {
			return mb.rec.Zone
		}
		return "\x00" + id
	}
	// Rebalance targets: fewer shards than the mean.
	total, eligible := s.placedShardsLocked()
	var out []plannedTask
	keep := r.queue[:0]
	for qi, it := range r.queue {
		if len(out) >= want {
			keep = append(keep, r.queue[qi:]...)
			break
		}
		if len(it.work) == 0 {
			continue
		}
		holders := map[string]bool{}
		zones := map[string]int{}
		for i, sh := range it.shards {
			holders[sh.ServerId] = true
			if !containsInt(it.work, i) {
				zones[zoneOf(sh.ServerId)]++
			}
		}
		for _, t := range r.inflight {
			if t.key == it.key {
				holders[t.target] = true
				zones[zoneOf(t.target)]++
			}
		}
		// A server may rebuild a shard of its own whose copy is corrupt (it
		// is polling, so it is up): the rebuilt shard is a new chunk. Without
		// this a cluster of exactly k+m servers could never repair one.
		own := -1
		if it.moveFrom == nil {
			for i, sh := range it.shards {
				if sh.ServerId == target && containsInt(it.work, i) {
					own = i
				}
			}
		}
		ok := (!holders[target] || own >= 0) && tmb.free >= it.layout.Unit
		if ok && own >= 0 {
			for _, t := range r.inflight {
				if t.key == it.key && t.target == target {
					ok = false // already rebuilding a shard of this stripe
				}
			}
		}
		if ok && own < 0 {
			minZone := -1
			for id, mb := range s.members.byID {
				if !mb.placeable() || holders[id] {
					continue
				}
				if z := zones[zoneOf(id)]; minZone < 0 || z < minZone {
					minZone = z
				}
			}
			ok = zones[zoneOf(target)] <= minZone
		}
		if ok && it.moveFrom != nil && eligible > 0 {
			// A rebalance move only goes to a server below the mean.
			ok = r.shardsOn[target]*eligible < total
		}
		if !ok {
			keep = append(keep, it)
			continue
		}
		idx := it.work[0]
		if own >= 0 {
			idx = own
		}
		it.work = slices.DeleteFunc(it.work, func(i int) bool { return i == idx })
		r.nextTask++
		t := &repairTask{id: r.nextTask, key: it.key, version: it.version, shard: idx,
			oldChunk: it.shards[idx].ChunkId, oldServer: it.shards[idx].ServerId, target: target,
			deadline: now.Add(s.cfg.RepairTaskTimeout), rebalance: it.moveFrom != nil}
		r.inflight[t.id] = t
		r.busy[it.key]++
		if it.moveFrom != nil {
			r.shardsOn[target]++
			r.shardsOn[t.oldServer]--
		}
		msg := &metapb.RepairTask{TaskId: t.id, Ino: it.key.ino, Stripe: it.key.stripe, Version: it.version,
			Layout: it.layout, Shard: uint32(idx), StripeLength: it.length}
		for i, sh := range it.shards {
			msg.Sources = append(msg.Sources, &metapb.Shard{ChunkId: sh.ChunkId, ServerId: sh.ServerId})
			if it.states[i] == shardLost || it.states[i] == shardDown {
				msg.Unavailable = append(msg.Unavailable, uint32(i))
			}
		}
		out = append(out, plannedTask{t, msg})
		if len(it.work) > 0 {
			keep = append(keep, it)
		}
	}
	r.queue = keep
	return out
}

// lockRepair locks the membership and then the repair state (members.mu,
// then repMu: the order every holder of both takes them in); unlockRepair
// unlocks both.
func (s *Service) lockRepair() {
	s.members.mu.Lock()
	s.repMu.Lock()
}

func (s *Service) unlockRepair() {
	s.repMu.Unlock()
	s.members.mu.Unlock()
}

// placedShardsLocked returns the shards on the placeable chunkservers (up,
// not retiring), as the last scan counted them, and how many such
// chunkservers there are: a rebalance aims at the mean, total/servers. The
// caller holds members.mu and repMu.
func (s *Service) placedShardsLocked() (total, servers uint64) {
	for id, mb := range s.members.byID {
		if mb.placeable() {
			total += s.rep.shardsOn[id]
			servers++
		}
	}
	return total, servers
}

// belowMeanFreeLocked reports whether a placeable server holding fewer
// shards than the mean holds none of shards (a rebalance target exists).
func (s *Service) belowMeanFreeLocked(shards []*metapb.Shard, total, eligible uint64) bool {
	if eligible == 0 {
		return false
	}
outer:
	for id, mb := range s.members.byID {
		if !mb.placeable() || s.rep.shardsOn[id]*eligible >= total {
			continue
		}
		for _, sh := range shards {
			if sh.ServerId == id {
				continue outer
			}
		}
		return true
	}
	return false
}

func containsInt(xs []int, x int) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

// finishRepair applies a task's result. A rebuilt shard replaces the old one
// in one transaction, only if the stripe still has the task's version and
// the shard is still the one the task replaced; otherwise the rebuilt chunk
// is garbage and the stripe is planned again by the next scan.
func (s *Service) finishRepair(ctx context.Context, from string, res *metapb.RepairResult) error {
	s.repMu.Lock()
	t, ok := s.rep.inflight[res.TaskId]
	// Task ids restart after a meta restart; the chunk a task builds is
	// allocated from the durable counter, so it names the task for certain.
	if ok && (t.target != from || t.newChunk != res.NewChunkId || t.version != res.Version) {
		ok = false
	}
	if ok && t.relayout != nil {
		delete(s.rep.inflight, res.TaskId)
		s.repMu.Unlock()
		return s.finishRelayoutTask(ctx, t, res)
	}
	if ok {
		delete(s.rep.inflight, res.TaskId)
		s.unbusyLocked(t)
		if !t.verify && res.Ok {
			// Until its commit is done the chunk it built is referenced
			// by nothing stored: check must not take it for a stray.
			s.rep.committing[chunkRef{t.target, t.newChunk, t.version}] = struct{}{}
			defer func() {
				s.repMu.Lock()
				delete(s.rep.committing, chunkRef{t.target, t.newChunk, t.version})
				s.repMu.Unlock()
			}()
		}
	}
	s.repMu.Unlock()
	if ok && t.verify {
		return s.finishVerify(ctx, t, res)
	}
	if !ok {
		// Timed out and already collected, or from before a restart: what it
		// built is referenced by no stripe.
		if !res.Ok || res.NewChunkId == 0 {
			return nil
		}
		if err := s.update(ctx, func(tx kv.Txn) error { return tx.Put(keys.GC(from, res.NewChunkId, res.Version), nil) }); err != nil {
			return fmt.Errorf("repair: collect the chunk of unknown task %d: %w", res.TaskId, err)
		}
		return nil
	}
	log := s.log.With("task", t.id, "ino", t.key.ino, "stripe", t.key.stripe, "version", t.version, "shard", t.shard,
		"from", t.oldServer, "to", t.target)
	if !res.Ok {
		log.Warn("repair task failed", "err", res.Error)
		s.repMu.Lock()
		s.rep.failed++
		s.rep.backoff[t.key] = s.now().Add(s.cfg.RepairBackoff)
		s.repMu.Unlock()
		return s.update(ctx, func(tx kv.Txn) error { return tx.Put(keys.GC(t.target, t.newChunk, t.version), nil) })
	}
	stale := false
	err := s.update(ctx, func(tx kv.Txn) error {
		stale = false
		var err error
		stale, err = commitRepair(tx, t)
		return err
	})
	if err != nil {
		return err
	}
	s.repMu.Lock()
	defer s.repMu.Unlock()
	if stale {
		s.rep.stale++
		log.Info("repair result is stale: the stripe changed meanwhile; its chunk is collected")
		return nil
	}
	s.rep.done++
	s.rep.bytes += res.Bytes
	now := s.now()
	s.rep.recent = append(s.rep.recent, rateSample{now, res.Bytes})
	if _, bad := s.rep.bad[badKey{t.oldServer, t.oldChunk, t.version}]; bad {
		s.rep.corruptRepaired++
		delete(s.rep.bad, badKey{t.oldServer, t.oldChunk, t.version})
	}
	if t.rebalance {
		if s.rep.budget[t.oldServer] <= 1 {
			delete(s.rep.budget, t.oldServer)
		} else {
			s.rep.budget[t.oldServer]--
		}
	}
	log.Info("shard repaired", "bytes", res.Bytes, "took", time.Duration(res.DurationNs))
	return nil
}

// commitRepair is the version-conditioned placement update of a finished
// task. It reports stale when the stripe no longer matches the task; the
// rebuilt chunk is then queued for collection instead.
func commitRepair(tx kv.Txn, t *repairTask) (stale bool, err error) {
	st := &metapb.StripeRecord{}
	ok, err := getMsg(tx, keys.Stripe(t.key.ino, t.key.stripe), st)
	if err != nil {
		return false, err
	}
	stale = !ok || st.Version != t.version || t.shard >= len(st.Shards) ||
		st.Shards[t.shard].ChunkId != t.oldChunk || st.Shards[t.shard].ServerId != t.oldServer
	if !stale {
		for i, sh := range st.Shards {
			if sh.ServerId == t.target && i != t.shard {
				stale = true // another task placed a shard there meanwhile
			}
		}
	}
	if stale {
		return true, tx.Put(keys.GC(t.target, t.newChunk, t.version), nil)
	}
	st.Shards[t.shard] = &metapb.Shard{ChunkId: t.newChunk, ServerId: t.target}
	if err := putMsg(tx, keys.Stripe(t.key.ino, t.key.stripe), st); err != nil {
		return false, err
	}
	// The old copy is garbage: its chunkserver deletes it when it heartbeats
	// again (at once if it is live, e.g. retiring or rebalanced). A shard
	// written degraded had no chunkserver and left nothing.
	return false, dropVersion(tx, []*metapb.Shard{{ServerId: t.oldServer, ChunkId: t.oldChunk}}, t.version, st.Shared)
}

// Drain implements metapb.MetaServer: it marks a chunkserver retiring (no new
// placements; every shard moved off it, while it stays readable) or, with
// undo, a normal member again.
func (s *Service) Drain(ctx context.Context, req *metapb.DrainRequest) (*metapb.Empty, error) {
	s.members.mu.Lock()
	_, ok := s.members.byID[req.Id]
	s.members.mu.Unlock()
	if !ok {
		return nil, metaerr.New(syscall.ENOENT, "drain: no chunkserver %q is registered", req.Id)
	}
	var rec *metapb.ChunkserverRecord
	if err := s.update(ctx, func(t kv.Txn) error {
		rec = &metapb.ChunkserverRecord{}
		if ok, err := getMsg(t, keys.Chunkserver(req.Id), rec); err != nil {
			return err
		} else if !ok {
			return metaerr.New(syscall.ENOENT, "drain: no chunkserver %q is registered", req.Id)
		}
		rec.Retiring = !req.Undo
		return putMsg(t, keys.Chunkserver(req.Id), rec)
	}); err != nil {
		return nil, err
	}
	s.members.mu.Lock()
	if mb, ok := s.members.byID[req.Id]; ok {
		mb.rec = rec
	}
	s.members.mu.Unlock()
	s.log.Info("chunkserver drain", "id", req.Id, "retiring", rec.Retiring)
	s.kickRepair()
	return &metapb.Empty{}, nil
}

// Rebalance implements metapb.MetaServer: it plans moves from the live
// chunkservers holding more shards than the mean to those holding fewer.
func (s *Service) Rebalance(ctx context.Context, req *metapb.RebalanceRequest) (*metapb.RebalanceReply, error) {
	if err := s.planRepairs(ctx); err != nil {
		return nil, err
	}
	s.lockRepair()
	total, n := s.placedShardsLocked()
	var planned uint64
	if n > 0 {
		target := (total + n - 1) / n // ceil(mean)
		clear(s.rep.budget)
		for id, mb := range s.members.byID {
			if c := s.rep.shardsOn[id]; mb.placeable() && c > target {
				s.rep.budget[id] = int(c - target)
				planned += c - target
			}
		}
	}
	s.unlockRepair()
	if err := s.planRepairs(ctx); err != nil {
		return nil, err
	}
	s.log.Info("rebalance planned", "moves", planned)
	return &metapb.RebalanceReply{MovesPlanned: planned}, nil
}

// kickRepair asks the background loop to scan soon.
func (s *Service) kickRepair() {
	select {
	case s.repKick <- struct{}{}:
	default:
	}
}

// RepairStats is a snapshot of repair for metrics and status.
type RepairStats struct {
	Health              Health
	Space               SpaceUse
	Queued, MovesQueued uint64
	InFlight            uint64
	Done, Failed, Stale uint64
	CorruptRepaired     uint64 // of Done, shards reported corrupt
	BytesRebuilt        uint64
	BytesPerSecond      float64
	LastScan            time.Time
	ShardsOn            map[string]uint64
	Grace               time.Duration
}

// RepairStats returns the current state of repair.
func (s *Service) RepairStats() RepairStats {
	now := s.now()
	s.repMu.Lock()
	defer s.repMu.Unlock()
	r := &s.rep
	out := RepairStats{Health: r.health, Space: r.space, InFlight: uint64(len(r.inflight)), Done: r.done, Failed: r.failed, CorruptRepaired: r.corruptRepaired,
		Stale: r.stale, BytesRebuilt: r.bytes, LastScan: r.lastScan, Grace: s.cfg.RepairGrace,
		ShardsOn: make(map[string]uint64, len(r.shardsOn))}
	for id, n := range r.shardsOn {
		out.ShardsOn[id] = n
	}
	for _, it := range r.queue {
		out.Queued += uint64(len(it.work))
		if it.move {
			out.MovesQueued += uint64(len(it.work))
		}
	}
	out.BytesPerSecond = ratePerSecond(&r.recent, now)
	return out
}

// ratePerSecond drops the samples older than rateWindow from *recent and
// returns the bytes per second of the others.
func ratePerSecond(recent *[]rateSample, now time.Time) float64 {
	i := 0
	for i < len(*recent) && now.Sub((*recent)[i].at) > rateWindow {
		i++
	}
	*recent = (*recent)[i:]
	var sum uint64
	for _, x := range *recent {
		sum += x.bytes
	}
	return float64(sum) / rateWindow.Seconds()
}

func (rs RepairStats) pb() *metapb.RepairStatus {
	var last int64
	if !rs.LastScan.IsZero() {
		last = rs.LastScan.UnixNano()
	}
	return &metapb.RepairStatus{HealthyStripes: rs.Health.Healthy, DegradedStripes: rs.Health.Degraded,
		LostStripes: rs.Health.Lost, Queued: rs.Queued, InFlight: rs.InFlight, Done: rs.Done, Failed: rs.Failed,
		Stale: rs.Stale, BytesRebuilt: rs.BytesRebuilt, BytesPerSecond: rs.BytesPerSecond, MovesQueued: rs.MovesQueued,
		GraceMs: rs.Grace.Milliseconds(), LastScanNs: last}
}

// runRepair plans and expires repair work; Run calls it on every tick and
// whenever repair is kicked.
func (s *Service) runRepair(ctx context.Context) {
	if err := s.expireRepairTasks(ctx); err != nil && ctx.Err() == nil {
		s.log.Error("repair: expire tasks", "err", err)
	}
	if err := s.planRepairs(ctx); err != nil && ctx.Err() == nil {
		s.log.Error("repair: scan stripes", "err", err)
	}
	if err := s.planRelayouts(ctx); err != nil && ctx.Err() == nil {
		s.log.Error("relayout: plan", "err", err)
	}
}
