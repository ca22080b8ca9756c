package core

import (
	"context"
	"fmt"
	"syscall"

	"google.golang.org/protobuf/proto"

	"github.com/rdmafs/rdmafs/meta/keys"
	"github.com/rdmafs/rdmafs/meta/kv"
	"github.com/rdmafs/rdmafs/meta/metaerr"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// MaxStripesPerCall bounds the stripes of one GrantWrite, CommitStripes or
// GetStripes call.
const MaxStripesPerCall = 1024

// SetLayout implements metapb.MetaServer: it sets the layout that new files
// created in a directory (and in directories created under it) receive.
func (s *Service) SetLayout(ctx context.Context, req *metapb.SetLayoutRequest) (*metapb.Empty, error) {
	l := req.Layout.Stripe()
	if err := l.Validate(); err != nil {
		return nil, metaerr.New(syscall.EINVAL, "%v", err)
	}
	if err := s.checkLayoutFits(l); err != nil {
		return nil, err
	}
	c := caller(req.Caller)
	if err := s.awaitDir(ctx, c.Session, req.Ino); err != nil { // new files there take the old layout
		return nil, err
	}
	return &metapb.Empty{}, s.update(ctx, func(t kv.Txn) error {
		rec, err := getDir(t, req.Ino)
		if err != nil {
			return err
		}
		if !isOwner(c, rec.Attr) {
			return metaerr.New(syscall.EPERM, "setlayout: uid %d does not own directory %d", c.Uid, req.Ino)
		}
		rec.DirLayout = metapb.LayoutOf(l)
		rec.Attr.CtimeNs = s.now().UnixNano()
		return s.putInode(t, rec)
	})
}

// GetLayout implements metapb.MetaServer: a file's recorded layout, or the
// layout a directory gives new files.
func (s *Service) GetLayout(ctx context.Context, req *metapb.GetLayoutRequest) (*metapb.LayoutReply, error) {
	var out *metapb.LayoutReply
	err := s.view(ctx, func(r kv.Reader) error {
		rec, err := getInode(r, req.Ino)
		if err != nil {
			return err
		}
		switch {
		case isReg(rec.Attr):
			out = &metapb.LayoutReply{Layout: rec.Attr.Layout}
		case isDir(rec.Attr):
			l := rec.DirLayout
			if l == nil {
				l = metapb.LayoutOf(s.def)
			}
			out = &metapb.LayoutReply{Layout: l}
		default:
			return metaerr.New(syscall.EINVAL, "inode %d has no layout", req.Ino)
		}
		return nil
	})
	return out, err
}

// stripeBytes returns the bytes of file data a stripe of layout l holds (0
// for no layout).
func stripeBytes(l *metapb.Layout) uint64 { return uint64(l.Stripe().StripeSize()) }

// getFile loads an inode that must be a regular file.
func getFile(r kv.Reader, ino uint64) (*metapb.InodeRecord, error) {
	rec, err := getInode(r, ino)
	if err != nil {
		return nil, err
	}
	switch {
	case isDir(rec.Attr):
		return nil, metaerr.New(syscall.EISDIR, "inode %d is a directory", ino)
	case !isReg(rec.Attr) || rec.Attr.Layout == nil:
		return nil, metaerr.New(syscall.EINVAL, "inode %d is not a regular file", ino)
	}
	return rec, nil
}

func checkStripeList(n int) error {
	if n == 0 || n > MaxStripesPerCall {
		return metaerr.New(syscall.EINVAL, "%d stripes in one call (1..%d allowed)", n, MaxStripesPerCall)
	}
	return nil
}

// GrantWrite implements metapb.MetaServer: for each stripe it reserves the
// next version (a per-stripe counter, so concurrent grants never collide),
// allocates fresh chunk ids and places the k+m shards on live chunkservers
// not in req.Exclude. With fewer than k+m such chunkservers but at least the
// layout's min-write-shards, the grant is degraded: the shards left without
// a chunkserver are to be committed as missing.
func (s *Service) GrantWrite(ctx context.Context, req *metapb.GrantWriteRequest) (*metapb.GrantWriteReply, error) {
	if err := checkStripeList(len(req.Stripes)); err != nil {
		return nil, err
	}
	exclude := idSet(req.Exclude)
	inPlace := make(map[uint64]bool, len(req.InPlace))
	for _, idx := range req.InPlace {
		inPlace[idx] = true
	}
	out := &metapb.GrantWriteReply{}
	err := s.update(ctx, func(t kv.Txn) error {
		out.Grants = out.Grants[:0]
		rec, err := getFile(t, req.Ino)
		if err != nil {
			return err
		}
		if err := s.checkSpaceQuota(t, rec, uint64(len(req.Stripes))*stripeBytes(rec.Attr.Layout)); err != nil {
			return err
		}
		l := rec.Attr.Layout
		expires := s.now().Add(s.cfg.GrantTTL).UnixNano()
		for _, idx := range req.Stripes {
			st := &metapb.StripeRecord{}
			if _, err := getMsg(t, keys.Stripe(req.Ino, idx), st); err != nil {
				return err
			}
			if st.Shared {
				// Unshared since (the other side rewrote or dropped its
				// copy): in place is possible again.
				if st.Shared, err = stillShared(t, st); err != nil {
					return err
				}
			}
			var shards []*metapb.Shard
			keep := inPlace[idx] && s.canGrantInPlace(st, l, exclude)
			if keep {
				shards = st.Shards
			} else if shards, err = s.placeStripe(t, l, exclude); err != nil {
				return err
			}
			g, err := s.putGrant(t, req.Ino, idx, st, l, shards, expires)
			if err != nil {
				return err
			}
			g.InPlace = keep
			out.Grants = append(out.Grants, g)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// canGrantInPlace reports whether the next version of stripe st of a file of
// layout l may be written on its committed chunks (see
// GrantWriteRequest.in_place): it has shards, all of them on live
// chunkservers not in exclude, in l, shared with no snapshot.
func (s *Service) canGrantInPlace(st *metapb.StripeRecord, l *metapb.Layout, exclude map[string]bool) bool {
	return st.Version > 0 && !st.Shared && len(st.Shards) == int(l.K+l.M) && proto.Equal(st.Layout, l) &&
		s.members.canKeep(st.Shards, l.Unit, exclude)
}

// putGrant grants the next version of stripe idx of inode ino (record st,
// stored again with its version counter moved on) on shards, until expires,
// and returns the grant for the writer.
func (s *Service) putGrant(t kv.Txn, ino, idx uint64, st *metapb.StripeRecord, l *metapb.Layout, shards []*metapb.Shard, expires int64) (*metapb.StripeGrant, error) {
	v := max(st.NextVersion, st.Version+1, 1)
	st.NextVersion = v + 1
	if err := putMsg(t, keys.Stripe(ino, idx), st); err != nil {
		return nil, err
	}
	if err := putMsg(t, keys.Grant(ino, idx, v), &metapb.GrantRecord{Shards: shards, ExpiresNs: expires, Layout: l}); err != nil {
		return nil, err
	}
	return &metapb.StripeGrant{Stripe: idx, Version: v, CommittedVersion: st.Version, Layout: l, Shards: s.members.withAddresses(shards)}, nil
}

// placeStripe chooses chunkservers and fresh chunk ids for the k+m shards
// of a new stripe version of layout l (shards with no chunkserver when too
// few are live, at least min-write-shards placed).
func (s *Service) placeStripe(t kv.Txn, l *metapb.Layout, exclude map[string]bool) ([]*metapb.Shard, error) {
	n := int(l.K + l.M)
	chosen, err := s.members.place(n, l.Stripe().MinWriteShards(), l.Unit, exclude, nil)
	if err != nil {
		return nil, err
	}
	first, err := nextID(t, counterChunk, uint64(n))
	if err != nil {
		return nil, err
	}
	shards := make([]*metapb.Shard, n)
	for i, c := range chosen {
		shards[i] = &metapb.Shard{ChunkId: first + uint64(i), ServerId: c.ID}
	}
	return shards, nil
}

// idSet returns ids as a set.
func idSet(ids []string) map[string]bool {
	out := make(map[string]bool, len(ids))
	for _, id := range ids {
		out[id] = true
	}
	return out
}

// ReplaceShards implements metapb.MetaServer: the listed shards of an
// outstanding grant move to fresh chunks on live chunkservers that hold no
// other shard of the grant and are not excluded, or to no chunkserver when
// none is left. The chunks they leave are collected (a failed write may
// have left data behind). It returns the grant's whole new placement.
func (s *Service) ReplaceShards(ctx context.Context, req *metapb.ReplaceShardsRequest) (*metapb.ReplaceShardsReply, error) {
	var shards []*metapb.Shard
	err := s.update(ctx, func(t kv.Txn) error {
		exclude := idSet(req.Exclude) // per attempt: the chunkservers left are added below
		g := &metapb.GrantRecord{}
		ok, err := getMsg(t, keys.Grant(req.Ino, req.Stripe, req.Version), g)
		if err != nil {
			return err
		}
		if !ok {
			return metaerr.New(syscall.EINVAL, "no outstanding grant for inode %d stripe %d version %d (expired or committed)", req.Ino, req.Stripe, req.Version)
		}
		n := len(g.Shards)
		move := map[int]bool{}
		for _, i := range req.Shards {
			if int(i) >= n {
				return metaerr.New(syscall.EINVAL, "stripe %d has %d shards, not %d", req.Stripe, n, i+1)
			}
			move[int(i)] = true
		}
		taken := map[string]bool{}
		for i, sh := range g.Shards {
			if !move[i] && sh.ServerId != "" {
				taken[sh.ServerId] = true
			}
		}
		// Chunkservers the moving shards leave are not candidates either:
		// their writes just failed.
		for i := range move {
			if id := g.Shards[i].ServerId; id != "" {
				exclude[id] = true
			}
		}
		chosen, err := s.members.place(len(move), 0, g.Layout.Unit, exclude, taken)
		if err != nil {
			return err
		}
		first, err := nextID(t, counterChunk, uint64(len(move)))
		if err != nil {
			return err
		}
		var left []*metapb.Shard
		j := 0
		for i := range n {
			if !move[i] {
				continue
			}
			if old := g.Shards[i]; old.ServerId != "" {
				left = append(left, old)
			}
			g.Shards[i] = &metapb.Shard{ChunkId: first + uint64(j), ServerId: chosen[j].ID}
			j++
		}
		if err := queueGC(t, left, req.Version); err != nil {
			return err
		}
		shards = g.Shards
		return putMsg(t, keys.Grant(req.Ino, req.Stripe, req.Version), g)
	})
	if err != nil {
		return nil, err
	}
	return &metapb.ReplaceShardsReply{Shards: s.members.withAddresses(shards)}, nil
}

// CommitStripes implements metapb.MetaServer: in one transaction it checks
// every stripe's committed version against the writer's expectation and, if
// all match, makes the granted versions committed, grows the file to size
// and sets mtime. Superseded chunks are queued for garbage collection.
func (s *Service) CommitStripes(ctx context.Context, req *metapb.CommitStripesRequest) (*metapb.CommitStripesReply, error) {
	if err := checkStripeList(len(req.Stripes)); err != nil {
		return nil, err
	}
	var out *metapb.CommitStripesReply
	var conflicts []uint64
	degraded := 0
	// Exactly once: a retry of a commit whose reply was lost gets its
	// outcome, not a compare-and-set failure against its own commit (an
	// inline commit has no granted version to recognise itself by).
	replayed, err := updateOnce(s, ctx, &out, func(t kv.Txn) error {
		conflicts = conflicts[:0]
		degraded = 0
		now := s.now().UnixNano()
		rec, err := getFile(t, req.Ino)
		if err != nil {
			return err
		}
		type pending struct {
			i     int // index in req.Stripes
			sc    *metapb.StripeCommit
			st    *metapb.StripeRecord
			grant *metapb.GrantRecord // nil: inline
			data  []byte              // an inline commit's new bytes
		}
		var todo []pending
		versions := make([]uint64, len(req.Stripes))
		seen := map[uint64]bool{}
		for i, sc := range req.Stripes {
			versions[i] = sc.Version
			if seen[sc.Stripe] {
				return metaerr.New(syscall.EINVAL, "stripe %d committed twice in one call", sc.Stripe)
			}
			seen[sc.Stripe] = true
			st := &metapb.StripeRecord{}
			if _, err := getMsg(t, keys.Stripe(req.Ino, sc.Stripe), st); err != nil {
				return err
			}
			if sc.Inline {
				if err := checkInline(rec.Attr.Layout, sc); err != nil {
					return err
				}
				if st.Version != sc.ExpectedVersion || sc.Patch && len(st.Shards) > 0 {
					// A patch needs the expected version's bytes here: one
					// on shards means the writer's view is stale.
					conflicts = append(conflicts, sc.Stripe)
					continue
				}
				data := sc.Data
				if sc.Patch {
					data = patchInline(st.InlineData, sc)
				}
				todo = append(todo, pending{i, sc, st, nil, data})
				continue
			}
			if st.Version == sc.Version && sc.Version != 0 {
				continue // a retried commit that already succeeded
			}
			g := &metapb.GrantRecord{}
			ok, err := getMsg(t, keys.Grant(req.Ino, sc.Stripe, sc.Version), g)
			if err != nil {
				return err
			}
			if !ok {
				return metaerr.New(syscall.EINVAL, "no outstanding grant for inode %d stripe %d version %d (expired or never granted)", req.Ino, sc.Stripe, sc.Version)
			}
			if len(sc.Shards) > 0 && !metapb.SameShards(sc.Shards, g.Shards) {
				return metaerr.New(syscall.EINVAL, "stripe %d: committed placement differs from the grant", sc.Stripe)
			}
			if sc.Length > stripeBytes(g.Layout) {
				return metaerr.New(syscall.EINVAL, "stripe %d: length %d exceeds the stripe size %d", sc.Stripe, sc.Length, stripeBytes(g.Layout))
			}
			if st.Version != sc.ExpectedVersion || sc.Version <= st.Version {
				conflicts = append(conflicts, sc.Stripe)
				continue
			}
			missing, err := markMissing(t, g, sc)
			if err != nil {
				return err
			}
			if missing > 0 {
				degraded++
			}
			todo = append(todo, pending{i, sc, st, g, nil})
		}
		if len(conflicts) > 0 {
			// The losing grants are dead: their chunks become garbage and
			// the writer must ask for new grants. Nothing else changes.
			for _, sc := range req.Stripes {
				if sc.Inline || !containsU64(conflicts, sc.Stripe) {
					continue
				}
				if err := dropGrants(t, req.Ino, func(stripe, version uint64) bool {
					return stripe == sc.Stripe && version == sc.Version
				}); err != nil {
					return err
				}
			}
			out = &metapb.CommitStripesReply{ConflictStripes: conflicts}
			return nil
		}
		for _, p := range todo {
			if p.st.Version > 0 {
				if err := dropVersion(t, p.st.Shards, p.st.Version, p.st.Shared); err != nil {
					return err
				}
			}
			p.st.Shared = false // the new version's chunks are this stripe's alone
			if p.st.Version > 0 {
				rec.Attr.Stored -= min(rec.Attr.Stored, p.st.Length)
			}
			rec.Attr.Stored += p.sc.Length
			p.st.Length = p.sc.Length
			if p.grant == nil {
				// Inline: the next version of the stripe's counter, so that
				// no grant in flight ever commits the same version.
				p.st.Version = max(p.st.NextVersion, p.st.Version+1, 1)
				p.st.NextVersion = p.st.Version + 1
				p.st.Layout = rec.Attr.Layout
				p.st.Shards = nil
				p.st.InlineData = p.data
			} else {
				p.st.Version = p.sc.Version
				p.st.Layout = p.grant.Layout
				p.st.Shards = p.grant.Shards
				p.st.InlineData = nil
				if err := t.Delete(keys.Grant(req.Ino, p.sc.Stripe, p.sc.Version)); err != nil {
					return err
				}
			}
			if err := putMsg(t, keys.Stripe(req.Ino, p.sc.Stripe), p.st); err != nil {
				return err
			}
			versions[p.i] = p.st.Version
		}
		a := rec.Attr
		prevCtime := a.CtimeNs
		a.Size = max(a.Size, req.Size)
		a.MtimeNs = req.MtimeNs
		if a.MtimeNs == 0 {
			a.MtimeNs = now
		}
		// Each commit moves ctime on, even when the clock did not: a mount
		// tells by it whether the file is as its caches show it.
		a.CtimeNs = max(now, prevCtime+1)
		// Set-user-ID and set-group-ID stay: the mount clears them when
		// the writer lacks CAP_FSETID, as the kernel asks (fs/killpriv.go).
		if err := s.putInode(t, rec); err != nil {
			return err
		}
		out = &metapb.CommitStripesReply{Attr: a, Versions: versions, PrevCtimeNs: prevCtime}
		if len(req.GrantNext) == 0 {
			return nil
		}
		committed := make(map[uint64]*metapb.StripeRecord, len(todo))
		for _, p := range todo {
			if p.grant != nil {
				committed[p.sc.Stripe] = p.st
			}
		}
		return s.grantNext(t, req, rec, committed, out)
	})
	if err != nil {
		return nil, err
	}
	if req.Sync {
		if err := s.sync(ctx); err != nil {
			return nil, err
		}
	}
	if replayed {
		conflicts, degraded = out.ConflictStripes, 0
	}
	if degraded > 0 && len(conflicts) == 0 {
		s.log.Warn("stripes committed degraded, queued for repair", "ino", req.Ino, "stripes", degraded)
		s.kickRepair()
	}
	if len(conflicts) > 0 {
		return nil, metaerr.Conflict(append([]uint64(nil), conflicts...),
			"commit of inode %d lost the version compare-and-set on stripes %v: get a new grant and retry", req.Ino, conflicts)
	}
	return out, nil
}

// grantNext grants in place the next version of each stripe of
// req.GrantNext that this commit committed (committed holds their records),
// where GrantWrite with in_place would, into out.NextGrants. A stripe that
// cannot be granted so, or over the file's quota, is left out: the writer
// asks GrantWrite for it.
func (s *Service) grantNext(t kv.Txn, req *metapb.CommitStripesRequest, rec *metapb.InodeRecord, committed map[uint64]*metapb.StripeRecord, out *metapb.CommitStripesReply) error {
	l := rec.Attr.Layout
	expires := s.now().Add(s.cfg.GrantTTL).UnixNano()
	for _, idx := range req.GrantNext {
		st := committed[idx]
		delete(committed, idx) // granted once, however often listed
		if st == nil || !s.canGrantInPlace(st, l, nil) {
			continue
		}
		if err := s.checkSpaceQuota(t, rec, stripeBytes(l)); err != nil {
			if metaerr.Errno(err) == syscall.EDQUOT {
				break
			}
			return err
		}
		g, err := s.putGrant(t, req.Ino, idx, st, l, st.Shards, expires)
		if err != nil {
			return err
		}
		g.InPlace = true
		out.NextGrants = append(out.NextGrants, g)
	}
	if len(out.NextGrants) > 0 {
		out.NextGrantsTtlMs = uint32(s.cfg.GrantTTL.Milliseconds())
	}
	return nil
}

// checkInline validates an inline commit against the file's layout.
func checkInline(l *metapb.Layout, sc *metapb.StripeCommit) error {
	switch {
	case sc.Stripe != 0:
		return metaerr.New(syscall.EINVAL, "inline commit of stripe %d: only stripe 0 can be inline", sc.Stripe)
	case sc.Version != 0 || len(sc.Shards) > 0 || len(sc.Missing) > 0:
		return metaerr.New(syscall.EINVAL, "inline commit of stripe 0 with a version or shards")
	case sc.Length > l.GetInlineMax():
		return metaerr.New(syscall.EINVAL, "inline commit of %d bytes: the layout keeps at most %d inline", sc.Length, l.GetInlineMax())
	case !sc.Patch && uint64(len(sc.Data)) != sc.Length:
		return metaerr.New(syscall.EINVAL, "inline commit of %d bytes with length %d", len(sc.Data), sc.Length)
	case !sc.Patch && len(sc.Patches) > 0:
		return metaerr.New(syscall.EINVAL, "inline commit with patches but not marked as a patch")
	case sc.Patch && len(sc.Data) > 0:
		return metaerr.New(syscall.EINVAL, "patched inline commit with whole data too")
	case len(sc.Patches) > MaxInlinePatches:
		return metaerr.New(syscall.EINVAL, "inline commit of %d patches: at most %d", len(sc.Patches), MaxInlinePatches)
	}
	for _, p := range sc.Patches {
		if p.Offset > sc.Length || uint64(len(p.Data)) > sc.Length-p.Offset {
			return metaerr.New(syscall.EINVAL, "inline patch of %d bytes at %d past the length %d", len(p.Data), p.Offset, sc.Length)
		}
	}
	return nil
}

// MaxInlinePatches bounds the patches of one inline commit.
const MaxInlinePatches = 1024

// patchInline returns the new bytes of a patched inline commit sc (checked by
// checkInline) over old, the expected version's: old cut or zero-extended to
// sc.Length, with sc's patches written over it in order.
func patchInline(old []byte, sc *metapb.StripeCommit) []byte {
	data := make([]byte, sc.Length)
	copy(data, old)
	for _, p := range sc.Patches {
		copy(data[p.Offset:], p.Data)
	}
	return data
}

// putInlineStripe commits data as the first version of stripe 0 of rec, a
// regular file just made in this transaction (stored by the caller), kept
// inline; the file's size, stored bytes, mtime and ctime follow (timeNs).
func putInlineStripe(t kv.Txn, rec *metapb.InodeRecord, data []byte, timeNs int64) error {
	l := rec.Attr.Layout
	if uint64(len(data)) > l.GetInlineMax() {
		return metaerr.New(syscall.EINVAL, "create with %d bytes of inline data: the layout keeps at most %d inline", len(data), l.GetInlineMax())
	}
	st := &metapb.StripeRecord{Version: 1, NextVersion: 2, Length: uint64(len(data)), Layout: l, InlineData: data}
	if err := putMsg(t, keys.Stripe(rec.Attr.Ino, 0), st); err != nil {
		return err
	}
	a := rec.Attr
	a.Size, a.Stored = st.Length, st.Length
	if timeNs != 0 {
		a.MtimeNs, a.CtimeNs = timeNs, timeNs
	}
	return nil
}

// markMissing applies a commit's missing shards to its grant: they lose
// their chunkserver (repair rebuilds them) and whatever a failed write left
// of their chunks is collected. Shards the grant placed nowhere are missing
// whether listed or not. Fewer durable shards than the layout's
// min-write-shards is refused: such a stripe must not commit. It returns
// how many shards are missing.
func markMissing(t kv.Txn, g *metapb.GrantRecord, sc *metapb.StripeCommit) (int, error) {
	n := len(g.Shards)
	var left []*metapb.Shard
	for _, i := range sc.Missing {
		if int(i) >= n {
			return 0, metaerr.New(syscall.EINVAL, "stripe %d has %d shards, not %d", sc.Stripe, n, i+1)
		}
		if sh := g.Shards[i]; sh.ServerId != "" {
			left = append(left, sh)
			g.Shards[i] = &metapb.Shard{ChunkId: sh.ChunkId}
		}
	}
	durable := 0
	for _, sh := range g.Shards {
		if sh.ServerId != "" {
			durable++
		}
	}
	if need := g.Layout.Stripe().MinWriteShards(); durable < need {
		return 0, metaerr.New(syscall.EIO, "stripe %d: %d of %d shards durable, min-write-shards is %d", sc.Stripe, durable, n, need)
	}
	return n - durable, queueGC(t, left, sc.Version)
}

func containsU64(xs []uint64, x uint64) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

// GetStripes implements metapb.MetaServer: the committed stripes in
// [first, first+count) with their placement and chunkserver addresses.
func (s *Service) GetStripes(ctx context.Context, req *metapb.GetStripesRequest) (*metapb.GetStripesReply, error) {
	count := req.Count
	if count == 0 || count > MaxStripesPerCall {
		count = MaxStripesPerCall
	}
	out := &metapb.GetStripesReply{}
	err := s.view(ctx, func(r kv.Reader) error {
		out.Stripes = out.Stripes[:0]
		rec, err := getFile(r, req.Ino)
		if err != nil {
			return err
		}
		out.Size = rec.Attr.Size
		out.Layout = rec.Attr.Layout
		end := keys.Stripe(req.Ino, req.First+count)
		if req.First+count < req.First {
			end = kv.PrefixEnd(keys.StripePrefix(req.Ino))
		}
		return r.Scan(keys.Stripe(req.Ino, req.First), end, 0, func(k, v []byte) error {
			_, idx, err := keys.ParseStripe(k)
			if err != nil {
				return err
			}
			st := &metapb.StripeRecord{}
			if err := proto.Unmarshal(v, st); err != nil {
				return fmt.Errorf("stripe %d of inode %d: %w", idx, req.Ino, err)
			}
			if st.Version == 0 {
				return nil // granted but never committed
			}
			out.Stripes = append(out.Stripes, &metapb.StripeInfo{Stripe: idx, Version: st.Version, Length: st.Length,
				Layout: st.Layout, Shards: s.members.withAddresses(st.Shards), InlineData: st.InlineData})
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// truncateStripes drops the stripes wholly past size (queuing their chunks
// for collection) and shortens the stripe that size cuts, so that its bytes
// past size read as zeros even if the file grows again. Unless purge is set
// (the inode is being deleted) the version counters of dropped stripes are
// kept so that versions are never granted twice.
func truncateStripes(t kv.Txn, rec *metapb.InodeRecord, size uint64, purge bool) error {
	l := rec.Attr.Layout
	if l == nil || stripeBytes(l) == 0 {
		return nil
	}
	sb := stripeBytes(l)
	first := size / sb
	prefix := keys.StripePrefix(rec.Attr.Ino)
	type item struct {
		idx uint64
		st  *metapb.StripeRecord
	}
	var items []item
	if err := t.Scan(keys.Stripe(rec.Attr.Ino, first), kv.PrefixEnd(prefix), 0, func(k, v []byte) error {
		_, idx, err := keys.ParseStripe(k)
		if err != nil {
			return err
		}
		st := &metapb.StripeRecord{}
		if err := proto.Unmarshal(v, st); err != nil {
			return err
		}
		items = append(items, item{idx, st})
		return nil
	}); err != nil {
		return err
	}
	for _, it := range items {
		start := it.idx * sb
		if start < size {
			if keep := size - start; it.st.Length > keep {
				rec.Attr.Stored -= min(rec.Attr.Stored, it.st.Length-keep)
				it.st.Length = keep
				if uint64(len(it.st.InlineData)) > keep {
					it.st.InlineData = it.st.InlineData[:keep]
					// Other bytes, another version: a writer's patch built
					// on the uncut bytes conflicts instead of landing on
					// these (StripeCommit.patch).
					it.st.Version = max(it.st.NextVersion, it.st.Version+1)
					it.st.NextVersion = it.st.Version + 1
				}
				if err := putMsg(t, keys.Stripe(rec.Attr.Ino, it.idx), it.st); err != nil {
					return err
				}
			}
			continue
		}
		if it.st.Version > 0 {
			rec.Attr.Stored -= min(rec.Attr.Stored, it.st.Length)
			if err := dropVersion(t, it.st.Shards, it.st.Version, it.st.Shared); err != nil {
				return err
			}
		}
		if it.st.NextVersion > 1 && !purge {
			// Keep the version counter so that versions of this stripe are
			// never reused while the file lives (grants may be in flight).
			if err := putMsg(t, keys.Stripe(rec.Attr.Ino, it.idx), &metapb.StripeRecord{NextVersion: it.st.NextVersion}); err != nil {
				return err
			}
			continue
		}
		if err := t.Delete(keys.Stripe(rec.Attr.Ino, it.idx)); err != nil {
			return err
		}
	}
	return nil
}

// dropGrants deletes the outstanding grants of ino selected by match and
// queues their chunks for collection.
func dropGrants(t kv.Txn, ino uint64, match func(stripe, version uint64) bool) error {
	prefix := keys.GrantPrefix(ino)
	return collectGrants(t, prefix, kv.PrefixEnd(prefix), func(stripe, version uint64, _ *metapb.GrantRecord) bool {
		return match(stripe, version)
	})
}

// collectGrants deletes the grants in [start, end) that match selects and
// queues their chunks for collection.
func collectGrants(t kv.Txn, start, end []byte, match func(stripe, version uint64, g *metapb.GrantRecord) bool) error {
	type item struct {
		key []byte
		g   *metapb.GrantRecord
		ver uint64
	}
	var items []item
	if err := t.Scan(start, end, 0, func(k, v []byte) error {
		_, stripe, version, err := keys.ParseGrant(k)
		if err != nil {
			return err
		}
		g := &metapb.GrantRecord{}
		if err := proto.Unmarshal(v, g); err != nil {
			return err
		}
		if match(stripe, version, g) {
			items = append(items, item{append([]byte{}, k...), g, version})
		}
		return nil
	}); err != nil {
		return err
	}
	for _, it := range items {
		if err := queueGC(t, it.g.Shards, it.ver); err != nil {
			return err
		}
		if err := t.Delete(it.key); err != nil {
			return err
		}
	}
	return nil
}

// queueGC records that the chunkservers holding shards must delete version
// of their chunks; they learn it from their heartbeat replies. A shard with
// no chunkserver (missing: written degraded) has nothing to delete.
func queueGC(t kv.Txn, shards []*metapb.Shard, version uint64) error {
	for _, sh := range shards {
		if sh.ServerId == "" {
			continue
		}
		if err := t.Put(keys.GC(sh.ServerId, sh.ChunkId, version), nil); err != nil {
			return err
		}
	}
	return nil
}

// expireGrants collects the chunks of grants that were never committed.
func (s *Service) expireGrants(ctx context.Context) error {
	now := s.now().UnixNano()
	expired := false
	if err := s.view(ctx, func(r kv.Reader) error {
		expired = false
		return r.Scan([]byte{keys.PrefixGrant}, []byte{keys.PrefixGrant + 1}, 0, func(k, v []byte) error {
			g := &metapb.GrantRecord{}
			if err := proto.Unmarshal(v, g); err != nil {
				return fmt.Errorf("grant %x: %w", k, err)
			}
			if g.ExpiresNs < now {
				expired = true
				return kv.ErrStop
			}
			return nil
		})
	}); err != nil || !expired {
		return err
	}
	return s.update(ctx, func(t kv.Txn) error {
		return collectGrants(t, []byte{keys.PrefixGrant}, []byte{keys.PrefixGrant + 1}, func(_, _ uint64, g *metapb.GrantRecord) bool {
			return g.ExpiresNs < now
		})
	})
}
