package metabench

import (
	"context"
	"os"
	"runtime/pprof"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/meta/metatest"
)

func TestProbe(t *testing.T) {
	m := metatest.Start(t, metatest.Options{})
	f, _ := os.Create("/tmp/mb/cpu.prof")
	pprof.StartCPUProfile(f)
	res, err := Run(context.Background(), Options{Addr: m.Addr, Secret: m.Secret, Clients: []int{16}, Files: 8000, Duration: 100 * time.Millisecond})
	pprof.StopCPUProfile()
	Print(os.Stdout, res)
	if err != nil {
		t.Fatal(err)
	}
}
