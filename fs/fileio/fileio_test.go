package fileio_test

import (
	"bytes"
	"crypto/sha256"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/rdmafs/rdmafs/fs/fstest"
)

func random(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, seed+1))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// TestReadBack writes files of many sizes through the mount and reads them back
// byte for byte, after close and after a reopen.
func TestReadBack(t *testing.T) {
	c := fstest.Start(t, fstest.Options{})
	stripe := 4 * 64 << 10
	sizes := []int{0, 1, 4095, 4096, 65536, 65537, stripe - 1, stripe, stripe + 1, 3*stripe + 12345, 5 << 20}
	for i, n := range sizes {
		data := random(n, uint64(i))
		p := filepath.Join(c.Dir, "file-"+string(rune('a'+i)))
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatalf("write %d bytes: %v", n, err)
		}
		got, err := os.ReadFile(p)
		if err != nil {
			t.Fatalf("read %d bytes: %v", n, err)
		}
		if sha256.Sum256(got) != sha256.Sum256(data) {
			t.Fatalf("file of %d bytes: read back %d bytes that differ", n, len(got))
		}
		if st, err := os.Stat(p); err != nil || st.Size() != int64(n) {
			t.Fatalf("file of %d bytes: stat %v %v", n, st, err)
		}
	}
}

// TestOverwriteAndHoles overwrites parts of stripes, writes past the end (a
// hole), truncates and extends: the file always reads as a model says.
func TestOverwriteAndHoles(t *testing.T) {
	c := fstest.Start(t, fstest.Options{})
	p := filepath.Join(c.Dir, "model")
	model := random(700_000, 1)
	if err := os.WriteFile(p, model, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	writeAt := func(b []byte, off int64) {
		t.Helper()
		if _, err := f.WriteAt(b, off); err != nil {
			t.Fatal(err)
		}
		if end := off + int64(len(b)); end > int64(len(model)) {
			model = append(model, make([]byte, end-int64(len(model)))...)
		}
		copy(model[off:], b)
	}
	check := func(what string) {
		t.Helper()
		got, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, model) {
			t.Fatalf("%s: file (%d bytes) differs from the model (%d bytes)", what, len(got), len(model))
		}
	}
	writeAt(random(10, 2), 5)            // inside stripe 0
	writeAt(random(100_000, 3), 200_000) // across a stripe boundary
	writeAt(random(3000, 4), 2_000_000)  // past the end: a hole
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	check("after overwrites and a hole")
	if err := f.Truncate(300_000); err != nil {
		t.Fatal(err)
	}
	model = model[:300_000]
	check("after truncate")
	writeAt(random(5, 5), 400_000) // extend again: the gap reads as zeros
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	check("after extending a truncated file")
}

// TestDegradedRead stops two of six chunkservers: with EC 4+2 every byte still
// reads back.
func TestDegradedRead(t *testing.T) {
	c := fstest.Start(t, fstest.Options{})
	data := random(3<<20, 7)
	p := filepath.Join(c.Dir, "degraded")
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	c.Chunk[0].Stop()
	c.Chunk[3].Stop()
	// A new open drops the kernel's cached pages: the reads reach the engine.
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got := make([]byte, len(data))
	if _, err := f.ReadAt(got, 0); err != nil {
		t.Fatalf("degraded read: %v", err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("degraded read returned different bytes")
	}
	if n := c.Engine.Stats().DegradedReads.Load(); n == 0 {
		t.Fatal("no stripe was rebuilt: the reads did not reach the chunkservers")
	}
}
