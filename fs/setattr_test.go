package fs_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmafs/rdmafs/fs/fstest"
)

// TestSetattrAfterWriteSticks sets mtime and mode through a descriptor that
// still has unflushed writes, as tar -x and cp -a do: the flush of those
// writes at close must not undo them (mtime back to the write's time,
// set-user-ID cleared), neither right after close nor later.
func TestSetattrAfterWriteSticks(t *testing.T) {
	dir := fstest.Start(t, fstest.Options{}).Dir
	p := filepath.Join(dir, "f")
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(make([]byte, 100000)); err != nil {
		t.Fatal(err)
	}
	old := time.Unix(946684800, 0)
	if err := unix.Futimes(int(f.Fd()), []unix.Timeval{unix.NsecToTimeval(old.UnixNano()), unix.NsecToTimeval(old.UnixNano())}); err != nil {
		t.Fatal(err)
	}
	if err := f.Chmod(0o755 | os.ModeSetuid); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	check := func(when string) {
		t.Helper()
		var st syscall.Stat_t
		if err := syscall.Stat(p, &st); err != nil {
			t.Fatal(err)
		}
		if st.Mtim.Sec != old.Unix() {
			t.Errorf("%s: mtime %v, want %v", when, time.Unix(st.Mtim.Sec, 0).UTC(), old.UTC())
		}
		if st.Mode&0o7777 != 0o4755 {
			t.Errorf("%s: mode %o, want 4755", when, st.Mode&0o7777)
		}
		if st.Size != 100000 {
			t.Errorf("%s: size %d, want 100000", when, st.Size)
		}
	}
	check("after close")
	// A new open sees what meta has, not what the kernel cached.
	g, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	g.Close()
	check("after a reopen")
}

// TestFsyncDirectory: fsync of a directory, as databases and atomic-rename
// writers do after a create or rename, succeeds as on ext4.
func TestFsyncDirectory(t *testing.T) {
	dir := fstest.Start(t, fstest.Options{}).Dir
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "f"), filepath.Join(dir, "g")); err != nil {
		t.Fatal(err)
	}
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		t.Fatalf("fsync of a directory: %v", err)
	}
	if err := unix.Fdatasync(int(d.Fd())); err != nil {
		t.Fatalf("fdatasync of a directory: %v", err)
	}
}

// TestWriteByNonOwnerClearsSetuid: a write by a user who does not own a
// set-user-ID, set-group-ID file but may write it succeeds and clears both
// bits, as on ext4 (the kernel asks for the chmod on the writer's behalf).
func TestWriteByNonOwnerClearsSetuid(t *testing.T) {
	dir := fstest.Start(t, fstest.Options{}).Dir
	p := filepath.Join(dir, "suid")
	if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Chmod(p, 0o6777); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sh", "-c", `printf more >> "$0"`, p)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("write as uid 65534: %v %s", err, out)
	}
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode() & (os.ModeSetuid | os.ModeSetgid | os.ModePerm); got != 0o777 {
		t.Fatalf("mode after a non-owner's write: %v, want -rwxrwxrwx", got)
	}
	if b, _ := os.ReadFile(p); string(b) != "xmore" {
		t.Fatalf("content %q", b)
	}
	// A truncate, and an open with O_TRUNC, by a user who does not own
	// the file clear them too.
	for _, script := range []string{`truncate -s 1 "$0"`, `: > "$0"`} {
		if err := syscall.Chmod(p, 0o6777); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("sh", "-c", script, p)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s as uid 65534: %v %s", script, err, out)
		}
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode() & (os.ModeSetuid | os.ModeSetgid | os.ModePerm); got != 0o777 {
			t.Fatalf("mode after %s by a non-owner: %v, want -rwxrwxrwx", script, got)
		}
	}
	// Root keeps them (CAP_FSETID).
	if err := syscall.Chmod(p, 0o6777); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte("root"), 0o644); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(p); err != nil || fi.Mode()&(os.ModeSetuid|os.ModeSetgid) == 0 {
		t.Fatalf("mode after root's write: %v, %v; want set-user-ID and set-group-ID kept", fi.Mode(), err)
	}
	// Someone who may not write the file still may not chmod it.
	if err := syscall.Chmod(p, 0o4755); err != nil {
		t.Fatal(err)
	}
	cmd = exec.Command("chmod", "0755", p)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	if err := cmd.Run(); err == nil {
		t.Fatal("a non-owner without write access cleared set-user-ID with chmod")
	}
}
