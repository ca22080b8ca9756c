package fileio

import (
	"time"

	"github.com/rdmafs/rdmafs/meta/metapb"
)

// A partial-stripe write needs a grant of the stripe's next version on its
// committed chunks, a call to meta before the shards are written. A stripe
// written in place is likely written in place again (a database rewrites
// its pages at every commit), so the commit of such a write asks meta for
// the stripe's next grant at once (CommitStripesRequest.grant_next), and
// the next delta of the stripe uses it instead of calling GrantWrite: an
// fsync after a small write is then the shard writes and one commit.

// nextGrant is an in-place grant of a stripe's next version made by the
// commit of its previous delta, usable until until.
type nextGrant struct {
	g     *metapb.StripeGrant
	until time.Time
}

// keepNextGrants records in the batch's delta stripes the next grants a
// commit reply r made, each usable while a write started now could still
// be committed before the grant expires at meta.
func (e *Engine) keepNextGrants(r *metapb.CommitStripesReply, stripes []uint64, batch []*dirtyStripe) {
	if len(r.GetNextGrants()) == 0 {
		return
	}
	until := e.cfg.Now().Add(time.Duration(r.NextGrantsTtlMs)*time.Millisecond - e.cfg.WriteTimeout - flushTimeout)
	if !e.cfg.Now().Before(until) {
		return
	}
	for _, g := range r.NextGrants {
		for i, s := range stripes {
			if s == g.Stripe && batch[i].delta != nil && g.InPlace {
				batch[i].delta.next = &nextGrant{g: g, until: until}
			}
		}
	}
}

// takeNextGrant removes the next grant f holds for stripe s and returns it if
// the delta p of d may use it: unexpired, and on the committed version and
// chunks the delta builds on. The caller holds f.mu.
func (e *Engine) takeNextGrant(f *file, s uint64, d *dirtyStripe, si *metapb.StripeInfo) *metapb.StripeGrant {
	ng := f.next[s]
	if ng == nil {
		return nil
	}
	delete(f.next, s)
	if !e.cfg.Now().Before(ng.until) || ng.g.CommittedVersion != d.base || !metapb.SameShards(ng.g.Shards, si.Shards) {
		return nil
	}
	return ng.g
}

// grantsHeld returns the next grants of every stripe of the batch if all are
// deltas holding one, in the form GrantWrite answers; nil otherwise.
func grantsHeld(batch []*dirtyStripe) *metapb.GrantWriteReply {
	out := &metapb.GrantWriteReply{Grants: make([]*metapb.StripeGrant, len(batch))}
	for i, d := range batch {
		if d.delta == nil || d.delta.grant == nil {
			return nil
		}
		out.Grants[i] = d.delta.grant
	}
	return out
}
