package fs_test

import (
	"bytes"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/rdmafs/rdmafs/fs/fstest"
	"github.com/rdmafs/rdmafs/internal/stripe"
)

// TestOpenTruncate: an open with O_TRUNC is one request (no SETATTR before
// it) that truncates committed and uncommitted data alike, drops file
// capabilities, and leaves nothing of the old bytes to come back.
func TestOpenTruncate(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := fstest.Start(t, fstest.Options{Chunkservers: 3, Layout: stripe.Layout{K: 2, M: 1, Unit: 64 << 10}, Metrics: reg})
	p := filepath.Join(c.Dir, "f")
	old := bytes.Repeat([]byte("old!"), 100<<10/4)
	if err := os.WriteFile(p, old, 0o644); err != nil {
		t.Fatal(err)
	}
	setattrs := func() uint64 { return fuseRequests(t, reg, "setattr") }

	// Committed data.
	before := setattrs()
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := f.Stat(); err != nil || st.Size() != 0 {
		t.Fatalf("size right after an O_TRUNC open: %v, %v", st.Size(), err)
	}
	if _, err := f.Write([]byte("new")); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if n := setattrs() - before; n != 0 {
		t.Errorf("an O_TRUNC open cost %d SETATTR requests, want 0 (ATOMIC_O_TRUNC)", n)
	}
	if b, err := os.ReadFile(p); err != nil || string(b) != "new" {
		t.Fatalf("after O_TRUNC and a write of 3 bytes: %q, %v", b[:min(len(b), 16)], err)
	}

	// Uncommitted data of another descriptor goes too.
	f1, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f1.WriteAt(old, 0); err != nil {
		t.Fatal(err)
	}
	f2, err := os.OpenFile(p, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f2.Write([]byte("abc")); err != nil {
		t.Fatal(err)
	}
	if err := f2.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f1.Close(); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(p); err != nil || string(b) != "abc" {
		t.Fatalf("after O_TRUNC over another descriptor's unflushed writes: %d bytes %q..., %v", len(b), b[:min(len(b), 16)], err)
	}
	// ... also after the mount forgets what it cached: read from a second mount.
	dir2, _ := c.Mount(t)
	if b, err := os.ReadFile(filepath.Join(dir2, "f")); err != nil || string(b) != "abc" {
		t.Fatalf("another mount reads %d bytes %q..., %v", len(b), b[:min(len(b), 16)], err)
	}

	// An O_TRUNC open drops file capabilities, as a truncate does.
	caps := make([]byte, 20)
	caps[0], caps[3], caps[5] = 1, 2, 4 // VFS_CAP_REVISION_2 | effective, CAP_NET_BIND_SERVICE
	if err := unix.Setxattr(p, "security.capability", caps, 0); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.Getxattr(p, "security.capability", make([]byte, 64)); err != syscall.ENODATA {
		t.Fatalf("capabilities after an O_TRUNC open: %v, want ENODATA", err)
	}
}
