package fs_test

import (
	"os"
	"syscall"
	"testing"

	"github.com/rdmafs/rdmafs/fs"
	"golang.org/x/sys/unix"
)

// Testfs.LayoutXattr: rdmafs.layout shows a directory's layout for new files
// and a file's own; setting it on a directory changes what new files get and
// leaves existing ones as they were; a bad value is EINVAL, a file's layout
// cannot be set, and the name is not listed.
func TestLayoutXattr(t *testing.T) {
	p, must := mounted(t)
	must(os.Mkdir(p("d"), 0o755))
	must(os.WriteFile(p("d/old"), nil, 0o644))
	get := func(path string) string {
		t.Helper()
		b := make([]byte, 256)
		n, err := unix.Getxattr(path, fs.LayoutXattr, b)
		if err != nil {
			t.Fatalf("getxattr %s %s: %v", path, fs.LayoutXattr, err)
		}
		return string(b[:n])
	}
	before := get(p("d"))
	if got := get(p("d/old")); got != before {
		t.Fatalf("file's layout %q, its directory's %q", got, before)
	}
	must(unix.Setxattr(p("d"), fs.LayoutXattr, []byte("2+1/64KiB/inline=4096"), 0))
	if got := get(p("d")); got != "2+1/65536/inline=4096" {
		t.Fatalf("directory layout after set: %q", got)
	}
	must(os.WriteFile(p("d/new"), nil, 0o644))
	must(os.Mkdir(p("d/sub"), 0o755))
	if got := get(p("d/new")); got != "2+1/65536/inline=4096" {
		t.Fatalf("new file's layout %q, want the directory's", got)
	}
	if got := get(p("d/sub")); got != "2+1/65536/inline=4096" {
		t.Fatalf("new subdirectory's layout %q, want its parent's", got)
	}
	if got := get(p("d/old")); got != before {
		t.Fatalf("existing file's layout changed to %q", got)
	}
	for _, bad := range []string{"4+2", "0+1/64KiB", "2+1/1000", "nonsense"} {
		if err := unix.Setxattr(p("d"), fs.LayoutXattr, []byte(bad), 0); errnoOf(err) != syscall.EINVAL {
			t.Errorf("set %q: %v, want EINVAL", bad, err)
		}
	}
	if err := unix.Setxattr(p("d/old"), fs.LayoutXattr, []byte("2+1/64KiB"), 0); err == nil {
		t.Error("set the layout of an existing file")
	}
	if err := unix.Removexattr(p("d"), fs.LayoutXattr); errnoOf(err) != syscall.ENOTSUP {
		t.Errorf("remove %s: %v, want ENOTSUP", fs.LayoutXattr, err)
	}
	b := make([]byte, 4096)
	n, err := unix.Listxattr(p("d"), b)
	if err != nil {
		t.Fatal(err)
	}
	if string(b[:n]) != "" {
		t.Errorf("listxattr shows %q", b[:n])
	}
}
