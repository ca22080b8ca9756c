package fs_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"

	"github.com/rdmafs/rdmafs/fs"
	"github.com/rdmafs/rdmafs/fs/fstest"
	"github.com/rdmafs/rdmafs/meta/metapb"
	"github.com/rdmafs/rdmafs/meta/metatest"
)

// mount starts a meta server and mounts the file system on a temporary
// directory, unmounting it when the test ends.
func mount(t *testing.T) string {
	t.Helper()
	return mountData(t, nil)
}

// mountData is mount with data as the file I/O engine (nil: none).
func mountData(t *testing.T, data fs.Data) string {
	t.Helper()
	dir, _ := mountEarly(t, data, false)
	return dir
}

// mountEarly is mountData, with creates and unlinks answered early (and
// directory leases, ready when it returns) if early is set; it returns the
// file system too.
func mountEarly(t *testing.T, data fs.Data, early bool) (string, *fs.FS) {
	t.Helper()
	fstest.NeedFUSE(t)
	m := metatest.Start(t, metatest.Options{})
	c := m.Client(t)
	ctx := context.Background()
	sess, err := c.StartSession(ctx, "fs-test", 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sess.Close(ctx) })
	opts := fs.Options{Meta: c, Session: sess.ID(), Data: data}
	if early {
		opts.Early = sess
	}
	fsys, root := fs.New(opts)
	t.Cleanup(fsys.Close)
	dir := fstest.MountRoot(t, root)
	if early {
		select {
		case <-fsys.LeasesReady():
		case <-time.After(10 * time.Second):
			t.Fatal("the mount heard nothing from meta's Recalls in 10s")
		}
	}
	return dir, fsys
}

// mounted mounts the file system (see mount) and returns p, which gives
// the path of a name in it, and must, which fails the test on an error.
func mounted(t *testing.T) (p func(name string) string, must func(error)) {
	t.Helper()
	dir := mount(t)
	return func(name string) string { return filepath.Join(dir, name) }, func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
}

func errnoOf(err error) syscall.Errno {
	var e syscall.Errno
	if errors.As(err, &e) {
		return e
	}
	return 0
}

