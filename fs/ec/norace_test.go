//go:build !race

package ec

// raceEnabled is set when the race detector is on; see race_test.go.
const raceEnabled = false
