package core

import (
	"context"
	"fmt"
	"math"
	"sort"
	"syscall"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/rdmafs/rdmafs/meta/keys"
	"github.com/rdmafs/rdmafs/meta/kv"
	"github.com/rdmafs/rdmafs/meta/metaerr"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// Scrubbing is the chunkservers' work (chunkserver/scrub.go): each reads
// every chunk version it stores back from disk and checks its CRC32C, a
// pass spread over Config.ScrubInterval, and reports a damaged or missing
// one as corrupt, which repair rebuilds from the other shards. Meta tells
// them the interval and the time of the last request for a pass now (in
// heartbeat replies), and keeps what each reported (in heartbeats) for
// Status.

// scrubState is meta's side of scrubbing (under members.mu).
type scrubState struct {
	requested   int64                          // the last Scrub call of everything (0: none since start)
	verifyReq   int64                          // the last Scrub call, of everything or of a subtree
	verifyScope map[uint64]bool                // the files of verifyReq's subtree (nil: every file)
	reports     map[string]*metapb.ScrubReport // by chunkserver, from heartbeats
	inventories map[string]*inventory          // by chunkserver, after its scrub passes
}

// Scrub implements metapb.MetaServer: every chunkserver starts a pass now
// (at its rate cap) unless one started after the request already, and
// every stripe's parity is checked; with req.Ino, only the parity of the
// stripes of the files below it.
func (s *Service) Scrub(ctx context.Context, req *metapb.ScrubRequest) (*metapb.ScrubReply, error) {
	var scope map[uint64]bool
	if req.Ino != 0 {
		scope = map[uint64]bool{}
		err := s.view(ctx, func(r kv.Reader) error {
			clear(scope)
			rec, err := getInode(r, req.Ino)
			if err != nil {
				return err
			}
			if !isDir(rec.Attr) {
				scope[req.Ino] = true
				return nil
			}
			return walkTree(ctx, r, req.Ino, func(de *metapb.DentryRecord) error {
				if de.Type == syscall.S_IFREG {
					scope[de.Ino] = true
				}
				return nil
			})
		})
		if err != nil {
			return nil, err
		}
	}
	now := s.now().UnixNano()
	s.members.mu.Lock()
	defer s.members.mu.Unlock()
	t := max(now, s.scrub.verifyReq+1, s.scrub.requested+1)
	s.scrub.verifyReq, s.scrub.verifyScope = t, scope
	if scope == nil {
		s.scrub.requested = t
		s.log.Info("scrub requested: every chunkserver verifies its chunks now, and the stripes' parity")
	} else {
		s.log.Info("scrub requested: the parity of the stripes of the files below an inode", "ino", req.Ino, "files", len(scope))
	}
	defer s.kickRepair() // the verifications are planned at the next scan
	return &metapb.ScrubReply{RequestedNs: t}, nil
}

// forgetDeletedLocked drops from id's list the versions it reports deleted
// (the caller holds members.mu).
func (s *Service) forgetDeletedLocked(id string, deleted []*metapb.ChunkRef) {
	if inv := s.scrub.inventories[id]; inv != nil {
		for _, d := range deleted {
			ref := chunkRef{id, d.ChunkId, d.Version}
			delete(inv.chunks, ref)
			if !inv.complete {
				inv.gone[ref] = struct{}{}
			}
		}
	}
}

// isGone reports whether ref was reported deleted since the list began.
func (inv *inventory) isGone(ref chunkRef) bool {
	_, gone := inv.gone[ref]
	return gone
}

// noteScrubLocked keeps a chunkserver's report and returns what its
// heartbeat's reply tells it (the caller holds members.mu).
func (s *Service) noteScrubLocked(id string, r *metapb.ScrubReport, out *metapb.HeartbeatReply) {
	if r != nil {
		if s.scrub.reports == nil {
			s.scrub.reports = map[string]*metapb.ScrubReport{}
		}
		s.scrub.reports[id] = r
	}
	out.ScrubIntervalNs = s.cfg.ScrubInterval.Nanoseconds()
	out.ScrubRequestedNs = s.scrub.requested
}

// scrubStatusLocked sums the reports of the chunkservers in cs, filling in
// each one's (the caller holds members.mu).
func (s *Service) scrubStatusLocked(cs []*metapb.ChunkserverStatus) *metapb.ScrubStatus {
	st := &metapb.ScrubStatus{IntervalNs: s.cfg.ScrubInterval.Nanoseconds(), RequestedNs: s.scrub.requested, VerifyRequestedNs: s.scrub.verifyReq}
	oldest, all := int64(0), true
	for _, c := range cs {
		r := s.scrub.reports[c.Id]
		c.Scrub = r
		if r == nil {
			if c.Up {
				all = false
			}
			continue
		}
		st.BytesTotal += r.BytesTotal
		st.ErrorsTotal += r.ErrorsTotal
		if !c.Up {
			continue
		}
		st.CorruptPending += r.CorruptPending
		if r.LastPassDoneNs == 0 {
			all = false
		} else if oldest == 0 || r.LastPassDoneNs < oldest {
			oldest = r.LastPassDoneNs
		}
	}
	if all {
		st.LastFullPassNs = oldest
	}
	return st
}

// Parity verification. A chunk's CRC32C proves its bytes are those written,
// not that a stripe's shards agree with each other (a write path bug, a
// shard from the wrong version). So the chunkservers' repair workers also
// verify whole stripes: read every shard, check the parity against the
// data, and name the shards that disagree (each rebuilt from the others in
// turn: the one whose rebuilt copy makes the stripe consistent is wrong),
// which are then rebuilt like corrupt ones. Every committed stripe is
// verified once per ScrubInterval (a share of them at each repair scan),
// and all of them at once after a Scrub request.

// verifyState is meta's side of it (under repMu).
type verifyState struct {
	queue                []*verifyItem
	cursor               stripeKey // the periodic share resumes after it
	pass                 int64     // the request the queued pass covers (0: periodic)
	covered              int64     // the latest request a finished pass covered
	inflight             int
	verified, mismatches uint64
	failed               uint64 // could not be done (a shard unreadable, no memory, timed out)
}

// verifyItem is a stripe to verify, as the scan read it.
type verifyItem struct {
	key stripeKey
	st  *metapb.StripeRecord
}

// planVerifiesLocked queues stripes to verify, from the scan's stripes in
// key order (the caller holds members.mu and repMu): all of them for a
// request no pass covers yet, else the share the interval asks for.
func (s *Service) planVerifiesLocked(stripes []scannedStripe, now time.Time) {
	v := &s.rep.verify
	if len(v.queue) > 0 || v.inflight > 0 || len(s.rep.queue) > 0 || len(s.rep.inflight) > 0 {
		return // the queued ones first, and repairs before verifications
	}
	eligible := func(sc scannedStripe) bool {
		if len(sc.st.Shards) < 2 || s.rep.busy[sc.key] > 0 {
			return false // inline, or a single copy: nothing to compare; or being repaired
		}
		for _, st := range s.classifyLocked(sc.st, now) {
			if st != shardOK && st != shardRetiring {
				return false // repair first
			}
		}
		return true
	}
	if req := s.scrub.verifyReq; req > v.covered {
		v.pass = req
		for _, sc := range stripes {
			if eligible(sc) && (s.scrub.verifyScope == nil || s.scrub.verifyScope[sc.key.ino]) {
				v.queue = append(v.queue, &verifyItem{sc.key, sc.st})
			}
		}
		s.verifyDoneLocked()
		return
	}
	if len(stripes) == 0 || s.cfg.ScrubInterval <= 0 {
		return
	}
	share := int(math.Ceil(float64(len(stripes)) * float64(s.cfg.RepairInterval) / float64(s.cfg.ScrubInterval)))
	start := sort.Search(len(stripes), func(i int) bool { return !stripeBefore(stripes[i].key, v.cursor) })
	for i := 0; i < min(share, len(stripes)); i++ {
		sc := stripes[(start+i)%len(stripes)]
		v.cursor = stripeKey{sc.key.ino, sc.key.stripe + 1}
		if eligible(sc) {
			v.queue = append(v.queue, &verifyItem{sc.key, sc.st})
		}
	}
}

func stripeBefore(a, b stripeKey) bool {
	return a.ino < b.ino || a.ino == b.ino && a.stripe < b.stripe
}

// verifyDoneLocked ends the requested pass once nothing of it is left
// (the caller holds repMu).
func (s *Service) verifyDoneLocked() {
	v := &s.rep.verify
	if v.pass != 0 && len(v.queue) == 0 && v.inflight == 0 {
		v.covered, v.pass = v.pass, 0
		s.log.Info("scrub: every stripe's parity verified", "verified", v.verified, "mismatches", v.mismatches)
	}
}

// withVerifies adds to out up to want verifications for worker.
func (s *Service) withVerifies(out *metapb.RepairPollReply, worker string, want int) *metapb.RepairPollReply {
	for _, pt := range s.assignVerifies(worker, want) {
		pt.msg.Sources = s.members.withAddresses(pt.msg.Sources)
		out.Tasks = append(out.Tasks, pt.msg)
	}
	return out
}

// assignVerifies hands up to want queued stripes to worker.
func (s *Service) assignVerifies(worker string, want int) []plannedTask {
	if want <= 0 {
		return nil
	}
	now := s.now()
	s.repMu.Lock()
	defer s.repMu.Unlock()
	r := &s.rep
	var out []plannedTask
	for len(out) < want && len(r.verify.queue) > 0 {
		it := r.verify.queue[0]
		r.verify.queue = r.verify.queue[1:]
		if r.busy[it.key] > 0 {
			continue // a repair took it meanwhile
		}
		r.nextTask++
		t := &repairTask{id: r.nextTask, key: it.key, version: it.st.Version, shard: -1, target: worker,
			deadline: now.Add(s.cfg.RepairTaskTimeout), verify: true, shards: it.st.Shards}
		r.inflight[t.id] = t
		r.busy[it.key]++
		r.verify.inflight++
		msg := &metapb.RepairTask{TaskId: t.id, Ino: it.key.ino, Stripe: it.key.stripe, Version: it.st.Version,
			Layout: it.st.Layout, StripeLength: it.st.Length, Verify: true}
		for _, sh := range it.st.Shards {
			msg.Sources = append(msg.Sources, &metapb.Shard{ChunkId: sh.ChunkId, ServerId: sh.ServerId})
		}
		out = append(out, plannedTask{t, msg})
	}
	s.verifyDoneLocked()
	return out
}

// finishVerify applies a verification's result: the shards it names are
// marked corrupt (and rebuilt) if the stripe still has that version.
func (s *Service) finishVerify(ctx context.Context, t *repairTask, res *metapb.RepairResult) error {
	s.repMu.Lock()
	s.rep.verify.inflight--
	if res.Ok {
		s.rep.verify.verified++
	} else {
		s.rep.verify.failed++
	}
	s.verifyDoneLocked()
	s.repMu.Unlock()
	if !res.Ok {
		s.log.Warn("stripe verification failed", "task", t.id, "ino", t.key.ino, "stripe", t.key.stripe, "worker", t.target, "err", res.Error)
		return nil
	}
	if len(res.BadShards) == 0 && !res.Mismatch {
		return nil
	}
	var current bool
	if err := s.view(ctx, func(r kv.Reader) error {
		st := &metapb.StripeRecord{}
		ok, err := getMsg(r, keys.Stripe(t.key.ino, t.key.stripe), st)
		current = ok && st.Version == t.version
		return err
	}); err != nil {
		return err
	}
	if !current {
		return nil // rewritten since: the mismatch is gone with its version
	}
	now := s.now()
	s.repMu.Lock()
	s.rep.verify.mismatches++
	if len(res.BadShards) == 0 {
		s.log.Error("scrub: a stripe's shards disagree and no single shard explains it: nothing rebuilt; the file's data there may be wrong",
			"ino", t.key.ino, "stripe", t.key.stripe, "version", t.version)
	}
	for _, i := range res.BadShards {
		if int(i) >= len(t.shards) {
			continue
		}
		sh := t.shards[i]
		s.log.Error("scrub: a shard disagrees with the rest of its stripe: rebuilding it", "ino", t.key.ino, "stripe", t.key.stripe,
			"version", t.version, "shard", i, "chunkserver", sh.ServerId, "chunk", sh.ChunkId)
		s.rep.bad[badKey{sh.ServerId, sh.ChunkId, t.version}] = now
	}
	s.repMu.Unlock()
	s.kickRepair()
	return nil
}

// verifyStatus fills st's verification figures.
func (s *Service) verifyStatus(st *metapb.ScrubStatus) {
	s.repMu.Lock()
	defer s.repMu.Unlock()
	v := &s.rep.verify
	st.StripesVerified, st.ParityMismatches, st.VerifyCoveredNs, st.VerifyFailed = v.verified, v.mismatches, v.covered, v.failed
	if v.pass != 0 {
		st.StripesToVerify = uint64(len(v.queue) + v.inflight)
	}
}

// Inventories: after each scrub pass a chunkserver sends the list of the
// chunk versions it stores; Check reports those nothing references (no
// stripe, no write grant, no repair in flight, not already queued for
// deletion), and its repair queues them for deletion.

// MaxInventoryPerCall bounds the chunk versions of one Inventory call.
const MaxInventoryPerCall = 1 << 16

// maxInventory bounds the chunk versions kept of one chunkserver's list.
const maxInventory = 1 << 24

// inventory is a chunkserver's list (under members.mu).
type inventory struct {
	taken     int64
	chunks    map[chunkRef]struct{} // less those deleted since (heartbeats report them)
	gone      map[chunkRef]struct{} // deleted since the list began: a later part must not add them back
	complete  bool
	completed time.Time // by meta's clock
	overflow  bool
}

// chunkRef names a chunk version on a chunkserver.
type chunkRef struct {
	server         string
	chunk, version uint64
}

// Inventory implements metapb.MetaServer.
func (s *Service) Inventory(ctx context.Context, req *metapb.InventoryRequest) (*metapb.Empty, error) {
	if len(req.Chunks) > MaxInventoryPerCall {
		return nil, metaerr.New(syscall.EINVAL, "inventory of %d chunk versions in one call (at most %d)", len(req.Chunks), MaxInventoryPerCall)
	}
	s.members.mu.Lock()
	defer s.members.mu.Unlock()
	if _, ok := s.members.byID[req.Id]; !ok {
		return nil, metaerr.New(syscall.ENOENT, "inventory of unknown chunkserver %q", req.Id)
	}
	if s.scrub.inventories == nil {
		s.scrub.inventories = map[string]*inventory{}
	}
	inv := s.scrub.inventories[req.Id]
	if inv == nil || inv.taken != req.TakenNs {
		inv = &inventory{taken: req.TakenNs, chunks: map[chunkRef]struct{}{}, gone: map[chunkRef]struct{}{}}
		s.scrub.inventories[req.Id] = inv
	}
	if inv.complete {
		return &metapb.Empty{}, nil // a retry of the last part
	}
	for _, c := range req.Chunks {
		if len(inv.chunks) >= maxInventory {
			inv.overflow = true
			break
		}
		if ref := (chunkRef{req.Id, c.ChunkId, c.Version}); !inv.isGone(ref) {
			inv.chunks[ref] = struct{}{}
		}
	}
	if req.Last {
		inv.complete, inv.completed, inv.gone = true, s.now(), nil
	}
	return &metapb.Empty{}, nil
}

// repairChunksLocked returns the chunks repairs in flight build or commit
// (the caller holds repMu).
func (s *Service) repairChunksLocked() map[chunkRef]bool {
	out := map[chunkRef]bool{}
	for _, t := range s.rep.inflight {
		if !t.verify {
			out[chunkRef{t.target, t.newChunk, t.version}] = true
		}
	}
	for c := range s.rep.committing {
		out[c] = true
	}
	return out
}

// inventoryFindings reports the chunk versions of the chunkservers' lists
// that nothing in r references, and notes the chunkservers without a
// complete list. referenced holds the stripes' shards as the check read
// them, repairs the chunks of repairs in flight before it read them. Only
// lists complete before the check began (at began) are used: every
// version in them existed before its snapshot, so one it does not
// reference is no write's or repair's in progress.
func (s *Service) inventoryFindings(r kv.Reader, referenced, repairs map[chunkRef]bool, began time.Time, report func(fix func(context.Context) (string, error), format string, args ...any)) ([]string, error) {
	if err := r.Scan([]byte{keys.PrefixGrant}, []byte{keys.PrefixGrant + 1}, 0, func(k, v []byte) error {
		_, _, version, err := keys.ParseGrant(k)
		if err != nil {
			return err
		}
		g := &metapb.GrantRecord{}
		if err := proto.Unmarshal(v, g); err != nil {
			return err
		}
		for _, sh := range g.Shards {
			referenced[chunkRef{sh.ServerId, sh.ChunkId, version}] = true
		}
		return nil
	}); err != nil {
		return nil, err
	}
	if err := r.Scan([]byte{keys.PrefixGC}, []byte{keys.PrefixGC + 1}, 0, func(k, _ []byte) error {
		id, chunk, version, err := keys.ParseGC(k)
		if err != nil {
			return err
		}
		referenced[chunkRef{id, chunk, version}] = true
		return nil
	}); err != nil {
		return nil, err
	}
	for c := range repairs {
		referenced[c] = true
	}
	var notes []string
	s.members.mu.Lock()
	defer s.members.mu.Unlock()
	ids := make([]string, 0, len(s.members.byID))
	for id := range s.members.byID {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		inv := s.scrub.inventories[id]
		switch {
		case inv == nil || !inv.complete:
			notes = append(notes, fmt.Sprintf("chunkserver %s: no complete list of its chunks yet, so its unreferenced chunks are not checked (it sends one after each scrub pass: rdmafs admin scrub --wait)", id))
			continue
		case !inv.completed.Before(began):
			notes = append(notes, fmt.Sprintf("chunkserver %s: its list of chunks arrived during the check; it is compared at the next one", id))
			continue
		case inv.overflow:
			notes = append(notes, fmt.Sprintf("chunkserver %s: its list of chunks is longer than %d; only those were checked", id, maxInventory))
		}
		var stray []chunkRef
		for c := range inv.chunks {
			if !referenced[c] {
				stray = append(stray, c)
			}
		}
		sort.Slice(stray, func(i, j int) bool {
			return stray[i].chunk < stray[j].chunk || stray[i].chunk == stray[j].chunk && stray[i].version < stray[j].version
		})
		for _, c := range stray {
			report(s.fixUnreferenced(c), "chunk %d version %d on chunkserver %s: nothing references it", c.chunk, c.version, c.server)
		}
	}
	return notes, nil
}

// fixUnreferenced queues an unreferenced chunk version for deletion.
func (s *Service) fixUnreferenced(c chunkRef) func(context.Context) (string, error) {
	return func(ctx context.Context) (string, error) {
		return s.fixed(ctx, func(t kv.Txn) (string, error) {
			return fmt.Sprintf("chunk %d version %d on chunkserver %s: queued for deletion", c.chunk, c.version, c.server),
				t.Put(keys.GC(c.server, c.chunk, c.version), nil)
		})
	}
}
