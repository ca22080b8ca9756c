package core

import (
	"context"
	"fmt"
	"syscall"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/rdmafs/rdmafs/meta/keys"
	"github.com/rdmafs/rdmafs/meta/kv"
	"github.com/rdmafs/rdmafs/meta/metaerr"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// maxInfoTree and maxInfoStripes bound the inodes one Info call walks for a
// directory's totals and the stripes it classifies (under the membership's
// lock): past them the call fails with EFBIG rather than hold a snapshot,
// or the lock heartbeats need, for long.
const (
	maxInfoTree    = 1 << 20
	maxInfoStripes = 1 << 20
)

// shardStateNames are the states of ShardInfo.state, by shardState.
var shardStateNames = [...]string{shardOK: "ok", shardDown: "down", shardLost: "lost", shardRetiring: "retiring"}

// Info implements metapb.MetaServer: a file's stripes with the state and
// place of each shard, or a directory's layout and, with Totals, the sums
// of the tree below it, all from one snapshot.
func (s *Service) Info(ctx context.Context, req *metapb.InfoRequest) (*metapb.InfoReply, error) {
	count := req.Count
	if count == 0 || count > MaxStripesPerCall {
		count = MaxStripesPerCall
	}
	var out *metapb.InfoReply
	var stripes []scannedStripe
	var tree []scannedStripe
	err := s.view(ctx, func(r kv.Reader) error {
		out, stripes, tree = &metapb.InfoReply{}, nil, nil
		rec, err := getInode(r, req.Ino)
		if err != nil {
			return err
		}
		out.Attr = rec.Attr
		if isDir(rec.Attr) {
			out.Layout = metapb.LayoutOf(s.def)
			if rec.DirLayout != nil {
				out.Layout = rec.DirLayout
			}
			if req.Totals {
				out.Totals, tree, err = treeTotals(ctx, r, req.Ino)
			}
			if err == nil && s.quotas.hasDir(req.Ino) {
				q := &metapb.QuotaRecord{}
				if ok, qerr := getMsg(r, keys.DirQuota(req.Ino), q); qerr != nil {
					return qerr
				} else if ok {
					out.Quota = &metapb.QuotaInfo{Ino: req.Ino, SpaceLimit: q.SpaceLimit, InodeLimit: q.InodeLimit,
						SpaceUsed: q.SpaceUsed, InodesUsed: q.InodesUsed}
				}
			}
			return err
		}
		out.Layout = rec.Attr.Layout
		if !isReg(rec.Attr) {
			return nil
		}
		stripes, out.Next, err = fileStripes(r, req.Ino, req.First, count)
		for _, sc := range stripes {
			if err == nil && sc.st.Shared {
				sc.st.Shared, err = stillShared(r, sc.st)
			}
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	now := s.now()
	s.lockRepair()
	defer s.unlockRepair()
	for _, sc := range stripes {
		out.Stripes = append(out.Stripes, s.stripeDetailLocked(sc, now))
	}
	for _, sc := range tree {
		switch s.stripeDetailLocked(sc, now).Health {
		case "degraded":
			out.Totals.Degraded++
		case "lost":
			out.Totals.Lost++
		}
	}
	return out, nil
}

// fileStripes reads up to count committed stripes of ino from first on and
// returns them with the index to continue from (0 at the end).
func fileStripes(r kv.Reader, ino, first, count uint64) ([]scannedStripe, uint64, error) {
	var out []scannedStripe
	var next uint64
	err := r.Scan(keys.Stripe(ino, first), kv.PrefixEnd(keys.StripePrefix(ino)), 0, func(k, v []byte) error {
		_, idx, err := keys.ParseStripe(k)
		if err != nil {
			return err
		}
		st := &metapb.StripeRecord{}
		if err := proto.Unmarshal(v, st); err != nil {
			return fmt.Errorf("stripe %d of inode %d: %w", idx, ino, err)
		}
		if st.Version == 0 || st.Layout == nil {
			return nil // granted, never committed
		}
		if uint64(len(out)) == count {
			next = idx
			return kv.ErrStop
		}
		out = append(out, scannedStripe{stripeKey{ino, idx}, st})
		return nil
	})
	return out, next, err
}

// walkTree calls fn with each inode below dir, once each (hard links
// counted once), directories before what they hold; past maxInfoTree
// inodes it fails with EFBIG.
func walkTree(ctx context.Context, r kv.Reader, dir uint64, fn func(de *metapb.DentryRecord) error) error {
	queue := []uint64{dir}
	seen := map[uint64]bool{dir: true}
	for len(queue) > 0 {
		if err := ctx.Err(); err != nil {
			return err
		}
		d := queue[0]
		queue = queue[1:]
		var children []*metapb.DentryRecord
		prefix := keys.DentryPrefix(d)
		if err := r.Scan(prefix, kv.PrefixEnd(prefix), 0, func(_, v []byte) error {
			de := &metapb.DentryRecord{}
			if err := proto.Unmarshal(v, de); err != nil {
				return fmt.Errorf("an entry of directory %d: %w", d, err)
			}
			children = append(children, de)
			return nil
		}); err != nil {
			return err
		}
		for _, de := range children {
			if seen[de.Ino] {
				continue // a hard link seen already
			}
			seen[de.Ino] = true
			if len(seen) > maxInfoTree {
				return metaerr.New(syscall.EFBIG, "the tree below directory %d has more than %d inodes", dir, maxInfoTree)
			}
			if de.Type == syscall.S_IFDIR {
				queue = append(queue, de.Ino)
			}
			if err := fn(de); err != nil {
				return err
			}
		}
	}
	return nil
}

// treeTotals walks the tree below dir and sums it; it returns the committed
// stripes of its files, whose health the caller adds.
func treeTotals(ctx context.Context, r kv.Reader, dir uint64) (*metapb.TreeTotals, []scannedStripe, error) {
	t := &metapb.TreeTotals{Directories: 1}
	var stripes []scannedStripe
	err := walkTree(ctx, r, dir, func(de *metapb.DentryRecord) error {
		switch de.Type {
		case syscall.S_IFDIR:
			t.Directories++
		case syscall.S_IFREG:
			rec, err := getInode(r, de.Ino)
			if err != nil {
				return err
			}
			t.Files++
			t.Bytes += rec.Attr.Size
			st, _, err := fileStripes(r, de.Ino, 0, ^uint64(0))
			if err != nil {
				return err
			}
			t.Stripes += uint64(len(st))
			for _, sc := range st {
				shared, err := stillShared(r, sc.st)
				if err != nil {
					return err
				}
				if shared {
					t.SharedBytes += sc.st.Length
				}
				sc.st.Shared = shared // as the stripe details show it
			}
			stripes = append(stripes, st...)
			if len(stripes) > maxInfoStripes {
				return metaerr.New(syscall.EFBIG, "the tree below directory %d has more than %d stripes", dir, maxInfoStripes)
			}
		default:
			t.Others++
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	return t, stripes, nil
}

// stripeDetailLocked describes a stripe and its shards as the membership
// sees them now (the caller holds members.mu and repMu).
func (s *Service) stripeDetailLocked(sc scannedStripe, now time.Time) *metapb.StripeDetail {
	st := sc.st
	d := &metapb.StripeDetail{Stripe: sc.key.stripe, Version: st.Version, Length: st.Length, Layout: st.Layout,
		Inline: len(st.Shards) == 0, Health: "healthy", Shared: st.Shared}
	if d.Inline {
		return d
	}
	states := s.classifyLocked(st, now)
	for i, sh := range st.Shards {
		si := &metapb.ShardInfo{ChunkId: sh.ChunkId, ServerId: sh.ServerId, State: shardStateNames[states[i]]}
		if mb, ok := s.members.byID[sh.ServerId]; ok {
			si.Address, si.Zone = mb.rec.Address, mb.rec.Zone
		}
		d.Shards = append(d.Shards, si)
	}
	switch _, lost, degraded := healthOf(states, int(st.Layout.K)); {
	case lost:
		d.Health = "lost"
	case degraded:
		d.Health = "degraded"
	}
	return d
}
