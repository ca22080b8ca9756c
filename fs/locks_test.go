package fs_test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmafs/rdmafs/fs/fstest"
)

// TestFlockAcrossMounts: a flock taken through one mount excludes the same
// file's flock through another; a waiter on the other mount gets it when the
// holder closes its file, and when a holding process is killed.
func TestFlockAcrossMounts(t *testing.T) {
	c := fstest.Start(t, fstest.Options{})
	b, _ := c.Mount(t)
	pa, pb := filepath.Join(c.Dir, "lockfile"), filepath.Join(b, "lockfile")
	if err := os.WriteFile(pa, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	fa, err := os.Open(pa)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(int(fa.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	fb, err := os.Open(pb)
	if err != nil {
		t.Fatal(err)
	}
	defer fb.Close()
	if err := unix.Flock(int(fb.Fd()), unix.LOCK_SH|unix.LOCK_NB); err != unix.EWOULDBLOCK {
		t.Fatalf("flock LOCK_SH|LOCK_NB on mount B while mount A holds LOCK_EX: %v, want EWOULDBLOCK", err)
	}
	got := make(chan error, 1)
	go func() { got <- unix.Flock(int(fb.Fd()), unix.LOCK_EX) }()
	select {
	case err := <-got:
		t.Fatalf("flock on mount B returned (%v) while mount A holds the lock", err)
	case <-time.After(300 * time.Millisecond):
	}
	fa.Close() // the last close of A's open file releases its flock
	if err := <-got; err != nil {
		t.Fatalf("waiting flock on mount B: %v", err)
	}
	if err := unix.Flock(int(fb.Fd()), unix.LOCK_UN); err != nil {
		t.Fatal(err)
	}

	// A process holding the lock through mount A is killed: its lock goes.
	holder := exec.Command("flock", "--exclusive", "--close", pa, "sleep", "600")
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	defer holder.Process.Kill()
	deadline := time.Now().Add(10 * time.Second)
	for unix.Flock(int(fb.Fd()), unix.LOCK_EX|unix.LOCK_NB) == nil {
		unix.Flock(int(fb.Fd()), unix.LOCK_UN)
		if time.Now().After(deadline) {
			t.Fatal("the flock(1) holder did not get the lock in 10s")
		}
		time.Sleep(10 * time.Millisecond) // flock(1) starts up: nothing to wait on
	}
	go func() { got <- unix.Flock(int(fb.Fd()), unix.LOCK_EX) }()
	holder.Process.Signal(syscall.SIGKILL)
	holder.Wait()
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("flock after the holder was killed: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the killed holder's flock was not released in 10s")
	}
}

// TestRecordLocksAcrossMounts: fcntl record locks exclude other owners on
// other mounts where they overlap, F_GETLK reports the holder, F_SETLKW waits
// for the release, and closing any descriptor of the file releases the
// process's locks on it (and only on it).
func TestRecordLocksAcrossMounts(t *testing.T) {
	c := fstest.Start(t, fstest.Options{})
	b, _ := c.Mount(t)
	for _, name := range []string{"f", "other"} {
		if err := os.WriteFile(filepath.Join(c.Dir, name), make([]byte, 100), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// The holder is a child process: record locks belong to processes, and
	// this test process is the other owner.
	holder := exec.Command("python3", "-c", `
import fcntl, os, sys
f = open(sys.argv[1], "r+")
o = open(sys.argv[2], "r+")
fcntl.lockf(f, fcntl.LOCK_EX, 10, 0)      # bytes 0-9 of f
fcntl.lockf(o, fcntl.LOCK_EX, 0, 0)       # all of other
print("locked", flush=True)
sys.stdin.readline()
os.close(os.open(sys.argv[2], os.O_RDONLY)) # closing a descriptor of other releases other's lock only
print("closed", flush=True)
sys.stdin.readline()
`, filepath.Join(c.Dir, "f"), filepath.Join(c.Dir, "other"))
	holder.Stderr = os.Stderr
	stdin, _ := holder.StdinPipe()
	stdout, _ := holder.StdoutPipe()
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	defer holder.Process.Kill()
	out := bufio.NewReader(stdout)
	line := func() string {
		l, err := out.ReadString('\n')
		if err != nil {
			t.Fatalf("holder: %v", err)
		}
		return strings.TrimSpace(l)
	}
	if l := line(); l != "locked" {
		t.Fatalf("holder said %q", l)
	}
	fb, err := os.OpenFile(filepath.Join(b, "f"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer fb.Close()
	ob, err := os.OpenFile(filepath.Join(b, "other"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer ob.Close()
	lk := func(typ int16, start, n int64) *unix.Flock_t {
		return &unix.Flock_t{Type: typ, Whence: 0, Start: start, Len: n}
	}
	if err := unix.FcntlFlock(fb.Fd(), unix.F_SETLK, lk(unix.F_RDLCK, 5, 1)); err != unix.EAGAIN && err != unix.EACCES {
		t.Fatalf("F_SETLK over a range another mount's process holds: %v, want EAGAIN", err)
	}
	if err := unix.FcntlFlock(fb.Fd(), unix.F_SETLK, lk(unix.F_WRLCK, 10, 10)); err != nil {
		t.Fatalf("F_SETLK next to the held range: %v", err)
	}
	q := lk(unix.F_WRLCK, 0, 0)
	if err := unix.FcntlFlock(fb.Fd(), unix.F_GETLK, q); err != nil || q.Type != unix.F_WRLCK || q.Start != 0 || q.Len != 10 || int(q.Pid) != holder.Process.Pid {
		t.Fatalf("F_GETLK: %+v %v, want the holder's write lock on 0-9 (pid %d)", q, err, holder.Process.Pid)
	}
	if err := unix.FcntlFlock(ob.Fd(), unix.F_SETLK, lk(unix.F_WRLCK, 50, 1)); err != unix.EAGAIN && err != unix.EACCES {
		t.Fatalf("F_SETLK on other while held: %v", err)
	}
	fmt.Fprintln(stdin)
	if l := line(); l != "closed" {
		t.Fatalf("holder said %q", l)
	}
	if err := unix.FcntlFlock(ob.Fd(), unix.F_SETLK, lk(unix.F_WRLCK, 50, 1)); err != nil {
		t.Fatalf("F_SETLK on other after the holder closed a descriptor of it: %v", err)
	}
	if err := unix.FcntlFlock(fb.Fd(), unix.F_SETLK, lk(unix.F_RDLCK, 5, 1)); err != unix.EAGAIN && err != unix.EACCES {
		t.Fatalf("the holder's lock on f went with a close of another file: %v", err)
	}
	got := make(chan error, 1)
	go func() { got <- unix.FcntlFlock(fb.Fd(), unix.F_SETLKW, lk(unix.F_WRLCK, 0, 10)) }()
	select {
	case err := <-got:
		t.Fatalf("F_SETLKW returned (%v) while the range is held", err)
	case <-time.After(300 * time.Millisecond):
	}
	holder.Process.Signal(syscall.SIGKILL) // its exit closes its descriptors
	holder.Wait()
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("F_SETLKW after the holder died: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("F_SETLKW not granted 10s after the holder died")
	}
}

// TestSqliteAcrossMounts: two sqlite3 processes, one per mount, each add 1 to
// a counter in one database 1,000 times, each in its own transaction: the
// counter ends at 2,000 (locks exclude, and each holder reads what the last
// wrote).
func TestSqliteAcrossMounts(t *testing.T) {
	if _, err := exec.LookPath("sqlite3"); err != nil {
		t.Skip("no sqlite3")
	}
	c := fstest.Start(t, fstest.Options{})
	b, _ := c.Mount(t)
	db := "counter.db"
	if out, err := exec.Command("sqlite3", filepath.Join(c.Dir, db), "create table c(n integer); insert into c values(0);").CombinedOutput(); err != nil {
		t.Fatalf("sqlite3: %v: %s", err, out)
	}
	const n = 1000
	script := ".timeout 60000\n" + strings.Repeat("begin immediate; update c set n = n + 1; commit;\n", n)
	errs := make(chan error, 2)
	for _, dir := range []string{c.Dir, b} {
		go func() {
			cmd := exec.Command("sqlite3", filepath.Join(dir, db))
			cmd.Stdin = strings.NewReader(script)
			out, err := cmd.CombinedOutput()
			if err != nil || len(out) > 0 {
				lines := strings.SplitN(string(out), "\n", 6)
				err = fmt.Errorf("sqlite3 on %s: %v: %s", dir, err, strings.Join(lines[:min(5, len(lines))], "\n"))
			}
			errs <- err
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	out, err := exec.Command("sqlite3", filepath.Join(b, db), "select n from c;").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != fmt.Sprint(2*n) {
		t.Fatalf("counter after 2 x %d increments: %q %v", n, out, err)
	}
}

// TestOFDLocks: open file description locks belong to the open file, not
// the process: two opens in one process conflict (one on each mount, and two
// on one mount), and closing the description that holds one releases it
// (at the kernel's RELEASE, which follows close asynchronously, as it does
// for flocks on every FUSE file system).
func TestOFDLocks(t *testing.T) {
	c := fstest.Start(t, fstest.Options{})
	b, _ := c.Mount(t)
	if err := os.WriteFile(filepath.Join(c.Dir, "f"), make([]byte, 10), 0o644); err != nil {
		t.Fatal(err)
	}
	open := func(dir string) *os.File {
		f, err := os.OpenFile(filepath.Join(dir, "f"), os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	wr := func() *unix.Flock_t { return &unix.Flock_t{Type: unix.F_WRLCK, Start: 0, Len: 0} }
	fa, fb, fb2 := open(c.Dir), open(b), open(b)
	defer fb.Close()
	defer fb2.Close()
	if err := unix.FcntlFlock(fa.Fd(), unix.F_OFD_SETLK, wr()); err != nil {
		t.Fatal(err)
	}
	for i, f := range []*os.File{fb, fb2} {
		if err := unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLK, wr()); err != unix.EAGAIN {
			t.Fatalf("OFD lock through open %d of mount B while mount A's open holds one: %v", i, err)
		}
	}
	// The kernel sends the release of a closed file after close returns:
	// wait for the lock.
	fa.Close()
	got := make(chan error, 1)
	go func() { got <- unix.FcntlFlock(fb.Fd(), unix.F_OFD_SETLKW, wr()) }()
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("OFD lock after the holder's description closed: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the closed description's OFD lock was not released in 10s")
	}
	if err := unix.FcntlFlock(fb2.Fd(), unix.F_OFD_SETLK, wr()); err != unix.EAGAIN {
		t.Fatalf("a second open description in the same process and mount: %v, want EAGAIN", err)
	}
}

// TestOwnedFileLocks: the locks of a file the mount made under its
// directory's lease are decided by the mount and sent to meta behind
// (locks.go): two descriptions on that mount still exclude each other and
// F_OFD_GETLK shows the holder; another mount's open, which recalls the
// lease, finds the lock held, gets it once the holder closes, and from then
// on the first mount's locks go through meta and wait for it.
func TestOwnedFileLocks(t *testing.T) {
	c := fstest.Start(t, fstest.Options{})
	b, _ := c.Mount(t)
	if err := os.Mkdir(filepath.Join(c.Dir, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(c.Dir, "d", "db"), make([]byte, 10), 0o644); err != nil {
		t.Fatal(err)
	}
	open := func(dir string) *os.File {
		t.Helper()
		f, err := os.OpenFile(filepath.Join(dir, "d", "db"), os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	lock := func(f *os.File, cmd int, typ int16) error {
		return unix.FcntlFlock(f.Fd(), cmd, &unix.Flock_t{Type: typ, Start: 0, Len: 0})
	}
	f1, f2 := open(c.Dir), open(c.Dir)
	defer f1.Close()
	if err := lock(f1, unix.F_OFD_SETLK, unix.F_WRLCK); err != nil {
		t.Fatal(err)
	}
	if err := lock(f2, unix.F_OFD_SETLK, unix.F_WRLCK); err != unix.EAGAIN {
		t.Fatalf("a second description's lock while the first holds one: %v, want EAGAIN", err)
	}
	q := &unix.Flock_t{Type: unix.F_RDLCK}
	if err := unix.FcntlFlock(f2.Fd(), unix.F_OFD_GETLK, q); err != nil || q.Type != unix.F_WRLCK {
		t.Fatalf("F_OFD_GETLK beside a held write lock: type %d, %v; want F_WRLCK", q.Type, err)
	}
	if err := lock(f1, unix.F_OFD_SETLK, unix.F_UNLCK); err != nil {
		t.Fatal(err)
	}
	if err := lock(f2, unix.F_OFD_SETLK, unix.F_WRLCK); err != nil {
		t.Fatalf("a lock after the holder's unlock: %v", err)
	}
	g := open(b)
	defer g.Close()
	if err := lock(g, unix.F_OFD_SETLK, unix.F_WRLCK); err != unix.EAGAIN {
		t.Fatalf("the other mount's lock while the first mount's process holds it: %v, want EAGAIN", err)
	}
	f2.Close() // its lock goes with the release the kernel sends after close
	got := make(chan error, 1)
	go func() { got <- lock(g, unix.F_OFD_SETLKW, unix.F_WRLCK) }()
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("the other mount's lock after the holder closed: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the closed description's lock was not released in 10s")
	}
	if err := lock(f1, unix.F_OFD_SETLK, unix.F_WRLCK); err != unix.EAGAIN {
		t.Fatalf("the first mount's lock while the other mount holds it: %v, want EAGAIN", err)
	}
}
