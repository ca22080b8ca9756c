package fs_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/rdmafs/rdmafs/fs/fstest"
	"github.com/rdmafs/rdmafs/internal/stripe"
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

// TestLeaseDirAttrs: under a directory's lease the mount answers the
// directory's getattr itself, from the attributes its changes left (early
// creates and unlinks), or from meta's after a change it cannot derive
// (mkdir, rmdir, rename). After every change the directory's nlink is
// right, and its mtime moves on; what the mount said last equals what meta
// holds once the other mount's stat has recalled the lease.
func TestLeaseDirAttrs(t *testing.T) {
	c := fstest.Start(t, fstest.Options{})
	b, _ := c.Mount(t)
	dir := filepath.Join(c.Dir, "d")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var last os.FileInfo
	step := func(what string, subdirs int) {
		t.Helper()
		st, err := os.Stat(dir)
		if err != nil {
			t.Fatal(err)
		}
		if n := nlink(st); n != uint64(2+subdirs) {
			t.Fatalf("after %s: nlink %d, want %d", what, n, 2+subdirs)
		}
		if last != nil && st.ModTime().Before(last.ModTime()) {
			t.Fatalf("after %s: mtime %v went back from %v", what, st.ModTime(), last.ModTime())
		}
		if last != nil && st.ModTime().Equal(last.ModTime()) {
			t.Fatalf("after %s: mtime %v did not change", what, st.ModTime())
		}
		last = st
	}
	write := func(name string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(name), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for round := range 3 {
		write(fmt.Sprintf("a%d", round))
		step("a create", min(round, 1))
		write(fmt.Sprintf("b%d", round))
		step("another create", min(round, 1))
		if err := os.Remove(filepath.Join(dir, fmt.Sprintf("a%d", round))); err != nil {
			t.Fatal(err)
		}
		step("an unlink", min(round, 1))
		if round == 0 {
			if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
				t.Fatal(err)
			}
			step("a mkdir", 1)
		}
		if err := os.Rename(filepath.Join(dir, fmt.Sprintf("b%d", round)), filepath.Join(dir, fmt.Sprintf("c%d", round))); err != nil {
			t.Fatal(err)
		}
		step("a rename", 1)
	}
	if err := os.Mkdir(filepath.Join(dir, "sub2"), 0o755); err != nil {
		t.Fatal(err)
	}
	step("a second mkdir", 2)
	if err := os.Remove(filepath.Join(dir, "sub")); err != nil {
		t.Fatal(err)
	}
	step("an rmdir", 1)
	write("z")
	step("a last create", 1)
	other, err := os.Stat(filepath.Join(b, "d"))
	if err != nil {
		t.Fatal(err)
	}
	if !other.ModTime().Equal(last.ModTime()) || nlink(other) != nlink(last) || other.Mode() != last.Mode() {
		t.Fatalf("meta holds mtime %v nlink %d mode %v; the lease holder said mtime %v nlink %d mode %v",
			other.ModTime(), nlink(other), other.Mode(), last.ModTime(), nlink(last), last.Mode())
	}
}

func nlink(st os.FileInfo) uint64 { return uint64(st.Sys().(*syscall.Stat_t).Nlink) }

