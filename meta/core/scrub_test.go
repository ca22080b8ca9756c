package core

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/meta/metapb"
)

// TestVerifyPlanning: each repair scan queues the share of stripes the
// scrub interval asks for (one here), continuing where the last left off;
// a Scrub request queues all of them and its pass ends when all are
// reported; a shard a verification names is rebuilt.
func TestVerifyPlanning(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		e.chunkservers(6)
		for ino := uint64(10); ino < 14; ino++ {
			e.putStripe(ino, 0, 1, 0, 1, 2, 3, 4, 5)
		}
		e.beatAll(nil)
		verifies := func(tasks []*metapb.RepairTask) []*metapb.RepairTask {
			t.Helper()
			for _, tk := range tasks {
				if !tk.Verify {
					t.Fatalf("a repair task %v where only verifications are due", tk)
				}
			}
			return tasks
		}
		ok := func(tasks []*metapb.RepairTask, bad ...uint32) []*metapb.RepairResult {
			var out []*metapb.RepairResult
			for _, tk := range tasks {
				out = append(out, &metapb.RepairResult{TaskId: tk.TaskId, Ok: true, Version: tk.Version, BadShards: bad})
			}
			return out
		}
		// Periodic: one stripe per scan, in order.
		var seen []uint64
		var last []*metapb.RepairTask
		for range 3 {
			e.poll(0, ok(last), nil, 0)
			e.plan()
			tasks := verifies(e.poll(0, nil, nil, 8))
			if len(tasks) != 1 || len(tasks[0].Sources) != 6 {
				t.Fatalf("periodic scan: %d verifications %v, want 1 of a whole stripe", len(tasks), tasks)
			}
			seen = append(seen, tasks[0].Ino)
			last = tasks
		}
		if seen[0] != 10 || seen[1] != 11 || seen[2] != 12 {
			t.Fatalf("periodic verifications of inodes %v, want 10, 11, 12", seen)
		}
		e.poll(0, ok(last), nil, 0)

		// A request: every stripe now.
		r, err := e.s.Scrub(e.ctx, &metapb.ScrubRequest{})
		if err != nil {
			t.Fatal(err)
		}
		e.plan()
		tasks := verifies(e.poll(1, nil, nil, 8))
		if len(tasks) != 4 {
			t.Fatalf("after a request: %d verifications, want 4", len(tasks))
		}
		st, err := e.s.Status(e.ctx, &metapb.StatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if st.Scrub.StripesToVerify != 4 || st.Scrub.VerifyCoveredNs >= r.RequestedNs {
			t.Fatalf("during the pass: %d to verify, covered %d; want 4 and not %d yet", st.Scrub.StripesToVerify, st.Scrub.VerifyCoveredNs, r.RequestedNs)
		}
		// One stripe's shard 2 disagrees: it is rebuilt.
		results := ok(tasks[1:])
		results = append(results, ok(tasks[:1], 2)...)
		e.poll(1, results, nil, 0)
		st, _ = e.s.Status(e.ctx, &metapb.StatusRequest{})
		if st.Scrub.StripesToVerify != 0 || st.Scrub.VerifyCoveredNs != r.RequestedNs || st.Scrub.StripesVerified != 3+4 || st.Scrub.ParityMismatches != 1 {
			t.Fatalf("after the pass: %+v", st.Scrub)
		}
		e.plan()
		var repair *metapb.RepairTask
		for id := 0; id < 6 && repair == nil; id++ {
			for _, tk := range e.poll(id, nil, nil, 8) {
				if !tk.Verify {
					repair = tk
				}
			}
		}
		if repair == nil || repair.Ino != tasks[0].Ino || repair.Shard != 2 {
			t.Fatalf("repair after the mismatch: %v, want shard 2 of inode %d", repair, tasks[0].Ino)
		}
	})
}

// TestInventoryCheck: check reports the chunk versions a chunkserver's list
// names that nothing references, once the list is complete and older than
// the check; versions a heartbeat reports deleted drop out, also when a
// later part of a list in progress names them again; --repair queues the
// stray for deletion.
func TestInventoryCheck(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		e.chunkservers(6)
		f := e.create(root, RootIno, "f", 0o644)
		e.putStripe(f, 0, 1, 0, 1, 2, 3, 4, 5) // chunks 100*f.., version 1
		inv := func(last bool, refs ...uint64) {
			t.Helper()
			req := &metapb.InventoryRequest{Id: csID(0), TakenNs: 7, Last: last}
			for _, c := range refs {
				req.Chunks = append(req.Chunks, &metapb.ChunkRef{ChunkId: c, Version: 1})
			}
			if _, err := e.s.Inventory(e.ctx, req); err != nil {
				t.Fatal(err)
			}
		}
		// Only what the lists give matters here (the stripe put behind
		// the service's back makes its file's stored bytes wrong too).
		check := func(repair bool) *metapb.CheckReply {
			t.Helper()
			r, err := e.s.Check(e.ctx, &metapb.CheckRequest{Repair: repair})
			if err != nil {
				t.Fatal(err)
			}
			chunks := func(l []string) []string {
				return slices.DeleteFunc(l, func(p string) bool { return !strings.HasPrefix(p, "chunk ") })
			}
			r.Problems, r.Repaired = chunks(r.Problems), chunks(r.Repaired)
			return r
		}
		inv(false, 100*f, 77, 78)
		// 78 is deleted (and reported) while the list is in progress; the
		// last part names it again.
		if _, err := e.s.Heartbeat(e.ctx, &metapb.HeartbeatRequest{Id: csID(0), Deleted: []*metapb.ChunkRef{{ChunkId: 78, Version: 1}}}); err != nil {
			t.Fatal(err)
		}
		inv(true, 78)
		e.clock.Advance(time.Second)
		r := check(false)
		if len(r.Problems) != 1 || !strings.Contains(r.Problems[0], "chunk 77 version 1 on chunkserver cs0: nothing references it") {
			t.Fatalf("problems %q, want chunk 77 alone", r.Problems)
		}
		r = check(true)
		if len(r.Repaired) != 1 || !e.hasGC(csID(0), 77, 1) {
			t.Fatalf("repair %q: chunk 77 not queued for deletion", r.Repaired)
		}
		if r := check(false); len(r.Problems) != 0 {
			t.Fatalf("after the repair: %q", r.Problems)
		}
		// A list that arrives after the check began is left for the next.
		e.clock.Advance(time.Second)
		if _, err := e.s.Inventory(e.ctx, &metapb.InventoryRequest{Id: csID(1), TakenNs: 9, Last: true,
			Chunks: []*metapb.ChunkRef{{ChunkId: 99, Version: 1}}}); err != nil {
			t.Fatal(err)
		}
		if r := check(false); len(r.Problems) != 0 || !slices.ContainsFunc(r.Notes, func(n string) bool { return strings.Contains(n, "arrived during the check") }) {
			t.Fatalf("a list as new as the check: problems %q, notes %q", r.Problems, r.Notes)
		}
	})
}
