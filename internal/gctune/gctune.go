// Package gctune sets the pace of the Go garbage collector in rdmafs's
// processes.
package gctune

import (
	"os"
	"runtime/debug"
)

// Percent is the GOGC the processes run with when the environment sets
// none: the collector runs once the heap has grown by four times what was
// live after the last collection, not by once. The heaps are small (the
// data buffers are mapped memory, not heap), and at the default the
// metadata server spent about a fifth of its CPU collecting under a stream
// of creates (docs/performance.md).
const Percent = 400

// Apply sets the collector's target to Percent unless GOGC is set in the
// environment.
func Apply() {
	if _, ok := os.LookupEnv("GOGC"); !ok {
		debug.SetGCPercent(Percent)
	}
}
