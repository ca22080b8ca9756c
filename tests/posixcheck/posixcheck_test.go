// Package posixcheck is a randomized POSIX checker for rdmafs: thousands of
// seeded random operations on one file through a real FUSE mount (pwrite,
// pread, mmap writes and reads, ftruncate, fallocate, copy_file_range,
// fsync, fdatasync, close and reopen), each result and, after every
// operation, the size (fstat and lseek SEEK_END) compared with an in-memory
// model of the file. Every 100 operations (verifyEvery), and at the end, the
// file is read whole and compared; in the two-mounts variant it is also
// closed and read whole through a second mount of the same file system
// (close-to-open consistency), then reopened. Variants (subtests of TestPOSIX,
// each with a subtest per seed): one-mount (no mmap), one-mount-mmap and
// two-mounts. TestCheckerOnLocalFS runs the same checker on a local
// directory, which validates the model. The mmap operations run in a helper
// process (see mmaphelper_test.go). TestFtruncateSizeDuringReads is a
// focused reproduction of a discrepancy the checker found.
//
// fallocate modes the file system answers with EOPNOTSUPP are logged and no
// longer used; rdmafs documents mode 0, FALLOC_FL_KEEP_SIZE and
// FALLOC_FL_PUNCH_HOLE|FALLOC_FL_KEEP_SIZE, the three the checker uses.
//
// Environment:
//
//	RDMAFS_POSIXCHECK_SEED=S[,S…]  the seeds (default 1,2,3)
//	RDMAFS_POSIXCHECK_OPS=N        operations in all (default 20000), split
//	                               evenly over the variants, then the seeds
//
// A failure prints the seed, the operation's index, the operation, the last
// 20 operations with their parameters, the first differing offset and the
// environment that reruns the same operations. A sequence of operations
// depends only on the seed and the variant, so a rerun with fewer operations
// replays a prefix of it.
package posixcheck

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/rdmafs/rdmafs/fs/fstest"
)

const (
	defaultOps      = 20000
	localOpsPerSeed = 1500 // TestCheckerOnLocalFS, per variant and seed
)

var defaultSeeds = []uint64{1, 2, 3}

// config reads the seeds and the total operation count from the environment.
func config(t *testing.T) (seeds []uint64, total int) {
	t.Helper()
	seeds, total = defaultSeeds, defaultOps
	if s := os.Getenv("RDMAFS_POSIXCHECK_SEED"); s != "" {
		seeds = nil
		for _, f := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' }) {
			v, err := strconv.ParseUint(f, 0, 64)
			if err != nil {
				t.Fatalf("RDMAFS_POSIXCHECK_SEED=%q: %v", s, err)
			}
			seeds = append(seeds, v)
		}
		if len(seeds) == 0 {
			t.Fatalf("RDMAFS_POSIXCHECK_SEED=%q: no seed", s)
		}
	}
	if s := os.Getenv("RDMAFS_POSIXCHECK_OPS"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v <= 0 {
			t.Fatalf("RDMAFS_POSIXCHECK_OPS=%q: want a positive count", s)
		}
		total = v
	}
	return seeds, total
}

// perRun is the operation count of one variant and seed.
func perRun(total, seeds int) int {
	return max(1, total/len(variants)/seeds)
}

// repro tells how to rerun the first nops operations of a seed in a variant.
func repro(test string, v variant) func(seed uint64, nops int) string {
	return func(seed uint64, nops int) string {
		return fmt.Sprintf("RDMAFS_POSIXCHECK_SEED=%d RDMAFS_POSIXCHECK_OPS=%d go test -count=1 -run '%s/%s/seed=%d$' ./tests/posixcheck/",
			seed, nops*len(variants), test, v.name, seed)
	}
}

// TestPOSIX runs the checker on an rdmafs mount (fstest's cluster: EC 4+2,
// 64 KiB units), one subtest per variant and seed; the two-mounts variant
// reads the file through a second mount of the same file system.
func TestPOSIX(t *testing.T) {
	seeds, total := config(t)
	c := fstest.Start(t, fstest.Options{})
	other, _ := c.Mount(t)
	n := perRun(total, len(seeds))
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			for _, seed := range seeds {
				t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
					runChecker(t, v, seed, n, c.Dir, other, repro("TestPOSIX", v))
				})
			}
		})
	}
}

// TestCheckerOnLocalFS runs the same checker, with fewer operations, on a
// local directory (t.TempDir, a kernel file system): it validates the model,
// and must pass. The "other mount" there is the same directory.
func TestCheckerOnLocalFS(t *testing.T) {
	seeds, total := config(t)
	n := min(localOpsPerSeed, perRun(total, len(seeds)))
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			for _, seed := range seeds {
				t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
					dir := t.TempDir()
					runChecker(t, v, seed, n, dir, dir, repro("TestCheckerOnLocalFS", v))
				})
			}
		})
	}
}
