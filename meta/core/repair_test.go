package core

import (
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/meta/keys"
	"github.com/rdmafs/rdmafs/meta/kv"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// putStripe stores a committed stripe placed on the given chunkservers,
// chunk ids 100*ino+10*stripe+i.
func (e *env) putStripe(ino, stripe, version uint64, servers ...int) {
	e.t.Helper()
	st := &metapb.StripeRecord{Version: version, NextVersion: version + 1, Length: uint64(testLayout.StripeSize()), Layout: metapb.LayoutOf(testLayout)}
	for i, cs := range servers {
		st.Shards = append(st.Shards, &metapb.Shard{ChunkId: 100*ino + 10*stripe + uint64(i), ServerId: csID(cs)})
	}
	if err := e.store.Update(e.ctx, func(t kv.Txn) error { return putMsg(t, keys.Stripe(ino, stripe), st) }); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) stripe(ino, stripe uint64) *metapb.StripeRecord {
	e.t.Helper()
	st := &metapb.StripeRecord{}
	if err := e.store.View(e.ctx, func(r kv.Reader) error {
		_, err := getMsg(r, keys.Stripe(ino, stripe), st)
		return err
	}); err != nil {
		e.t.Fatal(err)
	}
	return st
}

// down stops the heartbeats of the given chunkservers and lets the others
// heartbeat, then advances the clock by d and marks the silent ones down.
func (e *env) down(d time.Duration, ids ...int) {
	e.t.Helper()
	silent := map[string]bool{}
	for _, i := range ids {
		silent[csID(i)] = true
	}
	e.clock.Advance(6 * time.Second) // past the heartbeat timeout
	e.beatAll(silent)
	e.s.members.sweep(e.clock.Now(), e.s.cfg.HeartbeatTimeout, e.s.log)
	e.clock.Advance(d)
	e.beatAll(silent)
}

func (e *env) beatAll(silent map[string]bool) {
	e.t.Helper()
	e.s.members.mu.Lock()
	var ids []string
	for id := range e.s.members.byID {
		if !silent[id] {
			ids = append(ids, id)
		}
	}
	e.s.members.mu.Unlock()
	for _, id := range ids {
		if _, err := e.s.Heartbeat(e.ctx, &metapb.HeartbeatRequest{Id: id, Free: 99 << 30}); err != nil {
			e.t.Fatal(err)
		}
	}
}

func (e *env) plan() {
	e.t.Helper()
	if err := e.s.planRepairs(e.ctx); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) poll(id int, results []*metapb.RepairResult, corrupt []*metapb.ChunkRef, want uint32) []*metapb.RepairTask {
	e.t.Helper()
	r, err := e.s.RepairPoll(e.ctx, &metapb.RepairPollRequest{Id: csID(id), Results: results, Corrupt: corrupt, Want: want})
	if err != nil {
		e.t.Fatal(err)
	}
	return r.Tasks
}

func (e *env) hasGC(id string, chunk, version uint64) bool {
	e.t.Helper()
	var ok bool
	if err := e.store.View(e.ctx, func(r kv.Reader) error {
		_, ok2, err := r.Get(keys.GC(id, chunk, version))
		ok = ok2
		return err
	}); err != nil {
		e.t.Fatal(err)
	}
	return ok
}

// TestRepairQueueOrder checks that the most endangered stripes are queued
// first (shards down within the grace period count as missing), moves off a
// retiring chunkserver last, and unrecoverable stripes are counted lost.
func TestRepairQueueOrder(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		e.chunkservers(9)
		if _, err := e.s.Drain(e.ctx, &metapb.DrainRequest{Id: csID(7)}); err != nil {
			t.Fatal(err)
		}
		e.putStripe(10, 0, 1, 2, 3, 4, 5, 6, 7) // a shard on the retiring cs7: a move
		e.putStripe(10, 1, 1, 0, 2, 3, 4, 5, 6) // one lost
		e.putStripe(11, 0, 1, 0, 1, 2, 3, 4, 5) // two lost
		e.putStripe(11, 1, 1, 0, 8, 2, 3, 4, 5) // one lost, one down within grace
		e.putStripe(12, 0, 1, 0, 1, 8, 2, 3, 4) // three gone: lost
		e.putStripe(12, 1, 1, 2, 3, 4, 5, 6, 8) // one down within grace: degraded, nothing to do yet
		e.down(time.Minute, 0, 1, 8)
		e.s.cfg.RepairGrace = 30 * time.Second
		// cs8 went down with the others; bring it back within "its" grace by
		// resetting when it went down.
		e.s.members.mu.Lock()
		e.s.members.byID[csID(8)].downSince = e.clock.Now()
		e.s.members.mu.Unlock()
		e.plan()
		rs := e.s.RepairStats()
		if want := (Health{Healthy: 1, Degraded: 4, Lost: 1}); rs.Health != want {
			t.Fatalf("health %+v, want %+v", rs.Health, want)
		}
		var got []stripeKey
		e.s.repMu.Lock()
		for _, it := range e.s.rep.queue {
			got = append(got, it.key)
		}
		e.s.repMu.Unlock()
		want := []stripeKey{{11, 0}, {11, 1}, {10, 1}, {10, 0}}
		if len(got) != len(want) {
			t.Fatalf("queue %v, want %v", got, want)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("queue %v, want %v", got, want)
			}
		}
		if rs.Queued != 5 || rs.MovesQueued != 1 {
			t.Fatalf("queued %d (moves %d), want 5 (1)", rs.Queued, rs.MovesQueued)
		}
		// cs6 may take one shard of each stripe it holds nothing of, most
		// endangered first; the retiring cs7 and holders get nothing.
		if tasks := e.poll(7, nil, nil, 16); len(tasks) != 0 {
			t.Fatalf("retiring chunkserver got %d tasks", len(tasks))
		}
		tasks := e.poll(6, nil, nil, 16)
		if len(tasks) != 2 || tasks[0].Ino != 11 || tasks[0].Stripe != 0 || tasks[1].Ino != 11 || tasks[1].Stripe != 1 {
			t.Fatalf("cs6 got %v, want stripes 11/0 and 11/1", tasks)
		}
		for _, tk := range tasks {
			if tk.NewChunkId == 0 || len(tk.Sources) != 6 || tk.Sources[0].Address == "" {
				t.Fatalf("task %v lacks a chunk id or sources", tk)
			}
		}
		if tk := tasks[1]; len(tk.Unavailable) != 2 {
			t.Fatalf("task for 11/1 marks %v unavailable, want the lost and the down shard", tk.Unavailable)
		}
		if more := e.poll(6, nil, nil, 16); len(more) != 0 {
			t.Fatalf("cs6 got %d more tasks for stripes it now holds", len(more))
		}
	})
}

