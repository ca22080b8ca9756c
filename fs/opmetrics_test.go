package fs_test

import (
	"bytes"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/rdmafs/rdmafs/fs"
	"github.com/rdmafs/rdmafs/fs/fstest"
	"github.com/rdmafs/rdmafs/internal/stripe"
)

// TestRequestMetrics checks the mount's request metrics against what a
// test did through it: requests counted per operation with their latency,
// failures, the bytes written and read; and the metrics address in its
// virtual attribute.
func TestRequestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := fstest.Start(t, fstest.Options{Chunkservers: 3, Layout: stripe.Layout{K: 2, M: 1, Unit: 64 << 10},
		Metrics: reg, MetricsAddr: "127.0.0.1:7601"})
	const size = 3 * 64 << 10
	data := bytes.Repeat([]byte("metrics!"), size/8)
	path := filepath.Join(c.Dir, "f")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	// Twenty more writes: with HANDLE_KILLPRIV_V2 the kernel asks for
	// security.capability once, not before each write.
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	const rewrites = 20
	for i := range rewrites {
		if _, err := f.WriteAt(data[i*4096:(i+1)*4096], int64(i)*4096); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	// O_DIRECT: the reads reach the mount, not the page cache.
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	mem, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(mem)
	n, err := syscall.Read(fd, mem)
	syscall.Close(fd)
	if err != nil || n != size || !bytes.Equal(mem[:n], data) {
		t.Fatalf("O_DIRECT read: %d bytes, %v (aligned %v)", n, err, uintptr(unsafe.Pointer(&mem[0]))%4096 == 0)
	}
	if _, err := os.Stat(filepath.Join(c.Dir, "missing")); !os.IsNotExist(err) {
		t.Fatalf("stat of a missing name: %v", err)
	}
	if err := os.Mkdir(filepath.Join(c.Dir, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(c.Dir, "d", "x"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Rmdir(filepath.Join(c.Dir, "d")); err != syscall.ENOTEMPTY {
		t.Fatalf("rmdir of a directory not empty: %v", err)
	}
	buf := make([]byte, 64)
	if n, err := syscall.Getxattr(c.Dir, fs.MetricsXattr, buf); err != nil || string(buf[:n]) != "127.0.0.1:7601" {
		t.Fatalf("getxattr %s: %q, %v", fs.MetricsXattr, buf[:max(n, 0)], err)
	}

	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		byName[f.GetName()] = f
	}
	series := func(name, op string) *dto.Metric {
		t.Helper()
		f := byName[name]
		if f == nil {
			t.Fatalf("no metric %s", name)
		}
		for _, m := range f.Metric {
			if op == "" || len(m.Label) == 1 && m.Label[0].GetValue() == op {
				return m
			}
		}
		t.Fatalf("%s has no series of op %s", name, op)
		return nil
	}
	for _, op := range []string{"create", "write", "flush", "read", "lookup", "getxattr", "release", "mkdir"} {
		h := series("rdmafs_client_fuse_request_duration_seconds", op).GetHistogram()
		if h.GetSampleCount() == 0 || h.GetSampleSum() <= 0 {
			t.Errorf("op %s: %d requests taking %gs in all, want some", op, h.GetSampleCount(), h.GetSampleSum())
		}
	}
	if got := series("rdmafs_client_fuse_request_duration_seconds", "getxattr").GetHistogram().GetSampleCount(); got > 4 {
		t.Errorf("%d getxattr requests for %d writes and one getxattr of ours: the kernel asks before each write", got, rewrites+1)
	}
	if got := series("rdmafs_client_fuse_request_duration_seconds", "rename").GetHistogram().GetSampleCount(); got != 0 {
		t.Errorf("op rename: %d requests, want 0", got)
	}
	if got := series("rdmafs_client_fuse_request_failures_total", "rmdir").GetCounter().GetValue(); got != 1 {
		t.Errorf("failed rmdirs %g, want 1 (ENOTEMPTY)", got)
	}
	// A missing name is a negative entry for the kernel to cache: no failure.
	if got := series("rdmafs_client_fuse_request_failures_total", "lookup").GetCounter().GetValue(); got != 0 {
		t.Errorf("failed lookups %g, want 0", got)
	}
	if got := series("rdmafs_client_fuse_request_failures_total", "write").GetCounter().GetValue(); got != 0 {
		t.Errorf("failed writes %g, want 0", got)
	}
	if got := series("rdmafs_client_written_bytes_total", "").GetCounter().GetValue(); got != size+rewrites*4096 {
		t.Errorf("bytes written %g, want %d", got, size+rewrites*4096)
	}
	if got := series("rdmafs_client_read_bytes_total", "").GetCounter().GetValue(); got < size {
		t.Errorf("bytes read %g, want at least the %d read with O_DIRECT", got, size)
	}
}
