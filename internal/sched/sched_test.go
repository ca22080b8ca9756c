package sched

import (
	"os"
	"runtime"
	"strconv"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// TestBatch checks that every thread of the process is under SCHED_BATCH
// afterwards, including threads the runtime creates later.
func TestBatch(t *testing.T) {
	if err := Batch(); err != nil {
		t.Fatal(err)
	}
	// Make the runtime create more threads: goroutines locked to threads.
	var wg sync.WaitGroup
	release := make(chan struct{})
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			<-release
		}()
	}
	defer func() { close(release); wg.Wait() }()
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		tid, _ := strconv.Atoi(e.Name())
		attr, err := unix.SchedGetAttr(tid, 0)
		if err != nil {
			continue // the thread has exited
		}
		if attr.Policy != unix.SCHED_BATCH {
			t.Errorf("thread %d has policy %d, want SCHED_BATCH (%d)", tid, attr.Policy, unix.SCHED_BATCH)
		}
	}
}
