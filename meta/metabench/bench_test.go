package metabench

import (
	"context"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/meta/metatest"
)

// TestRunSmall runs every phase at small scale so that the benchmark code
// itself is tested.
func TestRunSmall(t *testing.T) {
	m := metatest.Start(t, metatest.Options{})
	// A stand-in for the server's commit counters: every sample adds one
	// commit of two transactions.
	var samples atomic.Uint64
	commits := func() (uint64, uint64) { n := samples.Add(1); return n, 2 * n }
	res, err := Run(context.Background(), Options{Addr: m.Addr, Secret: m.Secret, Clients: []int{1, 3}, Files: 30, DirEntries: 25,
		Duration: 50 * time.Millisecond, Commits: commits})
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 10 {
		t.Fatalf("%d results, want 10", len(res))
	}
	for _, r := range res {
		if r.Ops == 0 || r.PerSecond() <= 0 {
			t.Fatalf("empty result %+v", r)
		}
		mutating := r.Op == "create" || r.Op == "rename" || r.Op == "unlink"
		if mutating && (r.Commits != 1 || r.Txns != 2) || !mutating && r.Commits != 0 {
			t.Fatalf("%s: %d commits of %d transactions, want the phase's difference", r.Op, r.Commits, r.Txns)
		}
	}
	Print(os.Stdout, res)
}

// BenchmarkMeta reports ops/s for every operation with 1 and 16 clients
// against a durable in-process server: go test -bench Meta -benchtime 1x.
func BenchmarkMeta(b *testing.B) {
	m := metatest.Start(b, metatest.Options{})
	for i := 0; i < b.N; i++ {
		res, err := Run(context.Background(), Options{Addr: m.Addr, Secret: m.Secret, Clients: []int{1, 16}, Files: 4000})
		if err != nil {
			b.Fatal(err)
		}
		for _, r := range res {
			b.ReportMetric(r.PerSecond(), r.Op+"-"+itoa(r.Clients)+"c-ops/s")
		}
	}
}

func itoa(n int) string {
	if n < 10 {
		return string(rune('0' + n))
	}
	return itoa(n/10) + string(rune('0'+n%10))
}
