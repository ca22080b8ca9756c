package gctune

import (
	"os"
	"runtime/debug"
	"testing"
)

func TestApply(t *testing.T) {
	old, had := os.LookupEnv("GOGC")
	t.Cleanup(func() {
		if had {
			os.Setenv("GOGC", old)
		} else {
			os.Unsetenv("GOGC")
		}
		debug.SetGCPercent(100)
	})
	os.Unsetenv("GOGC")
	debug.SetGCPercent(100)
	Apply()
	if got := debug.SetGCPercent(100); got != Percent {
		t.Fatalf("without GOGC: GC percent %d, want %d", got, Percent)
	}
	os.Setenv("GOGC", "150")
	debug.SetGCPercent(150)
	Apply()
	if got := debug.SetGCPercent(100); got != 150 {
		t.Fatalf("with GOGC=150: GC percent %d, want 150 kept", got)
	}
}
