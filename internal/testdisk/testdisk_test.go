package testdisk_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/rdmafs/rdmafs/internal/testdisk"
)

// TestTmpfs mounts a 4 MiB tmpfs (as root; skipped otherwise): Free sees
// its size and the space a file takes.
func TestTmpfs(t *testing.T) {
	dir := testdisk.Tmpfs(t, "4m")
	before := testdisk.Free(t, dir)
	if before <= 0 || before > 4<<20 {
		t.Fatalf("a fresh 4 MiB tmpfs has %d bytes free", before)
	}
	if err := os.WriteFile(filepath.Join(dir, "f"), bytes.Repeat([]byte{1}, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	if after := testdisk.Free(t, dir); before-after < 1<<20 {
		t.Fatalf("writing 1 MiB took %d bytes of the tmpfs", before-after)
	}
}