// TestRepairCommitIsVersionConditioned checks that a rebuilt shard replaces
// the lost one only if the stripe still has the version and shard the task
// was planned on; otherwise the rebuilt chunk is collected.
func TestRepairCommitIsVersionConditioned(t *testing.T) {
	tests := []struct {
		name      string
		meanwhile func(e *env)
		ok        bool
		wantStale bool
	}{
		{"committed", func(e *env) {}, true, false},
		{"rewritten meanwhile", func(e *env) { e.putStripe(20, 0, 2, 1, 2, 3, 4, 5, 6) }, true, true},
		{"truncated meanwhile", func(e *env) {
			e.store.Update(e.ctx, func(t kv.Txn) error { return t.Delete(keys.Stripe(20, 0)) })
		}, true, true},
		{"target failed", func(e *env) {}, false, false},
		{"another task's chunk", func(e *env) {}, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, e *env) {
				e.chunkservers(7)
				e.putStripe(20, 0, 1, 0, 1, 2, 3, 4, 5)
				e.s.cfg.RepairGrace = 10 * time.Second
				e.down(time.Minute, 0)
				e.plan()
				tasks := e.poll(6, nil, nil, 4)
				if len(tasks) != 1 || tasks[0].Shard != 0 {
					t.Fatalf("tasks %v, want shard 0 of 20/0", tasks)
				}
				tk := tasks[0]
				tt.meanwhile(e)
				res := &metapb.RepairResult{TaskId: tk.TaskId, Ok: tt.ok, Bytes: 4096, NewChunkId: tk.NewChunkId, Version: tk.Version}
				if !tt.ok {
					res.Error = "injected"
				}
				if tt.name == "another task's chunk" {
					// The same task id after a meta restart, for a chunk this
					// task did not ask for: not applied, and that chunk collected.
					res.NewChunkId = tk.NewChunkId + 1000
				}
				e.poll(6, []*metapb.RepairResult{res}, nil, 0)
				rs := e.s.RepairStats()
				st := e.stripe(20, 0)
				switch {
				case tt.name == "another task's chunk":
					if rs.Done != 0 || rs.InFlight != 1 || st.Shards[0].ServerId != csID(0) || !e.hasGC(csID(6), tk.NewChunkId+1000, 1) {
						t.Fatalf("result for another chunk: stats %+v, shard 0 = %v, its chunk collected %v",
							rs, st.Shards[0], e.hasGC(csID(6), tk.NewChunkId+1000, 1))
					}
				case !tt.ok:
					if rs.Failed != 1 || !e.hasGC(csID(6), tk.NewChunkId, 1) || st.Shards[0].ServerId != csID(0) {
						t.Fatalf("failed task: stats %+v, shard 0 on %s", rs, st.Shards[0].ServerId)
					}
				case tt.wantStale:
					if rs.Stale != 1 || rs.Done != 0 || !e.hasGC(csID(6), tk.NewChunkId, 1) {
						t.Fatalf("stale result: stats %+v, gc of the rebuilt chunk %v", rs, e.hasGC(csID(6), tk.NewChunkId, 1))
					}
					for _, sh := range st.Shards {
						if sh.ServerId == csID(6) && st.Version == 1 {
							t.Fatalf("stale result changed the placement: %v", st.Shards)
						}
					}
				default:
					if rs.Done != 1 || st.Shards[0].ServerId != csID(6) || st.Shards[0].ChunkId != tk.NewChunkId {
						t.Fatalf("done: stats %+v, shard 0 = %v", rs, st.Shards[0])
					}
					if !e.hasGC(csID(0), 2000, 1) {
						t.Fatal("the lost copy is not queued for collection when its chunkserver returns")
					}
					e.plan()
					if h := e.s.RepairStats().Health; h.Healthy != 1 {
						t.Fatalf("after repair: %+v", h)
					}
				}
				// A result from a chunkserver that was not given the task is ignored.
				e.poll(5, []*metapb.RepairResult{{TaskId: tk.TaskId, Ok: true}}, nil, 0)
			})
		})
	}
}