// TestOwnedFileAttrs: the mount answers stat of the files it created under
// a lease from what its changes left (own.go). After writes, appends,
// truncates, an open with O_TRUNC, chmod, a chown to the same owner (sent
// behind), utimes, a hard link, an unlink of an open file and a rename over
// one, every stat it gave equals what meta holds, as the other mount sees
// it once its stats have recalled the lease.
func TestOwnedFileAttrs(t *testing.T) {
	c := fstest.Start(t, fstest.Options{})
	b, _ := c.Mount(t)
	dir := filepath.Join(c.Dir, "d")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := func(name string) string { return filepath.Join(dir, name) }
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	for i := range 8 {
		must(os.WriteFile(path(fmt.Sprintf("f%d", i)), make([]byte, 1000*i), 0o644))
	}
	f, err := os.OpenFile(path("f1"), os.O_WRONLY|os.O_APPEND, 0)
	must(err)
	_, err = f.Write(make([]byte, 5000))
	must(err)
	must(f.Close())
	must(os.Truncate(path("f2"), 100))
	must(os.WriteFile(path("f8"), []byte("0123456789"), 0o644)) // reopened with O_TRUNC
	f, err = os.OpenFile(path("f8"), os.O_WRONLY|os.O_TRUNC, 0)
	must(err)
	must(f.Close())
	must(os.Chmod(path("f3"), 0o600))
	must(os.WriteFile(path("f9"), []byte("9"), 0o644)) // chowned to whom it belongs: its ctime moves
	before, err := os.Stat(path("f9"))
	must(err)
	must(os.Chown(path("f9"), os.Getuid(), os.Getgid()))
	after, err := os.Stat(path("f9"))
	must(err)
	if bc, ac := before.Sys().(*syscall.Stat_t).Ctim, after.Sys().(*syscall.Stat_t).Ctim; ac == bc {
		t.Errorf("a chown left the ctime at %v", ac)
	}
	must(os.Chtimes(path("f4"), time.Unix(1e9, 0), time.Unix(1e9, 5)))
	must(os.Link(path("f5"), path("f5b")))
	open6, err := os.Open(path("f6"))
	must(err)
	defer open6.Close()
	must(os.Remove(path("f6")))
	open7, err := os.Open(path("f7"))
	must(err)
	defer open7.Close()
	must(os.Rename(path("f0"), path("f7")))
	st, err := open6.Stat()
	must(err)
	if n := nlink(st); n != 0 {
		t.Errorf("an unlinked open file has nlink %d, want 0", n)
	}
	st, err = open7.Stat()
	must(err)
	if n := nlink(st); n != 0 {
		t.Errorf("an open file renamed over has nlink %d, want 0", n)
	}
	names := []string{"f1", "f2", "f3", "f4", "f5", "f5b", "f7", "f8", "f9"}
	mine := map[string]*syscall.Stat_t{}
	for _, name := range names {
		st, err := os.Stat(path(name))
		must(err)
		mine[name] = st.Sys().(*syscall.Stat_t)
	}
	for _, name := range names {
		st, err := os.Stat(filepath.Join(b, "d", name))
		must(err)
		m, o := mine[name], st.Sys().(*syscall.Stat_t)
		if m.Ino != o.Ino || m.Size != o.Size || m.Mode != o.Mode || m.Nlink != o.Nlink || m.Uid != o.Uid || m.Gid != o.Gid ||
			m.Mtim != o.Mtim || m.Ctim != o.Ctim || m.Blocks != o.Blocks {
			t.Errorf("%s: the creating mount said %+v,\nmeta holds %+v", name, *m, *o)
		}
	}
}

