package private

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

func TestMkdirAllTightens(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "b")
	if err := MkdirAll(dir, nil); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(dir); fi.Mode().Perm() != DirMode {
		t.Fatalf("new dir mode %v", fi.Mode())
	}
	os.Chmod(dir, 0o755)
	if err := MkdirAll(dir, nil); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(dir); fi.Mode().Perm() != 0o700 {
		t.Fatalf("existing dir not tightened: %v", fi.Mode())
	}
}

func TestTightenTree(t *testing.T) {
	root := t.TempDir()
	os.Chmod(root, 0o755)
	os.MkdirAll(filepath.Join(root, "x", "y"), 0o755)
	os.WriteFile(filepath.Join(root, "x", "y", "f"), []byte("data"), 0o644)
	os.WriteFile(filepath.Join(root, "g"), []byte("data"), 0o400)
	os.Symlink("/etc/passwd", filepath.Join(root, "link"))
	n, err := TightenTree(root, nil)
	if err != nil {
		t.Fatal(err)
	}
	if n != 4 { // root, x, x/y and x/y/f; g is 0400
		t.Fatalf("tightened %d entries, want 4", n)
	}
	for _, p := range []string{"x", "x/y", "x/y/f", "g"} {
		fi, err := os.Stat(filepath.Join(root, p))
		if err != nil || fi.Mode().Perm()&0o077 != 0 {
			t.Fatalf("%s: %v %v", p, fi.Mode(), err)
		}
	}
	if fi, _ := os.Stat("/etc/passwd"); fi.Mode().Perm()&0o044 == 0 {
		t.Fatal("followed a symbolic link and tightened its target")
	}
}

func TestCheckSecret(t *testing.T) {
	p := filepath.Join(t.TempDir(), "secret")
	os.WriteFile(p, []byte("0123456789abcdef0123"), 0o600)
	if err := CheckSecret(p); err != nil {
		t.Fatalf("0600 secret refused: %v", err)
	}
	for _, mode := range []os.FileMode{0o640, 0o604, 0o660, 0o644} {
		os.Chmod(p, mode)
		if err := CheckSecret(p); !errors.Is(err, ErrExposed) {
			t.Fatalf("mode %#o: %v, want ErrExposed", mode, err)
		}
	}
}

func TestOpenLogRefusesLinks(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "target")
	os.WriteFile(target, nil, 0o644)
	link := filepath.Join(dir, "log")
	os.Symlink(target, link)
	if f, err := OpenLog(link); err == nil {
		f.Close()
		t.Fatal("opened a log through a symbolic link")
	}
	p := filepath.Join(dir, "real.log")
	f, err := OpenLog(p)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("line\n")
	f.Close()
	if fi, _ := os.Stat(p); fi.Mode().Perm() != FileMode {
		t.Fatalf("log mode %v, want 0600", fi.Mode())
	}
	os.Chmod(p, 0o644)
	f, err = OpenLog(p)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if fi, _ := os.Stat(p); fi.Mode().Perm() != FileMode {
		t.Fatalf("loose log not tightened: %v", fi.Mode())
	}
}

func TestOpenLogRefusesOthersFiles(t *testing.T) {
	dir := t.TempDir()
	other := filepath.Join(dir, "other.log")
	os.WriteFile(other, nil, 0o666)
	if err := os.Chown(other, 4242, 4242); err != nil {
		t.Skipf("chown: %v (needs root)", err)
	}
	if f, err := OpenLog(other); err == nil {
		f.Close()
		t.Fatal("opened a log file another user owns")
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	if f, err := OpenLog(fifo); err == nil {
		f.Close()
		t.Fatal("opened a FIFO as a log")
	}
	linked := filepath.Join(dir, "linked.log")
	os.WriteFile(linked, nil, 0o600)
	os.Link(linked, filepath.Join(dir, "second-name"))
	if f, err := OpenLog(linked); err == nil {
		f.Close()
		t.Fatal("opened a log file with two links")
	}
}

func TestSymlinkedDataDir(t *testing.T) {
	base := t.TempDir()
	real := filepath.Join(base, "real")
	os.Mkdir(real, 0o755)
	link := filepath.Join(base, "data")
	os.Symlink(real, link)
	if err := MkdirAll(link, nil); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(real); fi.Mode().Perm() != DirMode {
		t.Fatalf("the directory a data-dir link names was not tightened: %v", fi.Mode())
	}
	os.WriteFile(filepath.Join(real, "f"), nil, 0o644)
	if n, err := TightenTree(link, nil); err != nil || n != 1 {
		t.Fatalf("TightenTree through a link: %d changed, %v; want the file", n, err)
	}
}
