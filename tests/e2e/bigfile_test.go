package e2e

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/rdmafs/rdmafs/internal/devcluster"
)

// childEnv makes the test binary a helper process (see runChild) instead of
// running tests: "write PATH BYTES SEED", "read PATH" or "model PATH STOP"
// (modelWriter until the file STOP exists), after joining the memory cgroup
// named by cgroupEnv.
const (
	childEnv  = "RDMAFS_E2E_CHILD"
	cgroupEnv = "RDMAFS_E2E_CGROUP"
)

// runChild is the helper process: it writes a pseudo-random stream to a file
// (fsync'ed) or reads a file, 1 MiB at a time, and prints the SHA-256 of the
// bytes. It joins its memory cgroup before it allocates anything.
func runChild(spec string) int {
	if cg := os.Getenv(cgroupEnv); cg != "" {
		if err := os.WriteFile(filepath.Join(cg, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0); err != nil {
			fmt.Fprintln(os.Stderr, "join cgroup:", err)
			return 2
		}
	}
	args := strings.Fields(spec)
	h := sha256.New()
	buf := make([]byte, 1<<20)
	var err error
	switch {
	case len(args) == 4 && args[0] == "write":
		err = func() error {
			n, _ := strconv.ParseInt(args[2], 10, 64)
			seed, _ := strconv.ParseUint(args[3], 10, 64)
			f, err := os.Create(args[1])
			if err != nil {
				return err
			}
			defer f.Close()
			r := rand.New(rand.NewPCG(seed, ^seed))
			for done := int64(0); done < n; {
				b := buf[:min(int64(len(buf)), n-done)]
				for i := 0; i < len(b); i += 8 {
					v := r.Uint64()
					for j := 0; j < 8 && i+j < len(b); j++ {
						b[i+j] = byte(v >> (8 * j))
					}
				}
				h.Write(b)
				if _, err := f.Write(b); err != nil {
					return err
				}
				done += int64(len(b))
			}
			if err := f.Sync(); err != nil {
				return err
			}
			return f.Close()
		}()
	case len(args) == 4 && args[0] == "model":
		var checks int
		stop := func() bool { _, err := os.Stat(args[2]); return err == nil }
		checks, err = modelWriter(args[1], stop, func(n int) error { return writeCount(args[3], n) })
		if err == nil {
			fmt.Printf("checks %d\n", checks)
			return 0
		}
	case len(args) == 2 && args[0] == "read":
		err = func() error {
			f, err := os.Open(args[1])
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = io.CopyBuffer(h, bufio.NewReaderSize(f, 1<<20), buf)
			return err
		}()
	default:
		err = fmt.Errorf("bad child spec %q", spec)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(hex.EncodeToString(h.Sum(nil)))
	return 0
}

// memCgroup creates a cgroup-v1 memory cgroup below this process's own with a
// limit; processes left in it when the test ends move back to the parent
// before it is removed.
func memCgroup(t *testing.T, name string, limit int64) string {
	t.Helper()
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	parent := ""
	for _, line := range strings.Split(string(self), "\n") {
		if f := strings.SplitN(line, ":", 3); len(f) == 3 && f[1] == "memory" {
			parent = filepath.Join("/sys/fs/cgroup/memory", f[2])
		}
	}
	if parent == "" {
		t.Fatal("no cgroup-v1 memory controller for this process (/proc/self/cgroup); this test needs one to bound the client's memory")
	}
	dir := filepath.Join(parent, fmt.Sprintf("rdmafs-e2e-%d-%s", os.Getpid(), name))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatalf("create memory cgroup: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "memory.limit_in_bytes"), []byte(strconv.FormatInt(limit, 10)), 0); err != nil {
		t.Fatalf("memory cgroup limit: %v", err)
	}
	t.Cleanup(func() {
		procs, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		for _, pid := range strings.Fields(string(procs)) {
			os.WriteFile(filepath.Join(parent, "cgroup.procs"), []byte(pid), 0)
		}
		if err := os.Remove(dir); err != nil {
			t.Errorf("remove memory cgroup: %v", err)
		}
	})
	return dir
}

// cgroupValue reads a number from a cgroup file.
func cgroupValue(t *testing.T, dir, file string) int64 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		t.Fatal(err)
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestLargerThanMemory writes and reads back a file eight times the memory the
// client side may use: the mount process, with 32 MiB of buffers, and the
// writing and reading processes each run in a 128 MiB memory cgroup. Every
// byte comes back (SHA-256), and the mount never needed more than its limit.
func TestLargerThanMemory(t *testing.T) {
	needRoot(t)
	const limit = 128 << 20
	const size = 1 << 30
	c := upWith(t, func(cfg *devcluster.Config) { cfg.ClientMem = "32MiB" })
	mountCg := memCgroup(t, "mount", limit)
	if err := os.WriteFile(filepath.Join(mountCg, "cgroup.procs"), []byte(strconv.Itoa(c.Mount.PID)), 0); err != nil {
		t.Fatal(err)
	}
	ioCg := memCgroup(t, "io", limit)
	child := func(spec string) string {
		t.Helper()
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), childEnv+"="+spec, cgroupEnv+"="+ioCg)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%s: %v", spec, err)
		}
		return strings.TrimSpace(string(out))
	}
	p := filepath.Join(c.MountPoint, "big")
	wrote := child(fmt.Sprintf("write %s %d 7", p, size))
	if st, err := os.Stat(p); err != nil || st.Size() != size {
		t.Fatalf("stat after writing: %v %v", st, err)
	}
	// Read it back through a second open; the first stripes are long gone
	// from every cache the mount has.
	read := child("read " + p)
	if read != wrote {
		t.Fatalf("read back SHA-256 %s, wrote %s", read, wrote)
	}
	peak := cgroupValue(t, mountCg, "memory.max_usage_in_bytes")
	failed := cgroupValue(t, mountCg, "memory.failcnt")
	t.Logf("%d MiB file; mount peak memory %d MiB of a %d MiB limit (%d times at the limit); writer/reader peak %d MiB",
		size>>20, peak>>20, limit>>20, failed, cgroupValue(t, ioCg, "memory.max_usage_in_bytes")>>20)
	if err := syscall.Kill(c.Mount.PID, 0); err != nil {
		t.Fatalf("the mount process is gone (killed at its memory limit?): %v", err)
	}
}