// TestChownOwnedSentBehind: a chown of a file the mount created under its
// lease to the owner it has (sqlite's fchown of its journal, every
// transaction) is answered by the mount and sent behind, with the
// FATTR_KILL_SUIDGID the kernel adds under HANDLE_KILLPRIV_V2.
func TestChownOwnedSentBehind(t *testing.T) {
	c := fstest.Start(t, fstest.Options{Linger: time.Hour}) // calls behind wait for a call to travel with
	f, err := os.Create(filepath.Join(c.Dir, "journal"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	setattrs := c.Meta.Ops(t, "SetAttr")
	for range 3 {
		if err := f.Chown(os.Getuid(), os.Getgid()); err != nil {
			t.Fatal(err)
		}
	}
	if n := c.Meta.Ops(t, "SetAttr") - setattrs; n != 0 {
		t.Fatalf("meta answered %d SetAttr calls before the chowns of an owned file were synced", n)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if n := c.Meta.Ops(t, "SetAttr") - setattrs; n != 3 {
		t.Fatalf("after fsync meta answered %d SetAttr calls, want the 3 chowns", n)
	}
}

// TestOpendirAsksNothing: opening a directory (sqlite does, to fsync it
// after creating its journal) costs no call to meta, so it does not wait
// for the changes sent behind; the first listing does, and shows them.
func TestOpendirAsksNothing(t *testing.T) {
	c := fstest.Start(t, fstest.Options{Linger: time.Hour})
	f, err := os.Create(filepath.Join(c.Dir, "journal"))
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	readdirs, creates := c.Meta.Ops(t, "ReadDir"), c.Meta.Ops(t, "Create")
	d, err := os.Open(c.Dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if n := c.Meta.Ops(t, "ReadDir") - readdirs; n != 0 {
		t.Fatalf("opendir asked meta for %d pages", n)
	}
	if n := c.Meta.Ops(t, "Create") - creates; n != 0 {
		t.Fatalf("opendir waited for the create sent behind")
	}
	names, err := d.Readdirnames(-1)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(names, "journal") {
		t.Fatalf("listing %v lacks the file created behind", names)
	}
	if err := d.Sync(); err != nil {
		t.Fatalf("fsync of the directory: %v", err)
	}
}

// TestSmallFilesRideTheirCreates: the data of a small file written and
// closed under the directory's lease goes to meta with the file's create,
// which is still queued (calls behind wait an hour for a call to travel
// with here): meta gets no commit of its own. The attributes this mount
// answers meanwhile are those meta then makes, as another mount sees them,
// with the data; a file written again after its close, and one past the
// inline size, are committed as usual.
func TestSmallFilesRideTheirCreates(t *testing.T) {
	c := fstest.Start(t, fstest.Options{Linger: time.Hour, Layout: stripe.Layout{K: 4, M: 2, Unit: 64 << 10, Inline: 4096}})
	commits, creates := c.Meta.Ops(t, "CommitStripes"), c.Meta.Ops(t, "Create")
	want := map[string][]byte{}
	for i := range 20 {
		name := fmt.Sprintf("f%02d", i)
		want[name] = bytes.Repeat([]byte(name), 10*i+1)
		if err := os.WriteFile(filepath.Join(c.Dir, name), want[name], 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if n := c.Meta.Ops(t, "CommitStripes") - commits; n != 0 {
		t.Fatalf("meta answered %d commits of small files created under the lease", n)
	}
	stats := map[string]os.FileInfo{}
	for name := range want {
		fi, err := os.Stat(filepath.Join(c.Dir, name))
		if err != nil || fi.Size() != int64(len(want[name])) {
			t.Fatalf("stat %s: %v, %v", name, fi, err)
		}
		stats[name] = fi
	}
	d, err := os.Open(c.Dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Sync(); err != nil {
		t.Fatal(err)
	}
	d.Close()
	if n, m := c.Meta.Ops(t, "Create")-creates, c.Meta.Ops(t, "CommitStripes")-commits; n != 20 || m != 0 {
		t.Fatalf("after fsync of the directory meta answered %d creates and %d commits, want 20 and 0", n, m)
	}
	// Written again after its close, and past the inline size.
	want["f03"] = append(want["f03"], "more"...)
	appendMore(t, filepath.Join(c.Dir, "f03"))
	want["big"] = bytes.Repeat([]byte("b"), 5000)
	if err := os.WriteFile(filepath.Join(c.Dir, "big"), want["big"], 0o644); err != nil {
		t.Fatal(err)
	}
	b, _ := c.Mount(t)
	for name, data := range want {
		got, err := os.ReadFile(filepath.Join(b, name))
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("%s through the other mount: %d bytes, %v; want %d bytes", name, len(got), err, len(data))
		}
		if fi := stats[name]; fi != nil && name != "f03" {
			other, err := os.Stat(filepath.Join(b, name))
			if err != nil || !other.ModTime().Equal(fi.ModTime()) || other.Size() != fi.Size() || other.Mode() != fi.Mode() {
				t.Fatalf("%s: the other mount sees %v, %v; this mount answered %v %v %v", name, other.ModTime(), err, fi.ModTime(), fi.Size(), fi.Mode())
			}
		}
	}
}

// fuseRequests returns how many requests of op the mount whose metrics reg
// holds has answered.
func fuseRequests(t *testing.T, reg *prometheus.Registry, op string) uint64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "rdmafs_client_fuse_request_duration_seconds" {
			continue
		}
		for _, m := range f.Metric {
			if len(m.Label) == 1 && m.Label[0].GetValue() == op {
				return m.GetHistogram().GetSampleCount()
			}
		}
	}
	return 0
}

// TestNegativeEntries: the kernel caches a name the directory's lease says
// is missing, so probing it again costs no request, nor does the lookup
// before its create. When another mount creates such a name, the recall has
// the kernel drop the negative entry before the lease goes back: the first
// mount sees the file as soon as the other's create has returned.
func TestNegativeEntries(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := fstest.Start(t, fstest.Options{Metrics: reg})
	b, _ := c.Mount(t)
	// A directory per round: after a recall the mount waits a while before
	// it asks for the lease again.
	for round := range 3 {
		d := fmt.Sprintf("d%d", round)
		dir := filepath.Join(c.Dir, d)
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		// The first lookup of a missing name asks meta (and gets the
		// lease); the next is answered under the lease.
		for range 2 {
			if _, err := os.Stat(filepath.Join(dir, "x")); !os.IsNotExist(err) {
				t.Fatalf("stat of a missing name: %v", err)
			}
		}
		lookups := fuseRequests(t, reg, "lookup")
		for range 10 {
			if _, err := os.Stat(filepath.Join(dir, "x")); !os.IsNotExist(err) {
				t.Fatalf("stat of a missing name: %v", err)
			}
		}
		if n := fuseRequests(t, reg, "lookup") - lookups; n > 1 {
			t.Fatalf("round %d: 10 stats of a name the lease says is missing cost %d lookups", round, n)
		}
		// This mount creates a name it was told is missing.
		mine := filepath.Join(dir, "mine")
		if _, err := os.Stat(mine); !os.IsNotExist(err) {
			t.Fatalf("stat of a missing name: %v", err)
		}
		if err := os.WriteFile(mine, []byte("mine"), 0o644); err != nil {
			t.Fatal(err)
		}
		// Another mount creates one: this one sees it at once.
		if err := os.WriteFile(filepath.Join(b, d, "x"), []byte(d), 0o644); err != nil {
			t.Fatal(err)
		}
		if data, err := os.ReadFile(filepath.Join(dir, "x")); err != nil || string(data) != d {
			t.Fatalf("round %d: a file created by another mount reads here as %q, %v", round, data, err)
		}
		if data, err := os.ReadFile(filepath.Join(b, d, "mine")); err != nil || string(data) != "mine" {
			t.Fatalf("round %d: a file created here, through the other mount: %q, %v", round, data, err)
		}
	}
}

// TestLeaseEntries: under a directory lease the kernel keeps the entries of
// the directory's names for as long as the mount may use the lease, past
// the entry timeout: a stat or an unlink of a name it knows costs no
// lookup. When another mount replaces or removes such a name, the recall
// has the kernel drop the entries before the lease goes back: this mount
// sees the change as soon as the other's change is durable. A rename by
// this mount moves an entry out of its lease's reach: it is dropped too.
func TestLeaseEntries(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := fstest.Start(t, fstest.Options{Metrics: reg, EntryTimeout: time.Millisecond})
	b, _ := c.Mount(t)
	dir := filepath.Join(c.Dir, "d")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	name := func(i int) string { return filepath.Join(dir, fmt.Sprintf("f%d", i)) }
	// The first lookup of a missing name gets the lease; the files are
	// created under it.
	if _, err := os.Stat(name(0)); !os.IsNotExist(err) {
		t.Fatalf("stat of a missing name: %v", err)
	}
	for i := range 20 {
		if err := os.WriteFile(name(i), []byte("old"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(20 * time.Millisecond) // twenty entry timeouts go by
	// Stats and unlinks relative to the directory: the path walk to it
	// would revalidate the directory's own entry, which keeps the entry
	// timeout.
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	lookups := fuseRequests(t, reg, "lookup")
	for i := range 20 {
		var st unix.Stat_t
		if err := unix.Fstatat(fd, fmt.Sprintf("f%d", i), &st, 0); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 10 {
		if err := unix.Unlinkat(fd, fmt.Sprintf("f%d", i), 0); err != nil {
			t.Fatal(err)
		}
	}
	if n := fuseRequests(t, reg, "lookup") - lookups; n > 0 {
		t.Errorf("20 stats and 10 unlinks of names known under the lease cost %d lookups", n)
	}
	// This mount moves f12 to another directory it leases: the kernel
	// moves the entry with its time, so the move has it dropped.
	d2 := filepath.Join(c.Dir, "d2")
	if err := os.Mkdir(d2, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(name(12), filepath.Join(d2, "f12")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(d2, "f12")); err != nil {
		t.Fatal(err)
	}
	// Another mount replaces f10 and removes f11, and removes the moved f12.
	other := filepath.Join(b, "d")
	if err := os.WriteFile(filepath.Join(other, "new"), []byte("new"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(other, "new"), filepath.Join(other, "f10")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(other, "f11")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(b, "d2", "f12")); err != nil {
		t.Fatal(err)
	}
	// The other mount answers its unlink at once and sends it behind (it
	// holds no lease there: the directory was just contended); an fsync of
	// the directory makes it durable, as an application would to publish.
	for _, d := range []string{other, filepath.Join(b, "d2")} {
		od, err := os.Open(d)
		if err != nil {
			t.Fatal(err)
		}
		if err := od.Sync(); err != nil {
			t.Fatal(err)
		}
		od.Close()
	}
	if data, err := os.ReadFile(name(10)); err != nil || string(data) != "new" {
		t.Errorf("a file replaced by another mount reads here as %q, %v", data, err)
	}
	if _, err := os.Stat(name(11)); !os.IsNotExist(err) {
		t.Errorf("a file removed by another mount: stat here: %v", err)
	}
	if _, err := os.Stat(filepath.Join(d2, "f12")); !os.IsNotExist(err) {
		t.Errorf("a file moved here and removed by another mount: stat here: %v", err)
	}
	if data, err := os.ReadFile(name(13)); err != nil || string(data) != "old" {
		t.Errorf("an untouched file reads as %q, %v", data, err)
	}
}

// TestSmallFilesCommitBehind: a small file rewritten after its close, under
// the directory's lease, is committed behind — its commit queued after its
// create, in the batch the linger sends — and another mount reads every
// byte, its lookups recalling the lease while such commits may be queued.
func TestSmallFilesCommitBehind(t *testing.T) {
	c := fstest.Start(t, fstest.Options{Linger: time.Hour, Layout: stripe.Layout{K: 4, M: 2, Unit: 64 << 10, Inline: 4096}})
	behind := c.Engine.Stats().InlineBehind.Load()
	want := map[string][]byte{}
	for i := range 10 {
		name := fmt.Sprintf("f%d", i)
		p := filepath.Join(c.Dir, name)
		want[name] = bytes.Repeat([]byte{byte('a' + i)}, 100+i)
		if err := os.WriteFile(p, want[name], 0o644); err != nil {
			t.Fatal(err)
		}
		// Its data rode the create; what is appended after the close
		// needs a commit of its own.
		appendMore(t, p)
		want[name] = append(want[name], "more"...)
	}
	if n := c.Engine.Stats().InlineBehind.Load() - behind; n == 0 {
		t.Error("no inline commit went behind")
	}
	b, _ := c.Mount(t)
	for name, data := range want {
		got, err := os.ReadFile(filepath.Join(b, name))
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("%s through the other mount: %q, %v; want %q", name, got, err, data)
		}
	}
}

// appendMore appends "more" to the file at p and closes it.
func appendMore(t *testing.T, p string) {
	t.Helper()
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte("more")); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}
