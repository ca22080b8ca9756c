package e2e

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/internal/devcluster"
	"github.com/rdmafs/rdmafs/internal/devcluster/clustertest"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// TestFstabMount mounts a subdirectory of a dev cluster's file system the
// way an administrator would, through an fstab line of type rdmafs and
// `mount -a` (mount(8) calls /sbin/mount.rdmafs, which `make install`
// links to rdmafs), writes a file there, finds it in that subdirectory, and
// unmounts with umount(8).
func TestFstabMount(t *testing.T) {
	needRoot(t)
	clustertest.Need(t, "mount")
	const helper = "/sbin/mount.rdmafs"
	if _, err := os.Lstat(helper); err == nil {
		t.Skipf("%s exists (an installed rdmafs): not replaced by the test's", helper)
	}
	c := upWith(t, func(cfg *devcluster.Config) { cfg.Mount = false })
	if err := os.Symlink(filepath.Join(binDir, "rdmafs"), helper); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(helper) })
	mc, err := c.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer mc.Close()
	ctx := context.Background()
	sub, err := mc.Mkdir(ctx, &metapb.MkdirRequest{Parent: 1, Name: "sub", Mode: 0o755})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	mnt := filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	opts := []string{"_netdev", "transport=tcp", "log-file=" + filepath.Join(dir, "mount.log")}
	ca := c.ClientArgs()
	for i := 0; i+1 < len(ca); i += 2 {
		opts = append(opts, strings.TrimPrefix(ca[i], "--")+"="+ca[i+1])
	}
	fstab := filepath.Join(dir, "fstab")
	line := c.MetaAddr + ":/sub " + mnt + " rdmafs " + strings.Join(opts, ",") + " 0 0\n"
	if err := os.WriteFile(fstab, []byte("# rdmafs\n"+line), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-a", "-T", fstab, "-t", "rdmafs").CombinedOutput(); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "mount.log"))
		t.Fatalf("mount -a: %v\n%s\nmount log:\n%s", err, out, log)
	}
	t.Cleanup(func() {
		if devcluster.IsFUSEMount(mnt) {
			syscall.Unmount(mnt, syscall.MNT_DETACH)
		}
	})
	if !devcluster.IsFUSEMount(mnt) {
		t.Fatalf("%s is not mounted after mount -a", mnt)
	}
	if err := os.WriteFile(filepath.Join(mnt, "hello"), []byte("hi"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := mc.Lookup(ctx, &metapb.LookupRequest{Parent: sub.Attr.Ino, Name: "hello"}); err != nil {
		t.Fatalf("the file written through the fstab mount is not in /sub: %v", err)
	}
	if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
		t.Fatalf("umount: %v\n%s", err, out)
	}
	deadline := time.Now().Add(10 * time.Second)
	for devcluster.IsFUSEMount(mnt) {
		if time.Now().After(deadline) {
			t.Fatal("still mounted 10s after umount")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := os.Stat(filepath.Join(mnt, "hello")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("after umount the mount point still shows the file (%v)", err)
	}
}
