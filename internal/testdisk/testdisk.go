// Package testdisk gives tests a small disk of their own that fills up: a
// tmpfs mounted for the test, and the free space of a file system, for
// tests of ENOSPC and of space accounting against a real file system.
package testdisk

import (
	"os"
	"os/exec"
	"testing"

	"golang.org/x/sys/unix"
)

// Tmpfs mounts a tmpfs of size (mount's size= option, such as "64m") on a
// fresh temporary directory of t and returns the directory. It skips the
// test unless run as root, or when the mount fails. The tmpfs is unmounted
// when the test ends, and a failed unmount fails the test; cleanups run in
// reverse, so whatever uses the directory and is stopped by a cleanup (a
// server, a store) must be started after Tmpfs returns.
func Tmpfs(t testing.TB, size string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skipf("mounts a tmpfs of %s: run as root", size)
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs of %s: %v %s", size, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("testdisk: umount %s: %v %s", dir, err, out)
		}
	})
	return dir
}

// Free returns the bytes free for unprivileged use (statfs f_bavail) on the
// file system holding dir; it fails the test if statfs fails.
func Free(t testing.TB, dir string) int64 {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatalf("testdisk: statfs %s: %v", dir, err)
	}
	return int64(st.Bavail) * st.Bsize
}
