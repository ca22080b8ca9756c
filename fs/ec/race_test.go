//go:build race

package ec

// raceEnabled is set when the race detector is on: it makes sync.Pool drop
// items at random, so allocation counts of code that pools (reedsolomon) vary.
const raceEnabled = true