// TestCorruptShardRepaired checks that a chunk version a chunkserver reports
// corrupt is rebuilt elsewhere like a lost one, while every server is up.
func TestCorruptShardRepaired(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		e.chunkservers(7)
		e.putStripe(30, 0, 3, 0, 1, 2, 3, 4, 5)
		e.plan()
		if h := e.s.RepairStats().Health; h.Healthy != 1 {
			t.Fatalf("before: %+v", h)
		}
		bad := &metapb.ChunkRef{ChunkId: 3000 + 2, Version: 3}
		e.poll(2, nil, []*metapb.ChunkRef{bad}, 0)
		e.plan()
		rs := e.s.RepairStats()
		if rs.Health.Degraded != 1 || rs.Queued != 1 {
			t.Fatalf("after the report: %+v", rs)
		}
		tasks := e.poll(6, nil, nil, 4)
		if len(tasks) != 1 || tasks[0].Shard != 2 || len(tasks[0].Unavailable) != 1 || tasks[0].Unavailable[0] != 2 {
			t.Fatalf("tasks %v, want shard 2 with the corrupt copy unavailable", tasks)
		}
		e.poll(6, []*metapb.RepairResult{{TaskId: tasks[0].TaskId, Ok: true, Bytes: 4096, NewChunkId: tasks[0].NewChunkId, Version: tasks[0].Version}}, nil, 0)
		st := e.stripe(30, 0)
		if st.Shards[2].ServerId != csID(6) || !e.hasGC(csID(2), 3002, 3) {
			t.Fatalf("shard 2 on %s, gc of the corrupt copy %v", st.Shards[2].ServerId, e.hasGC(csID(2), 3002, 3))
		}
		e.plan()
		if h := e.s.RepairStats().Health; h.Healthy != 1 {
			t.Fatalf("after repair: %+v", h)
		}
	})
}

// TestCorruptShardRepairedInPlace: with exactly k+m chunkservers there is no
// other server for a corrupt shard, so the one holding the bad copy rebuilds
// it as a new chunk; other servers are not given it.
func TestCorruptShardRepairedInPlace(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		e.chunkservers(6)
		e.putStripe(31, 0, 3, 0, 1, 2, 3, 4, 5)
		bad := &metapb.ChunkRef{ChunkId: 3100 + 2, Version: 3}
		e.poll(2, nil, []*metapb.ChunkRef{bad}, 0)
		e.plan()
		if tasks := e.poll(4, nil, nil, 4); len(tasks) != 0 {
			t.Fatalf("a server holding another shard of the stripe got %v", tasks)
		}
		tasks := e.poll(2, nil, nil, 4)
		if len(tasks) != 1 || tasks[0].Shard != 2 {
			t.Fatalf("tasks for the holder of the corrupt copy: %v, want shard 2", tasks)
		}
		if again := e.poll(2, nil, nil, 4); len(again) != 0 {
			t.Fatalf("a second task for the same stripe: %v", again)
		}
		e.poll(2, []*metapb.RepairResult{{TaskId: tasks[0].TaskId, Ok: true, Bytes: 4096, NewChunkId: tasks[0].NewChunkId, Version: tasks[0].Version}}, nil, 0)
		st := e.stripe(31, 0)
		if st.Shards[2].ServerId != csID(2) || st.Shards[2].ChunkId != tasks[0].NewChunkId || !e.hasGC(csID(2), 3102, 3) {
			t.Fatalf("shard 2 = %v, gc of the corrupt copy %v", st.Shards[2], e.hasGC(csID(2), 3102, 3))
		}
		e.plan()
		if h := e.s.RepairStats().Health; h.Healthy != 1 {
			t.Fatalf("after repair: %+v", h)
		}
	})
}
