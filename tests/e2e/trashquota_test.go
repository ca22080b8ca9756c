package e2e

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/rdmafs/rdmafs/internal/devcluster"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// TestTrashThroughMount deletes and overwrites files on a mount with the
// trash on: they are listed in .trash and by rdmafs trash list with where
// they were, restored byte-exact, purged by rm in .trash and by purge
// --all, after which their chunks are collected.
func TestTrashThroughMount(t *testing.T) {
	needRoot(t)
	c := upWith(t, func(cfg *devcluster.Config) { cfg.TrashDays = "1" })
	mnt := c.MountPoint
	base := snapSettledUsed(t, c, "the empty file system")
	dir := filepath.Join(mnt, "d")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	big := pattern(9<<20+123, 1)
	if err := os.WriteFile(filepath.Join(dir, "big"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "old"), []byte("old contents"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "new"), []byte("new contents"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "big")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "new"), filepath.Join(dir, "old")); err != nil {
		t.Fatal(err)
	}
	root, err := os.ReadDir(mnt)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range root {
		if e.Name() == metapb.TrashName {
			t.Fatalf("ls of the root lists %s", metapb.TrashName)
		}
	}
	trash := filepath.Join(mnt, metapb.TrashName)
	entries, err := os.ReadDir(trash)
	if err != nil || len(entries) != 2 {
		t.Fatalf(".trash: %v %v", entries, err)
	}
	var bigEntry, oldEntry string
	for _, e := range entries {
		switch {
		case strings.HasSuffix(e.Name(), "|big"):
			bigEntry = e.Name()
		case strings.HasSuffix(e.Name(), "|old"):
			oldEntry = e.Name()
		}
	}
	if got, err := os.ReadFile(filepath.Join(trash, oldEntry)); err != nil || string(got) != "old contents" {
		t.Fatalf("reading %s in the trash: %q %v", oldEntry, got, err)
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(trash, &st); err != nil || uint64(st.Blocks)*uint64(st.Bsize) < uint64(len(big)) {
		t.Fatalf("df of .trash: %d blocks of %d, %v", st.Blocks, st.Bsize, err)
	}
	out := runIn(t, mnt, "trash", "list")
	if !strings.Contains(out, "/d/big") || !strings.Contains(out, "/d/old") {
		t.Fatalf("trash list:\n%s", out)
	}
	runIn(t, mnt, "trash", "restore", bigEntry)
	if got, err := os.ReadFile(filepath.Join(dir, "big")); err != nil || !bytes.Equal(got, big) {
		t.Fatalf("restored file differs (%d bytes, %v)", len(got), err)
	}
	if err := os.Remove(filepath.Join(trash, oldEntry)); err != nil {
		t.Fatalf("rm in .trash: %v", err)
	}
	if err := os.Remove(filepath.Join(dir, "big")); err != nil {
		t.Fatal(err)
	}
	// The file in the trash holds its space.
	if held := snapSettledUsed(t, c, "with a file in the trash"); held.sum < base.sum+int64(len(big)) {
		t.Fatalf("the chunkservers hold %d bytes with a file of %d in the trash, %d when empty", held.sum, len(big), base.sum)
	}
	runIn(t, mnt, "trash", "purge", "--all")
	if entries, err := os.ReadDir(trash); err != nil || len(entries) != 0 {
		t.Fatalf(".trash after purge --all: %v %v", entries, err)
	}
	// The purged file's chunks are collected: the chunkservers' space returns.
	snapWaitSpace(t, c, base, 1<<20)
}

// runIn runs `rdmafs args...` in directory dir and returns its output.
func runIn(t *testing.T, dir string, args ...string) string {
	t.Helper()
	return run(t, dir, filepath.Join(binDir, "rdmafs"), args...)
}

// TestQuotaThroughMount sets a directory quota through the mount: df below
// it shows the quota, a writer past the space limit gets EDQUOT at fsync
// with at most a stripe stored past the limit, creates past the inode limit
// fail with EDQUOT, and quota check finds nothing to fix.
func TestQuotaThroughMount(t *testing.T) {
	needRoot(t)
	c := up(t)
	dir := filepath.Join(c.MountPoint, "q")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprint("pre", i)), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	const limit = 16 << 20
	runIn(t, c.MountPoint, "quota", "set", "q", "--space", "16MiB", "--inodes", "40")
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil || uint64(st.Blocks)*uint64(st.Bsize) != limit || st.Files != 40 || st.Ffree != 30 {
		t.Fatalf("df below the quota: %+v %v", st, err)
	}
	f, err := os.Create(filepath.Join(dir, "big"))
	if err != nil {
		t.Fatal(err)
	}
	var werr error
	chunk := pattern(1<<20, 2)
	for i := 0; i < 48 && werr == nil; i++ {
		_, werr = f.Write(chunk)
		if werr == nil && i%8 == 7 {
			werr = f.Sync()
		}
	}
	if werr == nil {
		werr = f.Sync()
	}
	f.Close()
	if !errors.Is(werr, syscall.EDQUOT) {
		t.Fatalf("writing 48 MiB under a 16 MiB quota: %v, want EDQUOT", werr)
	}
	var fst syscall.Stat_t
	if err := syscall.Stat(filepath.Join(dir, "big"), &fst); err != nil {
		t.Fatal(err)
	}
	const stripe = 4 << 20 // 4+2 with 1 MiB units
	if stored := uint64(fst.Blocks) * 512; stored > limit+stripe {
		t.Fatalf("%d bytes stored under a quota of %d (at most one stripe past it)", stored, limit)
	}
	made := 0
	for i := 0; ; i++ {
		f, err := os.Create(filepath.Join(dir, fmt.Sprint("n", i)))
		if err != nil {
			if !errors.Is(err, syscall.EDQUOT) {
				t.Fatalf("create %d: %v, want EDQUOT", i, err)
			}
			break
		}
		f.Close()
		made++
	}
	if made != 40-11 { // the 10 files and big are there
		t.Fatalf("%d creates succeeded under an inode quota of 40 with 11 used", made)
	}
	out := runIn(t, c.MountPoint, "quota", "check")
	if strings.Contains(out, "fixed:") || !strings.Contains(out, "/q") {
		t.Fatalf("quota check:\n%s", out)
	}
}
