package fs

import (
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/prometheus/client_golang/prometheus"
)

// TestOpMetricsAllocateNothing: recording a request, counted as a failure
// or not, allocates nothing (it runs on every FUSE request).
func TestOpMetricsAllocateNothing(t *testing.T) {
	m := newOpMetrics(prometheus.NewRegistry())
	start := time.Now()
	if n := testing.AllocsPerRun(1000, func() {
		m.done(opWrite, start, fuse.OK)
		m.done(opRmdir, start, fuse.Status(39)) // ENOTEMPTY
		m.written.Add(4096)
	}); n != 0 {
		t.Fatalf("recording a request allocates %v times", n)
	}
}

func BenchmarkOpMetricsDone(b *testing.B) {
	m := newOpMetrics(prometheus.NewRegistry())
	for b.Loop() {
		m.done(opWrite, time.Now(), fuse.OK)
	}
}