func TestNamespaceErrnos(t *testing.T) {
	p, must := mounted(t)
	must(os.Mkdir(p("d"), 0o755))
	must(os.WriteFile(p("d/f"), nil, 0o644))
	must(os.Mkdir(p("e"), 0o755))
	must(os.Mkdir(p("e/sub"), 0o755))
	must(os.WriteFile(p("x"), nil, 0o644))
	must(os.WriteFile(p("y"), nil, 0o600))

	cases := []struct {
		name string
		op   func() error
		want syscall.Errno
	}{
		{"mkdir existing", func() error { return os.Mkdir(p("d"), 0o755) }, syscall.EEXIST},
		{"rmdir non-empty", func() error { return syscall.Rmdir(p("d")) }, syscall.ENOTEMPTY},
		{"rmdir a file", func() error { return syscall.Rmdir(p("x")) }, syscall.ENOTDIR},
		{"unlink missing", func() error { return syscall.Unlink(p("nope")) }, syscall.ENOENT},
		{"unlink a directory", func() error { return syscall.Unlink(p("d")) }, syscall.EISDIR},
		{"create exclusive on existing", func() error {
			_, err := os.OpenFile(p("x"), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
			return err
		}, syscall.EEXIST},
		{"name too long", func() error { return os.Mkdir(p(strings.Repeat("n", 256)), 0o755) }, syscall.ENAMETOOLONG},
		// syscall.Rename: os.Rename answers EEXIST itself when the target is a directory.
		{"directory under itself", func() error { return syscall.Rename(p("e"), p("e/sub/e")) }, syscall.EINVAL},
		{"rename dir over non-empty dir", func() error { return syscall.Rename(p("e/sub"), p("d")) }, syscall.ENOTEMPTY},
		{"rename file over dir", func() error { return syscall.Rename(p("x"), p("e")) }, syscall.EISDIR},
		{"noreplace onto existing", func() error {
			return unix.Renameat2(unix.AT_FDCWD, p("x"), unix.AT_FDCWD, p("y"), unix.RENAME_NOREPLACE)
		}, syscall.EEXIST},
		{"lookup through a file", func() error { _, err := os.Stat(p("x/a")); return err }, syscall.ENOTDIR},
		{"xattr missing", func() error { _, err := unix.Getxattr(p("x"), "user.none", nil); return err }, syscall.ENODATA},
		{"xattr replace missing", func() error { return unix.Setxattr(p("x"), "user.none", []byte("v"), unix.XATTR_REPLACE) }, syscall.ENODATA},
		{"link a directory", func() error { return os.Link(p("d"), p("dlink")) }, syscall.EPERM},
	}
	for _, c := range cases {
		if got := errnoOf(c.op()); got != c.want {
			t.Errorf("%s: errno %v (%d), want %v", c.name, got, got, c.want)
		}
	}
}

func TestNamespaceOperations(t *testing.T) {
	p, must := mounted(t)
	// Mode 0000 survives, and the umask is applied exactly once (by the kernel).
	old := syscall.Umask(0o022)
	defer syscall.Umask(old)
	must(os.WriteFile(p("zero"), nil, 0))
	must(os.WriteFile(p("masked"), nil, 0o666))
	must(os.Mkdir(p("mdir"), 0o777))
	for name, want := range map[string]os.FileMode{"zero": 0, "masked": 0o644, "mdir": 0o755 | os.ModeDir} {
		st, err := os.Lstat(p(name))
		must(err)
		if st.Mode() != want {
			t.Errorf("%s: mode %v, want %v", name, st.Mode(), want)
		}
	}
	// Symlinks.
	must(os.Symlink("target/of/link", p("sym")))
	if got, err := os.Readlink(p("sym")); err != nil || got != "target/of/link" {
		t.Fatalf("readlink: %q, %v", got, err)
	}
	// Hard links count.
	must(os.WriteFile(p("a"), nil, 0o644))
	must(os.Link(p("a"), p("b")))
	st, err := os.Stat(p("a"))
	must(err)
	if n := st.Sys().(*syscall.Stat_t).Nlink; n != 2 {
		t.Fatalf("nlink %d after link, want 2", n)
	}
	ino := st.Sys().(*syscall.Stat_t).Ino
	must(os.Remove(p("a")))
	st, err = os.Stat(p("b"))
	must(err)
	if s := st.Sys().(*syscall.Stat_t); s.Nlink != 1 || s.Ino != ino {
		t.Fatalf("after unlinking one name: nlink %d ino %d, want 1 and %d", s.Nlink, s.Ino, ino)
	}
	// RENAME_EXCHANGE swaps two names.
	must(os.Mkdir(p("ex1"), 0o755))
	must(os.WriteFile(p("ex2"), nil, 0o644))
	must(unix.Renameat2(unix.AT_FDCWD, p("ex1"), unix.AT_FDCWD, p("ex2"), unix.RENAME_EXCHANGE))
	if st, err := os.Stat(p("ex2")); err != nil || !st.IsDir() {
		t.Fatalf("after exchange ex2 should be the directory: %v %v", st, err)
	}
	// Rename across directories replaces a file.
	must(os.Mkdir(p("from"), 0o755))
	must(os.WriteFile(p("from/f"), nil, 0o600))
	must(os.Rename(p("from/f"), p("b")))
	if st, err := os.Stat(p("b")); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("rename over a file: %v %v", st, err)
	}
	// Device nodes and fifos.
	must(syscall.Mkfifo(p("fifo"), 0o644))
	must(syscall.Mknod(p("chr"), syscall.S_IFCHR|0o600, int(unix.Mkdev(1, 3))))
	st, err = os.Stat(p("fifo"))
	must(err)
	if st.Mode()&os.ModeNamedPipe == 0 {
		t.Fatalf("fifo mode %v", st.Mode())
	}
	st, err = os.Stat(p("chr"))
	must(err)
	if s := st.Sys().(*syscall.Stat_t); s.Mode&syscall.S_IFMT != syscall.S_IFCHR || s.Rdev != unix.Mkdev(1, 3) {
		t.Fatalf("char device: mode %o rdev %d", s.Mode, s.Rdev)
	}
	// Extended attributes.
	must(unix.Setxattr(p("b"), "user.k", []byte("v1"), 0))
	if err := unix.Setxattr(p("b"), "user.k", []byte("v2"), unix.XATTR_CREATE); errnoOf(err) != syscall.EEXIST {
		t.Fatalf("XATTR_CREATE on existing: %v", err)
	}
	must(unix.Setxattr(p("b"), "user.k2", []byte("longer value"), 0))
	buf := make([]byte, 64)
	n, err := unix.Getxattr(p("b"), "user.k", buf)
	must(err)
	if string(buf[:n]) != "v1" {
		t.Fatalf("getxattr %q", buf[:n])
	}
	if _, err := unix.Getxattr(p("b"), "user.k2", make([]byte, 2)); errnoOf(err) != syscall.ERANGE {
		t.Fatalf("getxattr into a short buffer: %v, want ERANGE", err)
	}
	n, err = unix.Listxattr(p("b"), buf)
	must(err)
	names := strings.Split(strings.TrimRight(string(buf[:n]), "\x00"), "\x00")
	slices.Sort(names)
	if fmt.Sprint(names) != "[user.k user.k2]" {
		t.Fatalf("listxattr %q", names)
	}
	must(unix.Removexattr(p("b"), "user.k"))
	// chmod, chown, utimes.
	must(syscall.Chmod(p("b"), 0o4751))
	must(os.Chown(p("b"), 1234, 5678))
	mt := time.Date(2001, 2, 3, 4, 5, 6, 789, time.UTC)
	must(os.Chtimes(p("b"), mt, mt))
	st, err = os.Stat(p("b"))
	must(err)
	s := st.Sys().(*syscall.Stat_t)
	// chown by root keeps setuid on a non-executable... here the file is
	// group-executable, so Linux clears setuid on chown: mode 0751.
	if s.Uid != 1234 || s.Gid != 5678 || !st.ModTime().Equal(mt) || s.Mode&0o7777 != 0o751 {
		t.Fatalf("after chmod 4751/chown/utimes: mode %o uid %d gid %d mtime %v, want 751", s.Mode&0o7777, s.Uid, s.Gid, st.ModTime())
	}
	// statfs.
	var sfs unix.Statfs_t
	must(unix.Statfs(p("."), &sfs))
	if sfs.Namelen != 255 {
		t.Fatalf("statfs name max %d, want 255", sfs.Namelen)
	}
}

