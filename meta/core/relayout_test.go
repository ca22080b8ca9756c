package core

import (
	"syscall"
	"testing"

	"github.com/rdmafs/rdmafs/internal/stripe"
	"github.com/rdmafs/rdmafs/meta/keys"
	"github.com/rdmafs/rdmafs/meta/kv"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// relayoutFile makes /d with layout 1+2 and 64 KiB units and a file in it
// with stripes committed on cs0..cs2, chunk ids 1000*ino+10*stripe+i.
func (e *env) relayoutFile(stripes int) (dir, ino uint64) {
	e.t.Helper()
	from := stripe.Layout{K: 1, M: 2, Unit: 64 << 10}
	dir = e.mkdir(root, 1, "d", 0o755)
	if _, err := e.s.SetLayout(e.ctx, &metapb.SetLayoutRequest{Ino: dir, Layout: metapb.LayoutOf(from)}); err != nil {
		e.t.Fatal(err)
	}
	ino = e.create(root, dir, "f", 0o644)
	if err := e.store.Update(e.ctx, func(t kv.Txn) error {
		for s := range uint64(stripes) {
			st := &metapb.StripeRecord{Version: 1, NextVersion: 2, Length: uint64(from.StripeSize()), Layout: metapb.LayoutOf(from)}
			for i := range 3 {
				st.Shards = append(st.Shards, &metapb.Shard{ChunkId: 1000*ino + 10*s + uint64(i), ServerId: csID(i)})
			}
			if err := putMsg(t, keys.Stripe(ino, s), st); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		e.t.Fatal(err)
	}
	return dir, ino
}

// relayoutTasks plans conversions and collects every chunkserver's tasks.
func (e *env) relayoutTasks(n int) map[int][]*metapb.RepairTask {
	e.t.Helper()
	if err := e.s.planRelayouts(e.ctx); err != nil {
		e.t.Fatal(err)
	}
	out := map[int][]*metapb.RepairTask{}
	for cs := range n {
		out[cs] = e.poll(cs, nil, nil, 16)
	}
	return out
}

func okResult(tk *metapb.RepairTask) *metapb.RepairResult {
	return &metapb.RepairResult{TaskId: tk.TaskId, Ok: true, Bytes: 4096, NewChunkId: tk.NewChunkId, Version: tk.NewVersion}
}

func (e *env) progress(ino uint64) *metapb.RelayoutReply {
	e.t.Helper()
	r, err := e.s.Relayout(e.ctx, &metapb.RelayoutRequest{Ino: ino, Progress: true})
	if err != nil {
		e.t.Fatal(err)
	}
	return r
}

// TestRelayout: a request changes the layouts of a directory and its file
// at once, keeping the stripe size; every shard of the new layout is a task
// for the chunkserver that is to hold it; the stripe switches to the new
// version when all are built, and its old shards are collected; a stripe a
// writer commits first is converted again; a failed shard abandons the
// stripe's conversion and collects what it placed; a restart collects the
// conversions it interrupted and the work resumes; the relayout key goes
// once every stripe is converted.
func TestRelayout(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		e.chunkservers(6)
		dir, ino := e.relayoutFile(3)
		bad := metapb.LayoutOf(stripe.Layout{K: 3, M: 2, Unit: 4096})
		_, err := e.s.Relayout(e.ctx, &metapb.RelayoutRequest{Ino: dir, Layout: bad})
		wantErrno(t, err, syscall.EINVAL) // 64 KiB stripes do not split in three
		_, err = e.s.Relayout(e.ctx, &metapb.RelayoutRequest{Caller: alice, Ino: dir, Layout: metapb.LayoutOf(stripe.Layout{K: 4, M: 2, Unit: 4096})})
		wantErrno(t, err, syscall.EPERM)
		r, err := e.s.Relayout(e.ctx, &metapb.RelayoutRequest{Ino: dir, Layout: &metapb.Layout{K: 4, M: 2}})
		if err != nil || r.FilesQueued != 1 {
			t.Fatalf("relayout: %v, %v", r, err)
		}
		want := stripe.Layout{K: 4, M: 2, Unit: 16 << 10}
		if got := e.attr(ino).Layout.Stripe(); got != want {
			t.Fatalf("file layout %v, want %v", got, want)
		}
		if l, err := e.s.GetLayout(e.ctx, &metapb.GetLayoutRequest{Ino: dir}); err != nil || l.Layout.Stripe().StripeSize() != 64<<10 || l.Layout.K != 4 {
			t.Fatalf("directory layout %v, %v", l, err)
		}
		if p := e.progress(dir); p.StripesLeft != 3 || p.FilesLeft != 1 || p.StripesTotal != 3 {
			t.Fatalf("progress %v", p)
		}

		// Stripe 0 converts; stripe 1 is rewritten by a writer meanwhile;
		// a shard of stripe 2 fails.
		tasks := e.relayoutTasks(6)
		byStripe := map[uint64][]*metapb.RepairTask{}
		for cs, ts := range tasks {
			for _, tk := range ts {
				if tk.RelayoutTo == nil || tk.RelayoutTo.K != 4 || tk.NewVersion <= tk.Version || tk.Layout.K != 1 || len(tk.Sources) != 3 {
					t.Fatalf("task %v", tk)
				}
				tk.TaskId |= uint64(cs) << 48 // remember who got it
				byStripe[tk.Stripe] = append(byStripe[tk.Stripe], tk)
			}
		}
		for s := range uint64(3) {
			if len(byStripe[s]) != 6 {
				t.Fatalf("stripe %d: %d tasks, want one per shard of 4+2", s, len(byStripe[s]))
			}
		}
		report := func(tk *metapb.RepairTask, ok bool) {
			t.Helper()
			res := okResult(tk)
			res.TaskId &= 1<<48 - 1
			if !ok {
				res.Ok, res.Error = false, "injected"
			}
			e.poll(int(tk.TaskId>>48), []*metapb.RepairResult{res}, nil, 0)
		}
		if err := e.store.Update(e.ctx, func(t kv.Txn) error {
			st := &metapb.StripeRecord{}
			if _, err := getMsg(t, keys.Stripe(ino, 1), st); err != nil {
				return err
			}
			st.Version, st.NextVersion = st.NextVersion+1, st.NextVersion+2 // a writer's commit, in the new layout
			st.Layout = metapb.LayoutOf(want)
			return putMsg(t, keys.Stripe(ino, 1), st)
		}); err != nil {
			t.Fatal(err)
		}
		for _, tk := range byStripe[0] {
			report(tk, true)
		}
		for _, tk := range byStripe[1] {
			report(tk, true)
		}
		report(byStripe[2][0], false)
		st0 := e.stripe(ino, 0)
		if st0.Version != byStripe[0][0].NewVersion || st0.Layout.Stripe() != want || len(st0.Shards) != 6 {
			t.Fatalf("stripe 0 after its conversion: %v", st0)
		}
		for i := range 3 {
			if !e.hasGC(csID(i), 1000*ino+uint64(i), 1) {
				t.Fatalf("old shard %d of stripe 0 not collected", i)
			}
		}
		tk1 := byStripe[1][0]
		if st1 := e.stripe(ino, 1); st1.Version == tk1.NewVersion || !e.hasGC(csID(int(tk1.TaskId>>48)), tk1.NewChunkId, tk1.NewVersion) {
			t.Fatalf("stripe 1, rewritten meanwhile: %v; converted chunk collected %v", st1, e.hasGC(csID(int(tk1.TaskId>>48)), tk1.NewChunkId, tk1.NewVersion))
		}
		for _, tk := range byStripe[2] {
			if !e.hasGC(csID(int(tk.TaskId>>48)), tk.NewChunkId, tk.NewVersion) {
				t.Fatalf("a shard placed for the failed conversion of stripe 2 is not collected: %v", tk)
			}
		}
		rs := e.s.relayoutStatus()
		if rs.StripesDone != 1 || rs.Stale != 1 || rs.Failed != 1 || rs.InFlight != 0 {
			t.Fatalf("status %v", rs)
		}
		if p := e.progress(ino); p.StripesLeft != 1 {
			t.Fatalf("progress %v, want stripe 2 left", p)
		}

		// Planned again after the backoff, then interrupted by a restart:
		// the restart collects the conversion's placement, and it is
		// planned anew.
		e.clock.Advance(e.s.cfg.RepairBackoff + 1)
		tasks = e.relayoutTasks(6)
		var again []*metapb.RepairTask
		for _, ts := range tasks {
			again = append(again, ts...)
		}
		if len(again) != 6 || again[0].Stripe != 2 {
			t.Fatalf("stripe 2 planned again: %v", again)
		}
		e.restart()
		e.chunkservers(6)
		tasks = e.relayoutTasks(6)
		for _, tk := range again {
			var holder string
			for _, sh := range e.grantedShards(ino, 2, tk.NewVersion) {
				holder = sh.ServerId
			}
			if holder != "" {
				t.Fatalf("the grant of the interrupted conversion survived the restart")
			}
		}
		n := 0
		for cs, ts := range tasks {
			for _, tk := range ts {
				n++
				e.poll(cs, []*metapb.RepairResult{okResult(tk)}, nil, 0)
			}
		}
		if n != 6 {
			t.Fatalf("%d tasks after the restart, want 6", n)
		}
		if p := e.progress(dir); p.StripesLeft != 0 || p.StripesTotal != 3 {
			t.Fatalf("progress at the end: %v", p)
		}
		if err := e.s.planRelayouts(e.ctx); err != nil {
			t.Fatal(err)
		}
		var left bool
		if err := e.store.View(e.ctx, func(r kv.Reader) error {
			_, ok, err := r.Get(keys.Relayout(ino))
			left = ok
			return err
		}); err != nil || left {
			t.Fatalf("relayout key left after the file converted (%v)", err)
		}
		if rs := e.s.relayoutStatus(); rs.FilesPending != 0 {
			t.Fatalf("status %v", rs)
		}
	})
}

// grantedShards returns the placement of the grant of ino's stripe at
// version, or nil when there is no such grant.
func (e *env) grantedShards(ino, stripe, version uint64) []*metapb.Shard {
	e.t.Helper()
	g := &metapb.GrantRecord{}
	var ok bool
	if err := e.store.View(e.ctx, func(r kv.Reader) error {
		var err error
		ok, err = getMsg(r, keys.Grant(ino, stripe, version), g)
		return err
	}); err != nil {
		e.t.Fatal(err)
	}
	if !ok {
		return nil
	}
	return g.Shards
}
