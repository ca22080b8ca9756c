package main

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		v    []float64
		want float64
	}{
		{[]float64{5}, 5},
		{[]float64{3, 1}, 2},
		{[]float64{34045, 24507, 33494, 32421}, (32421 + 33494) / 2.0},
		{[]float64{9, 1, 5}, 5},
	} {
		in := append([]float64(nil), tc.v...)
		if got := median(tc.v); got != tc.want {
			t.Errorf("median(%v) = %v, want %v", in, got, tc.want)
		}
		for i := range in {
			if tc.v[i] != in[i] {
				t.Fatalf("median reordered its argument: %v, was %v", tc.v, in)
			}
		}
	}
}

func TestBenchDataBase(t *testing.T) {
	for _, tc := range []struct {
		data, want string
		ok         bool
	}{
		{"memory", "/dev/shm", true},
		{"disk", os.TempDir(), true},
		{"", "", false},
		{"tmpfs", "", false},
	} {
		got, err := benchDataBase(tc.data)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("benchDataBase(%q) = %q, %v; want %q, ok %v", tc.data, got, err, tc.want, tc.ok)
		}
	}
}

func TestStorageOf(t *testing.T) {
	shm, err := os.MkdirTemp("/dev/shm", "rdmafs-storage-")
	if err != nil {
		t.Skipf("no /dev/shm: %v", err)
	}
	defer os.Remove(shm)
	if got := storageOf(shm); !strings.Contains(got, "in memory") {
		t.Errorf("storageOf(%s) = %q, want data in memory", shm, got)
	}
	// The test's temporary directory is on disk on the machines this runs on
	// unless $TMPDIR is a tmpfs.
	dir := t.TempDir()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	if st.Type == unix.TMPFS_MAGIC {
		t.Skipf("%s is on tmpfs", dir)
	}
	if got := storageOf(dir); !strings.Contains(got, "on disk") {
		t.Errorf("storageOf(%s) = %q, want data on disk", dir, got)
	}
}

func TestCheckRoom(t *testing.T) {
	var st unix.Statfs_t
	if err := unix.Statfs("/dev/shm", &st); err != nil || st.Type != unix.TMPFS_MAGIC || int64(st.Bavail)*st.Bsize < 2<<30 {
		t.Skip("no tmpfs with 2 GiB free at /dev/shm")
	}
	var tmp unix.Statfs_t
	if err := unix.Statfs(os.TempDir(), &tmp); err != nil || tmp.Type == unix.TMPFS_MAGIC {
		t.Skipf("%s is on tmpfs", os.TempDir())
	}
	// Room for the ceiling's copy alone but not for the cluster's data too.
	ceilingOnly := fmt.Sprintf("%dM", int64(st.Bavail)*st.Bsize*3/5>>20)
	for _, tc := range []struct {
		dataDir, size string
		ok            bool
	}{
		{"/dev/shm", "1M", true},
		{os.TempDir(), "1M", true},
		{"/dev/shm", "64P", false}, // no unit P
		{os.TempDir(), "1000T", false},
		{os.TempDir(), ceilingOnly, true},
		{"/dev/shm", ceilingOnly, false},
		{"/dev/shm/not-made-yet/cluster", ceilingOnly, false},
	} {
		if err := checkRoom(tc.dataDir, tc.size); (err == nil) != tc.ok {
			t.Errorf("checkRoom(%s, %s) = %v, want ok %v", tc.dataDir, tc.size, err, tc.ok)
		}
	}
}