// TestReaddirLarge lists a 1,000-entry directory: every name exactly once.
func TestReaddirLarge(t *testing.T) {
	dir := mount(t)
	var want []string
	for i := 0; i < 1000; i++ {
		name := fmt.Sprintf("entry-%04d", i)
		want = append(want, name)
		f, err := os.Create(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range ents {
		got = append(got, e.Name())
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("listed %d names, want 1000 distinct", len(got))
	}
	// ls -l uses READDIRPLUS and stat: sizes and modes come back.
	out, err := exec.Command("ls", "-l", dir).CombinedOutput()
	if err != nil || strings.Count(string(out), "-rw-r--r--") != 1000 {
		t.Fatalf("ls -l: %v\n%.300s", err, out)
	}
}

// TestPermissions checks that a non-root user is held to the modes.
func TestPermissions(t *testing.T) {
	dir := mount(t)
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Skip("setpriv not installed")
	}
	as := func(uid int, args ...string) error {
		cmd := exec.Command("setpriv", append([]string{fmt.Sprintf("--reuid=%d", uid), fmt.Sprintf("--regid=%d", uid), "--clear-groups", "--"}, args...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	}
	os.Chmod(dir, 0o755)
	if err := os.Mkdir(filepath.Join(dir, "open"), 0o777); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Chmod(filepath.Join(dir, "open"), 0o1777); err != nil {
		t.Fatal(err)
	}
	if err := as(1000, "mkdir", filepath.Join(dir, "denied")); err == nil || !strings.Contains(err.Error(), "Permission denied") {
		t.Fatalf("mkdir in a 0755 root directory as uid 1000: %v, want permission denied", err)
	}
	if err := as(1000, "touch", filepath.Join(dir, "open", "mine")); err != nil {
		t.Fatalf("create in a 1777 directory: %v", err)
	}
	// Sticky bit: another user cannot remove it.
	if err := as(1001, "rm", "-f", filepath.Join(dir, "open", "mine")); err == nil {
		t.Fatal("another user removed a file from a sticky directory")
	}
	if err := as(1000, "rm", filepath.Join(dir, "open", "mine")); err != nil {
		t.Fatalf("the owner removing its file: %v", err)
	}
}

// capsCounter counts the calls about security.capability that reach the
// metadata service (lookups, and a write's removal).
type capsCounter struct {
	metapb.MetaClient
	n atomic.Int64
}

func (c *capsCounter) GetXattr(ctx context.Context, in *metapb.GetXattrRequest, opts ...grpc.CallOption) (*metapb.GetXattrReply, error) {
	if in.Name == "security.capability" {
		c.n.Add(1)
	}
	return c.MetaClient.GetXattr(ctx, in, opts...)
}

func (c *capsCounter) RemoveXattr(ctx context.Context, in *metapb.RemoveXattrRequest, opts ...grpc.CallOption) (*metapb.Empty, error) {
	if in.Name == "security.capability" {
		c.n.Add(1)
	}
	return c.MetaClient.RemoveXattr(ctx, in, opts...)
}

// TestFileCapabilities checks that file capabilities behave as on ext4 — set
// and read back, dropped by a write — and that writes to a file without them
// do not each ask the metadata service (the kernel asks the file system
// before every write).
func TestFileCapabilities(t *testing.T) {
	counter := &capsCounter{}
	dir := fstest.Start(t, fstest.Options{WrapMeta: func(c metapb.MetaClient) metapb.MetaClient {
		counter.MetaClient = c
		return counter
	}}).Dir
	p := filepath.Join(dir, "bin")
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4096)
	const writes = 20
	for i := range writes {
		if _, err := f.WriteAt(buf, int64(i)*4096); err != nil {
			t.Fatal(err)
		}
	}
	if n := counter.n.Load(); n > 1 {
		t.Fatalf("%d writes asked the metadata service for security.capability %d times, want at most once", writes, n)
	}

	// A version 2 capability set: cap_net_bind_service permitted+effective.
	caps := make([]byte, 20)
	binary.LittleEndian.PutUint32(caps[0:], 0x02000000|1) // VFS_CAP_REVISION_2 | VFS_CAP_FLAGS_EFFECTIVE
	binary.LittleEndian.PutUint32(caps[4:], 1<<10)        // CAP_NET_BIND_SERVICE
	if err := unix.Setxattr(p, "security.capability", caps, 0); err != nil {
		t.Fatalf("set capabilities: %v", err)
	}
	got := make([]byte, 64)
	n, err := unix.Getxattr(p, "security.capability", got)
	if err != nil || !bytes.Equal(got[:n], caps) {
		t.Fatalf("capabilities read back right after setting them: %x, %v; want %x", got[:n], err, caps)
	}
	// A write drops them, as on ext4.
	if _, err := f.WriteAt([]byte("x"), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.Getxattr(p, "security.capability", got); errnoOf(err) != syscall.ENODATA {
		t.Fatalf("capabilities after a write: %v, want ENODATA", err)
	}
	// Also a write by a user who may write the file but could not remove
	// them itself: the kernel drops them with its own privilege.
	if err := os.Chmod(p, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(p, "security.capability", caps, 0); err != nil {
		t.Fatalf("set capabilities: %v", err)
	}
	nobody := &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	cmd := exec.Command("setfattr", "-x", "security.capability", p)
	cmd.SysProcAttr = nobody
	if err := cmd.Run(); err == nil {
		t.Fatal("uid 65534 removed security.capability with removexattr(2)")
	}
	cmd = exec.Command("sh", "-c", `printf y >> "$0"`, p)
	cmd.SysProcAttr = nobody
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("write as uid 65534: %v %s", err, out)
	}
	if _, err := unix.Getxattr(p, "security.capability", got); errnoOf(err) != syscall.ENODATA {
		t.Fatalf("capabilities after uid 65534 wrote the file: %v, want ENODATA", err)
	}
}
