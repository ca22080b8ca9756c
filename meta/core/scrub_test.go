package core

import (
	"testing"

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
