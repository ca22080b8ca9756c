package metabench

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/meta/metatest"
)

// TestRunSmall runs every phase at small scale so that the benchmark code
// itself is tested.
func TestRunSmall(t *testing.T) {
	m := metatest.Start(t, metatest.Options{})
	res, err := Run(context.Background(), Options{Addr: m.Addr, Secret: m.Secret, Clients: []int{1, 3}, Files: 30, DirEntries: 25, Duration: 50 * time.Millisecond})
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
