package fs_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/fs/fstest"
)

// content is what TestLeaseRecallSendsChanges writes to a file: nothing to
// every other one (empty files), its name to the others.
func content(name string) []byte {
	if name[len(name)-1]%2 == 0 {
		return nil
	}
	return []byte(name)
}

// TestLeaseRecallSendsChanges: one mount creates, writes and removes files
// in a directory it holds the lease of, answering them itself (a close does
// not wait for the file's data either); its calls behind
// are held back (a linger of an hour), so only the recall sends them.
// Another mount's listing of the directory recalls the lease and sees every
// change; a file the other mount creates is then seen by the first.
func TestLeaseRecallSendsChanges(t *testing.T) {
	c := fstest.Start(t, fstest.Options{Linger: time.Hour})
	b, _ := c.Mount(t)
	dir := filepath.Join(c.Dir, "d")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(c.Dir, "e"), 0o755); err != nil {
		t.Fatal(err)
	}
	// A file written under the lease and renamed out of the directory is
	// reachable without a recall: the rename waits for its data.
	for i := range 10 {
		name := fmt.Sprintf("r%d", i)
		if err := os.WriteFile(filepath.Join(dir, name), []byte(name), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(filepath.Join(dir, name), filepath.Join(c.Dir, "e", name)); err != nil {
			t.Fatal(err)
		}
		if data, err := os.ReadFile(filepath.Join(b, "e", name)); err != nil || string(data) != name {
			t.Fatalf("%s renamed out of the leased directory, through the other mount: %q, %v", name, data, err)
		}
	}
	var want []string
	for i := range 50 {
		name := fmt.Sprintf("f%02d", i)
		if err := os.WriteFile(filepath.Join(dir, name), content(name), 0o644); err != nil {
			t.Fatal(err)
		}
		if i%5 == 0 {
			if err := os.Remove(filepath.Join(dir, name)); err != nil {
				t.Fatal(err)
			}
			continue
		}
		want = append(want, name)
	}
	ents, err := os.ReadDir(filepath.Join(b, "d"))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range ents {
		got = append(got, e.Name())
	}
	if !slices.Equal(got, want) {
		t.Fatalf("the other mount lists %d names %v,\nwant %d %v", len(got), got, len(want), want)
	}
	for _, name := range want {
		if data, err := os.ReadFile(filepath.Join(b, "d", name)); err != nil || string(data) != string(content(name)) {
			t.Fatalf("%s through the other mount: %q, %v; want %q", name, data, err, content(name))
		}
	}
	if err := os.WriteFile(filepath.Join(b, "d", "fromB"), []byte("b"), 0o644); err != nil {
		t.Fatal(err)
	}
	if data, err := os.ReadFile(filepath.Join(dir, "fromB")); err != nil || string(data) != "b" {
		t.Fatalf("the first mount reads the other's new file: %q, %v", data, err)
	}
}
