// Package sched sets the Linux scheduling policy of the whole process.
package sched

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// Batch puts every thread of the process under SCHED_BATCH, and so every
// thread created later (threads inherit the policy of the thread that creates
// them).
//
// SCHED_BATCH is the normal fair policy without wake-up preemption: a thread
// of this process woken by another (a reader, by the peer's socket write)
// does not take the CPU from the waker in the middle of its work. chunkd and
// the FUSE client, whose every operation wakes the other, both run under it,
// which saves context switches per request on a small machine (figures in
// docs/performance.md). It needs no privilege.
func Batch() error {
	// Two passes: a thread created during the first from one not yet
	// switched would be missed.
	for range 2 {
		ents, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return fmt.Errorf("sched: list threads: %w", err)
		}
		for _, e := range ents {
			tid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			attr := unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_BATCH}
			if err := unix.SchedSetAttr(tid, &attr, 0); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("sched: SCHED_BATCH for thread %d: %w", tid, err)
			}
		}
	}
	return nil
}
