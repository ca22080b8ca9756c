package core

import (
	"context"
	"fmt"
	"syscall"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/rdmafs/rdmafs/internal/stripe"
	"github.com/rdmafs/rdmafs/meta/keys"
	"github.com/rdmafs/rdmafs/meta/kv"
	"github.com/rdmafs/rdmafs/meta/metaerr"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// Relayout: converting existing files to another layout while they are in
// use. A request sets each file's layout at once (new writes take it) and
// marks the file with a relayout key; the repair loop then converts the
// stripes still in the old layout one at a time. A stripe's conversion is a
// grant of a new version in the new layout, stored like any writer's (so a
// crash leaves nothing that expiry does not collect), whose k+m shards are
// built by the chunkservers that will hold them, each re-encoding the
// stripe it reads; when all are built one transaction swaps the stripe to
// the new version if it still has the version that was read (the
// compare-and-set a writer's commit does), and the old shards are
// collected. A writer that commits first wins: its stripe is in the new
// layout already, or is converted again. A file keeps its stripe size (k
// times unit), so that stripe i holds the same bytes in either layout and
// readers decode each stripe with the layout it records.

// relayoutJob is one stripe being converted.
type relayoutJob struct {
	key        stripeKey
	version    uint64 // the committed version it converts
	length     uint64
	from       *metapb.Layout
	shards     []*metapb.Shard // the stripe's, as committed (ids only)
	to         *metapb.Layout
	newVersion uint64
	targets    []*metapb.Shard // the new version's granted placement
	assigned   []bool
	built      int
}

// relayoutState is the in-memory side of conversions (under repMu); the
// relayout keys and the grants are the durable side.
type relayoutState struct {
	jobs                       map[stripeKey]*relayoutJob
	pending                    uint64 // files with a relayout key at the last plan
	swept                      bool   // the grants of conversions before a restart are collected
	done, failed, stale, bytes uint64
	recent                     []rateSample
}

// sameCoding reports whether stripes of layouts a and b are stored alike
// (min-write-shards and the inline size do not change stored data).
func sameCoding(a, b *metapb.Layout) bool {
	return a != nil && b != nil && a.K == b.K && a.M == b.M && a.Unit == b.Unit
}

// relayoutTarget returns the layout a file of layout cur takes for a
// request of layout want: want's k, m and min-write-shards with cur's
// stripe size and inline size.
func relayoutTarget(cur *metapb.Layout, want stripe.Layout) (stripe.Layout, error) {
	c := cur.Stripe()
	size := c.StripeSize()
	l := stripe.Layout{K: want.K, M: want.M, MinWrite: want.MinWrite, Inline: c.Inline}
	if want.K > 0 && size%int64(want.K) == 0 {
		l.Unit = size / int64(want.K)
	}
	if l.Unit == 0 || l.Unit%4096 != 0 {
		return l, fmt.Errorf("stripes of %d bytes (%d+%d, unit %d) do not split into %d units of a multiple of 4 KiB; relayout keeps a file's stripe size",
			size, c.K, c.M, c.Unit, want.K)
	}
	if err := l.Validate(); err != nil {
		return l, err
	}
	return l, nil
}

// checkLayoutFits refuses a layout the cluster cannot place: fewer
// registered chunkservers than k+m, or zones that would each hold more
// shards of a stripe than its parity.
func (s *Service) checkLayoutFits(l stripe.Layout) error {
	// A cluster without chunkservers yet (being set up) takes any layout.
	n, zones := s.members.memberCount()
	if n > 0 && n < l.K+l.M {
		return metaerr.New(syscall.EINVAL, "layout %d+%d needs %d chunkservers to place its shards; the cluster has %d (registered, not retiring)", l.K, l.M, l.K+l.M, n)
	}
	// Placement spreads a stripe's shards evenly over the zones: a zone
	// then holds up to ceil((k+m)/zones) of them, which must not exceed m
	// for the stripe to survive the loss of a zone.
	if perZone := (l.K + l.M + zones - 1) / max(zones, 1); zones > 1 && perZone > l.M {
		return metaerr.New(syscall.EINVAL, "layout %d+%d over %d zones puts up to %d shards in one zone, more than its %d parity shards: losing a zone would lose data (use more zones or more parity)",
			l.K, l.M, zones, perZone, l.M)
	}
	return nil
}

// relayoutTaskTimeout bounds one shard of a conversion: a stripe's read
// and one shard's write, which take well under a second on a healthy
// chunkserver.
const relayoutTaskTimeout = 30 * time.Second

// relayoutBatch bounds the files changed in one transaction of a request.
const relayoutBatch = 256

// Relayout implements metapb.MetaServer: it sets the layout of a file, or
// of every file and directory below a directory, and queues the files'
// stripes for conversion; with req.Progress it only counts what is left.
func (s *Service) Relayout(ctx context.Context, req *metapb.RelayoutRequest) (*metapb.RelayoutReply, error) {
	if req.Progress {
		return s.relayoutProgress(ctx, req.Ino)
	}
	want := req.GetLayout().Stripe()
	if want.Unit == 0 {
		want.Unit = 4096 // validated per file and directory below, with their stripe sizes
	}
	if err := want.Validate(); err != nil {
		return nil, metaerr.New(syscall.EINVAL, "relayout: %v", err)
	}
	if err := s.checkLayoutFits(want); err != nil {
		return nil, err
	}
	c := caller(req.Caller)
	type item struct {
		ino uint64
		dir bool
	}
	var items []item
	// Every target is checked before anything changes.
	if err := s.view(ctx, func(r kv.Reader) error {
		items = items[:0]
		check := func(ino uint64) error {
			rec, err := getInode(r, ino)
			if err != nil {
				return err
			}
			switch {
			case isDir(rec.Attr):
				if !isOwner(c, rec.Attr) {
					return metaerr.New(syscall.EPERM, "relayout: uid %d does not own directory inode %d", c.Uid, ino)
				}
				if _, err := s.dirRelayout(rec, req.Layout); err != nil {
					return metaerr.New(syscall.EINVAL, "relayout of directory inode %d: %v", ino, err)
				}
				items = append(items, item{ino, true})
			case isReg(rec.Attr) && rec.Attr.Layout != nil:
				if !isOwner(c, rec.Attr) {
					return metaerr.New(syscall.EPERM, "relayout: uid %d does not own file inode %d", c.Uid, ino)
				}
				if _, err := relayoutTarget(rec.Attr.Layout, want); err != nil {
					return metaerr.New(syscall.EINVAL, "relayout of file inode %d: %v", ino, err)
				}
				items = append(items, item{ino, false})
			}
			return nil
		}
		if err := check(req.Ino); err != nil {
			return err
		}
		if len(items) == 0 || !items[0].dir {
			return nil
		}
		return walkTree(ctx, r, req.Ino, func(de *metapb.DentryRecord) error {
			if de.Type != syscall.S_IFDIR && de.Type != syscall.S_IFREG {
				return nil
			}
			return check(de.Ino)
		})
	}); err != nil {
		return nil, err
	}
	for _, it := range items {
		if it.dir {
			if err := s.awaitDir(ctx, c.Session, it.ino); err != nil { // new files there take the old layout
				return nil, err
			}
		}
	}
	out := &metapb.RelayoutReply{}
	for len(items) > 0 {
		batch := items[:min(len(items), relayoutBatch)]
		items = items[len(batch):]
		var queued uint64
		if err := s.update(ctx, func(t kv.Txn) error {
			queued = 0
			for _, it := range batch {
				rec, err := getInode(t, it.ino)
				if metaerr.Errno(err) == syscall.ENOENT {
					continue // removed meanwhile
				}
				if err != nil {
					return err
				}
				if it.dir {
					l, err := s.dirRelayout(rec, req.Layout)
					if err != nil {
						return metaerr.New(syscall.EINVAL, "relayout of directory inode %d: %v", it.ino, err)
					}
					rec.DirLayout = metapb.LayoutOf(l)
					rec.Attr.CtimeNs = s.now().UnixNano()
					if err := s.putInode(t, rec); err != nil {
						return err
					}
					continue
				}
				if !isReg(rec.Attr) || rec.Attr.Layout == nil {
					continue
				}
				l, err := relayoutTarget(rec.Attr.Layout, want)
				if err != nil {
					return metaerr.New(syscall.EINVAL, "relayout of file inode %d: %v", it.ino, err)
				}
				if proto.Equal(rec.Attr.Layout, metapb.LayoutOf(l)) {
					continue
				}
				rec.Attr.Layout = metapb.LayoutOf(l)
				if err := s.putInode(t, rec); err != nil {
					return err
				}
				if err := t.Put(keys.Relayout(it.ino), nil); err != nil {
					return err
				}
				queued++
			}
			return nil
		}); err != nil {
			return nil, err
		}
		out.FilesQueued += queued
	}
	s.log.Info("relayout requested", "ino", req.Ino, "layout", want.String(), "files", out.FilesQueued)
	s.kickRepair()
	return out, nil
}

// dirRelayout returns the layout directory rec gives new files after a
// relayout to want: want's unit, or by default the stripe size it gave
// before over want's k, so that new files have the converted files'
// stripe size.
func (s *Service) dirRelayout(rec *metapb.InodeRecord, want *metapb.Layout) (stripe.Layout, error) {
	cur := rec.DirLayout
	if cur == nil {
		cur = metapb.LayoutOf(s.def)
	}
	w := want.Stripe()
	if w.Unit > 0 {
		l := w
		l.Inline = cur.Stripe().Inline
		return l, l.Validate()
	}
	return relayoutTarget(cur, w)
}

// relayoutProgress counts the stripes below ino (a file or a directory)
// and those still in a layout other than their file's.
func (s *Service) relayoutProgress(ctx context.Context, ino uint64) (*metapb.RelayoutReply, error) {
	out := &metapb.RelayoutReply{}
	err := s.view(ctx, func(r kv.Reader) error {
		out = &metapb.RelayoutReply{}
		count := func(ino uint64) error {
			rec, err := getInode(r, ino)
			if err != nil || !isReg(rec.Attr) || rec.Attr.Layout == nil {
				return err
			}
			stripes, _, err := fileStripes(r, ino, 0, ^uint64(0))
			left := false
			for _, sc := range stripes {
				if len(sc.st.Shards) == 0 {
					continue
				}
				out.StripesTotal++
				out.BytesTotal += sc.st.Length
				if !sameCoding(sc.st.Layout, rec.Attr.Layout) {
					left = true
					out.StripesLeft++
					out.BytesLeft += sc.st.Length
				}
			}
			if left {
				out.FilesLeft++
			}
			return err
		}
		if err := count(ino); err != nil {
			return err
		}
		rec, err := getInode(r, ino)
		if err != nil || !isDir(rec.Attr) {
			return err
		}
		return walkTree(ctx, r, ino, func(de *metapb.DentryRecord) error {
			if de.Type != syscall.S_IFREG {
				return nil
			}
			return count(de.Ino)
		})
	})
	return out, err
}

// relayoutCandidate is a stripe found in a layout other than its file's.
type relayoutCandidate struct {
	key stripeKey
	st  *metapb.StripeRecord
	to  *metapb.Layout
}

// planRelayouts starts conversions of stripes of the files with a relayout
// key, up to a number in flight that keeps every chunkserver busy, and
// removes the keys of files that are done.
func (s *Service) planRelayouts(ctx context.Context) error {
	if err := s.sweepRelayouts(ctx); err != nil {
		return err
	}
	s.lockRepair()
	_, servers := s.placedShardsLocked()
	room := 2*int(servers) + 4 - len(s.rep.relayout.jobs)
	converting := make(map[stripeKey]bool, len(s.rep.relayout.jobs))
	for k := range s.rep.relayout.jobs {
		converting[k] = true
	}
	s.unlockRepair()
	var cands []relayoutCandidate
	var finished []uint64
	var pending uint64
	if err := s.view(ctx, func(r kv.Reader) error {
		cands, finished, pending = cands[:0], finished[:0], 0
		var inos []uint64
		if err := r.Scan([]byte{keys.PrefixRelayout}, []byte{keys.PrefixRelayout + 1}, 0, func(k, _ []byte) error {
			ino, err := keys.ParseRelayout(k)
			if err != nil {
				return err
			}
			inos = append(inos, ino)
			return nil
		}); err != nil {
			return err
		}
		pending = uint64(len(inos))
		for _, ino := range inos {
			if len(cands) >= room {
				break
			}
			left, c, err := s.relayoutLeft(r, ino, room-len(cands), converting)
			if err != nil {
				return err
			}
			if !left {
				finished = append(finished, ino)
			}
			cands = append(cands, c...)
		}
		return nil
	}); err != nil {
		return err
	}
	if len(finished) > 0 {
		if err := s.finishRelayoutFiles(ctx, finished); err != nil {
			return err
		}
		pending -= uint64(len(finished))
	}
	now := s.now()
	s.lockRepair()
	s.rep.relayout.pending = pending
	ready := cands[:0]
	for _, c := range cands {
		if s.rep.relayout.jobs[c.key] != nil || s.rep.busy[c.key] > 0 || now.Before(s.rep.backoff[c.key]) {
			continue
		}
		if readable, _, _ := healthOf(s.classifyLocked(c.st, now), int(c.st.Layout.K)); readable < int(c.st.Layout.K) {
			continue // lost: nothing to convert from
		}
		ready = append(ready, c)
	}
	s.unlockRepair()
	if len(ready) == 0 {
		return nil
	}
	var jobs []*relayoutJob
	expires := now.Add(s.cfg.GrantTTL).UnixNano()
	if err := s.update(ctx, func(t kv.Txn) error {
		jobs = jobs[:0]
		for _, c := range ready {
			st := &metapb.StripeRecord{}
			if ok, err := getMsg(t, keys.Stripe(c.key.ino, c.key.stripe), st); err != nil {
				return err
			} else if !ok || st.Version != c.st.Version || len(st.Shards) == 0 || sameCoding(st.Layout, c.to) {
				continue
			}
			targets, err := s.placeStripe(t, c.to, nil)
			if err != nil {
				return err
			}
			whole := true
			for _, sh := range targets {
				whole = whole && sh.ServerId != ""
			}
			if !whole {
				continue // too few chunkservers for the new layout now
			}
			v := max(st.NextVersion, st.Version+1, 1)
			st.NextVersion = v + 1
			if err := putMsg(t, keys.Stripe(c.key.ino, c.key.stripe), st); err != nil {
				return err
			}
			if err := putMsg(t, keys.Grant(c.key.ino, c.key.stripe, v), &metapb.GrantRecord{Shards: targets, ExpiresNs: expires, Layout: c.to, Relayout: true}); err != nil {
				return err
			}
			jobs = append(jobs, &relayoutJob{key: c.key, version: st.Version, length: st.Length, from: st.Layout, shards: st.Shards,
				to: c.to, newVersion: v, targets: targets, assigned: make([]bool, len(targets))})
		}
		return nil
	}); err != nil {
		return err
	}
	s.repMu.Lock()
	for _, j := range jobs {
		s.rep.relayout.jobs[j.key] = j
	}
	s.repMu.Unlock()
	return nil
}

// sweepRelayouts, on the first plan after the service started, collects the
// grants of conversions an earlier run of the service left (their tasks
// went with it), and from then on abandons conversions placed on a
// chunkserver that is down (its tasks cannot finish).
func (s *Service) sweepRelayouts(ctx context.Context) error {
	s.lockRepair()
	first := !s.rep.relayout.swept
	var down []*relayoutJob
	for _, j := range s.rep.relayout.jobs {
		for _, sh := range j.targets {
			if mb, ok := s.members.byID[sh.ServerId]; !ok || !mb.up {
				down = append(down, j)
				break
			}
		}
	}
	for _, j := range down {
		s.log.Warn("relayout of a stripe abandoned: a chunkserver it was placed on is down", "ino", j.key.ino, "stripe", j.key.stripe)
		s.rep.relayout.failed++
		s.abortRelayoutLocked(j)
	}
	s.unlockRepair()
	if !first && len(down) == 0 {
		return nil
	}
	if err := s.update(ctx, func(t kv.Txn) error {
		for _, j := range down {
			if err := dropRelayoutGrant(t, j); err != nil {
				return err
			}
		}
		if !first {
			return nil
		}
		// Before any job of this run exists: every conversion grant is old.
		return collectGrants(t, []byte{keys.PrefixGrant}, []byte{keys.PrefixGrant + 1}, func(_, _ uint64, g *metapb.GrantRecord) bool {
			return g.Relayout
		})
	}); err != nil {
		return err
	}
	if first {
		s.repMu.Lock()
		s.rep.relayout.swept = true
		s.repMu.Unlock()
	}
	return nil
}

// relayoutLeft reports whether file ino has stripes, or grants, in a layout
// other than its own, and returns up to limit of those stripes that are not
// being converted. A removed file has none left.
func (s *Service) relayoutLeft(r kv.Reader, ino uint64, limit int, converting map[stripeKey]bool) (bool, []relayoutCandidate, error) {
	rec, err := getInode(r, ino)
	if metaerr.Errno(err) == syscall.ENOENT {
		return false, nil, nil
	}
	if err != nil {
		return false, nil, err
	}
	if !isReg(rec.Attr) || rec.Attr.Layout == nil {
		return false, nil, nil
	}
	to := rec.Attr.Layout
	left := false
	var out []relayoutCandidate
	stripes, _, err := fileStripes(r, ino, 0, ^uint64(0))
	if err != nil {
		return false, nil, err
	}
	for _, sc := range stripes {
		if len(sc.st.Shards) == 0 || sameCoding(sc.st.Layout, to) {
			continue
		}
		left = true
		if len(out) < limit && !converting[sc.key] {
			out = append(out, relayoutCandidate{sc.key, sc.st, to})
		}
	}
	if left {
		return true, out, nil
	}
	// A writer granted before the request may still commit in the old layout.
	gp := keys.GrantPrefix(ino)
	err = r.Scan(gp, kv.PrefixEnd(gp), 0, func(_, v []byte) error {
		g := &metapb.GrantRecord{}
		if err := proto.Unmarshal(v, g); err != nil {
			return fmt.Errorf("a grant of inode %d: %w", ino, err)
		}
		if !sameCoding(g.Layout, to) {
			left = true
			return kv.ErrStop
		}
		return nil
	})
	return left, nil, err
}

// finishRelayoutFiles removes the relayout keys of files found done, each
// checked again in the transaction that removes it.
func (s *Service) finishRelayoutFiles(ctx context.Context, inos []uint64) error {
	return s.update(ctx, func(t kv.Txn) error {
		for _, ino := range inos {
			left, _, err := s.relayoutLeft(t, ino, 0, nil)
			if err != nil {
				return err
			}
			if !left {
				if err := t.Delete(keys.Relayout(ino)); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// assignRelayouts hands target the shards of stripes being converted that
// are to be stored on it, up to want.
func (s *Service) assignRelayouts(target string, want int) []*metapb.RepairTask {
	now := s.now()
	s.lockRepair()
	defer s.unlockRepair()
	r := &s.rep
	var out []*metapb.RepairTask
	for _, j := range r.relayout.jobs {
		for i, sh := range j.targets {
			if len(out) >= want {
				return out
			}
			if sh.ServerId != target || j.assigned[i] {
				continue
			}
			j.assigned[i] = true
			r.nextTask++
			t := &repairTask{id: r.nextTask, key: j.key, version: j.newVersion, shard: i, target: target,
				newChunk: sh.ChunkId, deadline: now.Add(min(s.cfg.RepairTaskTimeout, relayoutTaskTimeout)), relayout: j}
			r.inflight[t.id] = t
			msg := &metapb.RepairTask{TaskId: t.id, Ino: j.key.ino, Stripe: j.key.stripe, Version: j.version, Layout: j.from,
				Shard: uint32(i), NewChunkId: sh.ChunkId, StripeLength: j.length, RelayoutTo: j.to, NewVersion: j.newVersion}
			st := &metapb.StripeRecord{Version: j.version, Shards: j.shards}
			for x, ss := range s.classifyLocked(st, now) {
				if ss == shardLost || ss == shardDown {
					msg.Unavailable = append(msg.Unavailable, uint32(x))
				}
			}
			for _, src := range j.shards {
				msg.Sources = append(msg.Sources, &metapb.Shard{ChunkId: src.ChunkId, ServerId: src.ServerId})
			}
			out = append(out, msg)
		}
	}
	return out
}

// abortRelayoutLocked forgets job and its tasks in flight (their results
// are then unknown, and what they built is collected). The caller holds
// repMu and then drops the job's grant.
func (s *Service) abortRelayoutLocked(j *relayoutJob) {
	if s.rep.relayout.jobs[j.key] == j {
		delete(s.rep.relayout.jobs, j.key)
	}
	for id, t := range s.rep.inflight {
		if t.relayout == j {
			delete(s.rep.inflight, id)
		}
	}
}

// dropRelayoutGrant deletes a conversion's grant and queues what it placed
// for collection.
func dropRelayoutGrant(t kv.Txn, j *relayoutJob) error {
	return dropGrants(t, j.key.ino, func(stripe, version uint64) bool {
		return stripe == j.key.stripe && version == j.newVersion
	})
}

// finishRelayoutTask applies the result of one shard of a conversion: a
// failure abandons the stripe's conversion (tried again after a backoff);
// the last shard built commits it.
func (s *Service) finishRelayoutTask(ctx context.Context, t *repairTask, res *metapb.RepairResult) error {
	j := t.relayout
	log := s.log.With("ino", j.key.ino, "stripe", j.key.stripe, "version", j.version, "new_version", j.newVersion)
	s.repMu.Lock()
	if s.rep.relayout.jobs[j.key] != j {
		s.repMu.Unlock()
		// Abandoned meanwhile: its grant is gone, and what this task built
		// after the grant's chunks were queued for collection is collected.
		if !res.Ok {
			return nil
		}
		return s.update(ctx, func(tx kv.Txn) error { return tx.Put(keys.GC(t.target, t.newChunk, t.version), nil) })
	}
	if !res.Ok {
		log.Warn("relayout of a stripe failed", "shard", t.shard, "server", t.target, "err", res.Error)
		s.abortRelayoutLocked(j)
		s.rep.relayout.failed++
		s.rep.backoff[j.key] = s.now().Add(s.cfg.RepairBackoff)
		s.repMu.Unlock()
		return s.update(ctx, func(tx kv.Txn) error { return dropRelayoutGrant(tx, j) })
	}
	j.built++
	if j.built < len(j.targets) {
		s.repMu.Unlock()
		return nil
	}
	delete(s.rep.relayout.jobs, j.key)
	s.repMu.Unlock()
	stale := false
	if err := s.update(ctx, func(tx kv.Txn) error {
		var err error
		stale, err = commitRelayout(tx, j)
		return err
	}); err != nil {
		return err
	}
	s.repMu.Lock()
	if stale {
		s.rep.relayout.stale++
	} else {
		s.rep.relayout.done++
		s.rep.relayout.bytes += j.length
		s.rep.relayout.recent = append(s.rep.relayout.recent, rateSample{s.now(), j.length})
	}
	s.repMu.Unlock()
	if stale {
		log.Info("relayout of a stripe is stale: a writer changed it first; converted again")
	}
	s.kickRelayout() // the next stripes, now
	return nil
}

// commitRelayout swaps a stripe to its converted version if it still has
// the version that was converted and the grant is still there; otherwise
// (stale) the converted shards are collected.
func commitRelayout(tx kv.Txn, j *relayoutJob) (stale bool, err error) {
	st := &metapb.StripeRecord{}
	ok, err := getMsg(tx, keys.Stripe(j.key.ino, j.key.stripe), st)
	if err != nil {
		return false, err
	}
	g := &metapb.GrantRecord{}
	gok, err := getMsg(tx, keys.Grant(j.key.ino, j.key.stripe, j.newVersion), g)
	if err != nil {
		return false, err
	}
	if !ok || !gok || st.Version != j.version {
		return true, dropRelayoutGrant(tx, j)
	}
	if err := dropVersion(tx, st.Shards, st.Version, st.Shared); err != nil {
		return false, err
	}
	st.Version, st.Layout, st.Shards, st.InlineData, st.Shared = j.newVersion, g.Layout, g.Shards, nil, false
	st.NextVersion = max(st.NextVersion, j.newVersion+1)
	if err := putMsg(tx, keys.Stripe(j.key.ino, j.key.stripe), st); err != nil {
		return false, err
	}
	return false, tx.Delete(keys.Grant(j.key.ino, j.key.stripe, j.newVersion))
}

// kickRelayout asks the background loop to plan conversions soon.
func (s *Service) kickRelayout() {
	select {
	case s.relKick <- struct{}{}:
	default:
	}
}

// relayoutStatus is the state of conversions for Status.
func (s *Service) relayoutStatus() *metapb.RelayoutStatus {
	now := s.now()
	s.repMu.Lock()
	defer s.repMu.Unlock()
	r := &s.rep.relayout
	return &metapb.RelayoutStatus{FilesPending: r.pending, InFlight: uint64(len(r.jobs)), StripesDone: r.done,
		BytesDone: r.bytes, Failed: r.failed, Stale: r.stale, BytesPerSecond: ratePerSecond(&r.recent, now)}
}
