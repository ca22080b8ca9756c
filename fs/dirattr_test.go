package fs_test

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/rdmafs/rdmafs/fs/fstest"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// TestDirAttrsAfterChanges checks that a directory's attributes seen through
// the mount right after a create, an unlink, a rename and a mkdir in it are
// the metadata service's once the changes have reached it (the mount answers
// the kernel's getattr after a create or unlink from the change's reply, or
// as it answered the change itself, and must not answer with them after a
// later change).
func TestDirAttrsAfterChanges(t *testing.T) {
	c := fstest.Start(t, fstest.Options{})
	mc := c.Meta.Client(t)
	d := filepath.Join(c.Dir, "d")
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(d, &st); err != nil {
		t.Fatal(err)
	}
	ino := st.Ino
	same := func(what string) {
		t.Helper()
		// fsyncdir waits for the changes the mount answered early.
		if f, err := os.Open(d); err != nil {
			t.Fatal(err)
		} else if err := f.Sync(); err != nil {
			t.Fatal(err)
		} else {
			f.Close()
		}
		if err := syscall.Stat(d, &st); err != nil {
			t.Fatal(err)
		}
		r, err := mc.GetAttr(context.Background(), &metapb.GetAttrRequest{Ino: ino})
		if err != nil {
			t.Fatal(err)
		}
		got := st.Mtim.Sec*1e9 + st.Mtim.Nsec
		if got != r.Attr.MtimeNs || uint32(st.Nlink) != r.Attr.Nlink {
			t.Errorf("after %s: mtime %d nlink %d through the mount, %d %d in meta", what, got, st.Nlink, r.Attr.MtimeNs, r.Attr.Nlink)
		}
	}
	steps := []struct {
		what string
		do   func() error
	}{
		{"create", func() error { return os.WriteFile(filepath.Join(d, "a"), nil, 0o644) }},
		{"rename", func() error { return os.Rename(filepath.Join(d, "a"), filepath.Join(d, "b")) }},
		{"create again", func() error { return os.WriteFile(filepath.Join(d, "c"), nil, 0o644) }},
		{"mkdir", func() error { return os.Mkdir(filepath.Join(d, "sub"), 0o755) }},
		{"unlink", func() error { return os.Remove(filepath.Join(d, "b")) }},
		{"rmdir", func() error { return os.Remove(filepath.Join(d, "sub")) }},
		{"chmod", func() error { return os.Chmod(d, 0o700) }},
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			t.Fatalf("%s: %v", s.what, err)
		}
		same(s.what)
	}
}
