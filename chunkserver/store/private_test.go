package store

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/rdmafs/rdmafs/chunkserver/chunk"
)

// exposed lists the entries below dir that grant group or others any access.
func exposed(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if fi.Mode().Perm()&0o077 != 0 {
			out = append(out, path+" "+fi.Mode().String())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestDataDirPrivate checks that a store keeps every directory and file of its
// data directory to its owner, and that a data directory of an older version
// (directories 0755, complete slots 0644) is tightened at open with every
// version kept and still marked complete.
func TestDataDirPrivate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	s := open(t, dir, Options{})
	data := map[chunk.Key][]byte{}
	for i := uint64(1); i <= 20; i++ {
		k := chunk.Key{Chunk: i, Version: 1}
		data[k] = randBytes(i, int(i)*1000)
		if err := s.Put(k, data[k], Checksum(data[k])); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Delete(chunk.Key{Chunk: 20, Version: 1}); err != nil {
		t.Fatal(err)
	}
	delete(data, chunk.Key{Chunk: 20, Version: 1})
	if bad := exposed(t, dir); len(bad) > 0 {
		t.Fatalf("new data directory open to others: %v", bad)
	}
	s.Close()

	// Loosen everything as an older chunkd left it.
	complete := 0
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, _ := d.Info()
		switch {
		case d.IsDir():
			return os.Chmod(path, 0o755)
		case fi.Mode().Perm() == doneMode:
			complete++
			return os.Chmod(path, 0o644)
		case fi.Mode().Perm() == pendingMode:
			return nil // free slots were 0600 before too
		default:
			return os.Chmod(path, 0o644)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if complete != len(data) {
		t.Fatalf("%d complete slots, want %d", complete, len(data))
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}

	s2 := open(t, dir, Options{})
	if bad := exposed(t, dir); len(bad) > 0 {
		t.Fatalf("modes not tightened at open: %v", bad)
	}
	buf := make([]byte, 1<<20)
	for k, want := range data {
		info, err := s2.ReadInto(k, buf)
		if err != nil || !bytes.Equal(buf[:info.Length], want) {
			t.Fatalf("version %v after tightening: %v", k, err)
		}
		p, _ := s2.pathOf(k)
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != doneMode {
			t.Fatalf("version %v not marked complete (0400): %v %v", k, fi.Mode(), err)
		}
	}
	// A complete slot is reused after a delete (markFree turns 0400 into 0600).
	k := chunk.Key{Chunk: 1, Version: 1}
	if err := s2.Delete(k); err != nil {
		t.Fatal(err)
	}
	k2 := chunk.Key{Chunk: 1, Version: 2}
	if err := s2.Put(k2, data[k], Checksum(data[k])); err != nil {
		t.Fatal(err)
	}
}
