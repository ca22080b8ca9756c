package fs_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"

	"github.com/rdmafs/rdmafs/fs/fstest"
)

// TestEarlyCreateCloseToOpen: a file created through one mount (its create
// answered before meta applied it) is there for another mount once close
// has returned, empty or not.
func TestEarlyCreateCloseToOpen(t *testing.T) {
	c := fstest.Start(t, fstest.Options{})
	b, _ := c.Mount(t)
	for i := 0; i < 200; i++ {
		name := fmt.Sprintf("f%d", i)
		var data []byte
		if i%2 == 1 {
			data = []byte(name)
		}
		if err := os.WriteFile(filepath.Join(c.Dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(b, name))
		if err != nil || string(got) != string(data) {
			t.Fatalf("%s through the other mount right after close: %q, %v", name, got, err)
		}
	}
}

// TestEarlyCreateRace: two mounts create the same names with O_EXCL at the
// same time; exactly one create of each name succeeds, and the file holds
// what its creator wrote.
func TestEarlyCreateRace(t *testing.T) {
	c := fstest.Start(t, fstest.Options{})
	b, _ := c.Mount(t)
	const n = 200
	won := make([][]bool, 2)
	var wg sync.WaitGroup
	for m, dir := range []string{c.Dir, b} {
		won[m] = make([]bool, n)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range n {
				f, err := os.OpenFile(filepath.Join(dir, fmt.Sprintf("x%d", i)), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
				if errors.Is(err, syscall.EEXIST) {
					continue
				}
				if err != nil {
					t.Error(err)
					return
				}
				won[m][i] = true
				_, err = fmt.Fprintf(f, "mount %d", m)
				if cerr := f.Close(); err == nil {
					err = cerr
				}
				if err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	for i := range n {
		if won[0][i] == won[1][i] {
			t.Errorf("x%d: created by mount 0: %v, by mount 1: %v (want exactly one)", i, won[0][i], won[1][i])
			continue
		}
		want := "mount 0"
		if won[1][i] {
			want = "mount 1"
		}
		for _, dir := range []string{c.Dir, b} {
			if got, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("x%d", i))); err != nil || string(got) != want {
				t.Errorf("x%d through %s: %q, %v (want %q)", i, dir, got, err, want)
			}
		}
	}
}

// TestEarlyUnlinksBeforeRmdir: a directory emptied by unlinks answered early
// can be removed at once (rm -rf), and replaced by a rename.
func TestEarlyUnlinksBeforeRmdir(t *testing.T) {
	c := fstest.Start(t, fstest.Options{})
	for round := range 20 {
		d := filepath.Join(c.Dir, fmt.Sprintf("d%d", round))
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		for i := range 20 {
			if err := os.WriteFile(filepath.Join(d, fmt.Sprintf("f%d", i)), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if round%2 == 0 {
			if err := os.RemoveAll(d); err != nil {
				t.Fatalf("rm -rf: %v", err)
			}
			continue
		}
		for i := range 20 {
			if err := os.Remove(filepath.Join(d, fmt.Sprintf("f%d", i))); err != nil {
				t.Fatal(err)
			}
		}
		other := filepath.Join(c.Dir, fmt.Sprintf("other%d", round))
		if err := os.Mkdir(other, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Rename(other, d); err != nil { // os.Rename refuses a directory target
			t.Fatalf("rename onto a directory just emptied: %v", err)
		}
	}
}
