package e2e

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/rdmafs/rdmafs/internal/devcluster"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// The tree TestSnapshotTree snapshots: five big files, snapSmallFiles small
// ones in a few directories, a hard link and a symbolic link; about 256 MiB.
// The writer rewrites the hot ones during the snapshot, within two stripes
// of each ([from, to) : the last two of hot1, the short one included, and
// the first two of hot2), so that the copy-on-write the snapshot causes is
// at most four stripes however many writes overlap it; writes across the
// boundary of the two stripes are as likely as not.
var snapBigFiles = []struct {
	name     string
	size     int
	hot      bool
	from, to int
}{
	{"big/hot1", 40<<20 + 12345, true, 36 << 20, 40<<20 + 12345},
	{"big/hot2", 64 << 20, true, 0, 8 << 20},
	{"big/b3", 64<<20 - 1, false, 0, 0},
	{"big/b4", 48 << 20, false, 0, 0},
	{"big/b5", 32<<20 + 777, false, 0, 0},
}

const (
	snapSmallFiles = 200
	snapBlock      = 1 << 20 // the hot files' writes, and the blocks their states are hashed by
)

// The cluster's default layout (devcluster): 4+2, 1 MiB units.
const (
	snapStripe    = 4 << 20 // file bytes per stripe
	snapStripeRaw = 6 << 20 // what a whole stripe takes on the chunkservers
)

// TestSnapshotTree snapshots a 256 MiB tree through the mount with
// `rdmafs snapshot` while a writer rewrites two of its files (1 MiB at a
// random offset, fsync after each), and checks:
//   - dst lists src's entries with their modes, owners, extended attributes
//     and file times, the hard link one file of two links, the symlink's
//     target; the files not written are byte-exact copies;
//   - each hot file's copy is one whole state the writer left during the
//     snapshot (every write fsynced before it began, none begun after it
//     ended), not a mix of two; src holds the writer's last state;
//   - the snapshot adds to the chunkservers only the stripes the writer
//     rewrote while it ran (well under 10% of the tree); writes to either
//     side leave the other alone; status counts the shared bytes;
//   - everything reads back the same after a remount; the metadata checks;
//   - with the trash turned off (rdmafs config set trash-days 0), src
//     removed with rm -rf leaves dst intact, and once dst is removed with
//     rdmafs rmr the chunkservers give back all the space.
func TestSnapshotTree(t *testing.T) {
	needRoot(t)
	// The trash on, as rdmafs format leaves it: the removals at the end
	// turn it off first.
	c := upWith(t, func(cfg *devcluster.Config) { cfg.Transport, cfg.TrashDays = "tcp", "1" })
	base := snapSettledUsed(t, c, "empty file system")

	// The tree.
	src := filepath.Join(c.MountPoint, "src")
	dst := filepath.Join(c.MountPoint, "dst")
	tree := snapWriteTree(t, src)
	varyOwnersAndTimes(t, src)
	for _, p := range []string{src, filepath.Join(src, "small/a"), filepath.Join(src, tree.hard[0]), filepath.Join(src, "big/b4")} {
		if err := unix.Setxattr(p, "user.snap", []byte("x:"+p), 0); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("tree written: %d files (%d MiB), %d directories, a hard link and a symlink",
		len(tree.sums)+len(tree.hot), tree.bytes>>20, len(tree.dirs))
	before := snapSettledUsed(t, c, "tree written")
	treeRaw := before.sum - base.sum
	t.Logf("the chunkservers hold %d MiB for the tree", treeRaw>>20)

	// The writer rewrites the hot files.
	w := startSnapWriter(t, src, tree.hot)
	defer w.stop(t)
	if !w.done.wait(3, time.Minute) {
		t.Fatalf("the writer did not get going: %v", w.errs())
	}

	// The snapshot, with the writer going.
	start := time.Now()
	out, err := rdmafs(t, "snapshot", src, dst)
	end := time.Now()
	if err != nil {
		t.Fatalf("rdmafs snapshot: %v\n%s", err, out)
	}
	took := end.Sub(start)
	wantFiles := len(tree.sums) + len(tree.hot) + 1 // the symlink too; the hard link is one inode
	t.Logf("rdmafs snapshot of %d MiB (%d files, %d directories) with the writer going: %v\n%s",
		tree.bytes>>20, wantFiles, len(tree.dirs), took.Round(time.Millisecond), strings.TrimSpace(out))
	if m := regexp.MustCompile(`: (\d+) files, (\d+) directories`).FindStringSubmatch(out); m == nil ||
		m[1] != strconv.Itoa(wantFiles) || m[2] != strconv.Itoa(len(tree.dirs)) {
		t.Errorf("rdmafs snapshot reports %q, want %d files and %d directories", out, wantFiles, len(tree.dirs))
	}

	// The writer pauses while the space is measured: what the snapshot
	// added is the stripes the writer rewrote since the snapshot began
	// (their old versions stay for the copy), nothing for the rest.
	during, touched, after := func() (int, int, snapUsed) {
		w.mu.Lock()
		defer w.mu.Unlock()
		during, touched := w.since(start)
		return during, touched, snapSettledUsed(t, c, "after the snapshot")
	}()
	growth := after.sum - before.sum
	// One stripe more than those written since the snapshot began: the
	// write in flight when it began is timed by its fsync, and may have
	// been committed after the copy of its file.
	bound := int64(touched+1)*snapStripeRaw + int64(len(c.Chunk))<<20
	t.Logf("space: %d MiB before the snapshot, %d MiB after (%+.1f MiB); the writer fsynced %d writes since the snapshot began, in %d stripes (at most %d MiB)",
		before.sum>>20, after.sum>>20, float64(growth)/(1<<20), during, touched, bound>>20)
	if growth > bound {
		t.Errorf("the snapshot grew the chunkservers by %d bytes, more than the %d stripes rewritten since it began account for (%d bytes)", growth, touched, bound)
	}
	if growth > treeRaw/10 {
		t.Errorf("the snapshot grew the chunkservers by %d MiB, %.1f%% of the tree's %d MiB: it copied data", growth>>20, 100*float64(growth)/float64(treeRaw), treeRaw>>20)
	}
	n := w.done.load()
	if !w.done.wait(n+5, time.Minute) {
		t.Fatalf("the writer stalled after the snapshot: %v", w.errs())
	}
	w.stop(t)

	states := snapCheckCopy(t, tree, src, dst, start, end)
	snapCheckSource(t, tree, src)
	st := snapStatus(t, c)
	t.Logf("status: %d MiB in stripes shared with a snapshot (each side counted), %d MiB unshared", st.SharedBytes>>20, st.UniqueBytes>>20)
	if st.SharedBytes < uint64(tree.bytes) {
		t.Errorf("status reports %d bytes shared with a snapshot, want at least the tree's %d", st.SharedBytes, tree.bytes)
	}
	snapAdminCheck(t, c, "after the snapshot")

	// Writes to the copy leave the source alone too.
	b3 := snapBigFiles[2].name
	fresh := pattern(snapBlock, 99)
	snapOverwrite(t, filepath.Join(dst, b3), fresh, 8<<20)
	if got := fileSum(t, filepath.Join(src, b3)); got != tree.sums[b3] {
		t.Fatalf("src/%s changed after a write to dst/%s", b3, b3)
	}
	dstSums := maps.Clone(tree.sums)
	dstSums[b3] = snapPatchedSum(t, filepath.Join(dst, b3), tree.sizes[b3], fresh, 8<<20)

	// Both trees after a remount.
	if err := c.Unmount(); err != nil {
		t.Fatal(err)
	}
	if err := c.Remount(t.Context()); err != nil {
		t.Fatal(err)
	}
	snapCheckContents(t, "src after the remount", src, tree, tree.sums, func(h *snapHot) [32]byte { return h.states[len(h.states)-1] })
	snapCheckContents(t, "dst after the remount", dst, tree, dstSums, func(h *snapHot) [32]byte { return states[h.name] })

	// Both removed: src with rm -rf, dst with rdmafs rmr, the trash
	// (which would keep deleted files a day) turned off first.
	if out, err := rdmafsOn(t, c, "config", "set", c.MetaAddr, "trash-days", "0"); err != nil {
		t.Fatalf("rdmafs config set trash-days 0: %v\n%s", err, out)
	}
	if st := snapStatus(t, c); st.TrashSeconds != 0 {
		t.Fatalf("status reports trash_seconds %d after rdmafs config set trash-days 0", st.TrashSeconds)
	}
	run(t, "", "rm", "-rf", src)
	// The chunk versions the copy shares stay: once the chunkservers
	// deleted what src alone held, dst reads back the same.
	gone := snapSettledUsed(t, c, "src removed")
	t.Logf("src removed: the chunkservers hold %d MiB (%d MiB right after the snapshot)", gone.sum>>20, after.sum>>20)
	snapCheckContents(t, "dst after src was removed", dst, tree, dstSums, func(h *snapHot) [32]byte { return states[h.name] })
	if gone.sum < treeRaw-int64(len(c.Chunk))<<20 {
		t.Errorf("with src removed the chunkservers hold %d bytes, less than dst needs (%d)", gone.sum, treeRaw)
	}
	rmStart := time.Now()
	if out, err := rdmafs(t, "rmr", dst); err != nil {
		t.Fatalf("rdmafs rmr %s: %v\n%s", dst, err, out)
	}
	t.Logf("rdmafs rmr of the snapshot: %v", time.Since(rmStart).Round(time.Millisecond))
	for _, p := range []string{src, dst, filepath.Join(dst, b3)} {
		if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s after its removal: %v, want ENOENT", p, err)
		}
	}

	// All the space comes back.
	snapWaitSpace(t, c, base, 4<<20)
	if st := snapStatus(t, c); st.TrashFiles != 0 || st.SharedBytes != 0 || st.UniqueBytes != 0 {
		t.Errorf("after both trees went, status reports %d files (%d bytes) in the trash, %d bytes shared and %d unshared",
			st.TrashFiles, st.TrashBytes, st.SharedBytes, st.UniqueBytes)
	}
	snapAdminCheck(t, c, "after the removals")
}

// snapAdminCheck runs rdmafs admin check: the metadata must be consistent.
func snapAdminCheck(t *testing.T, c *devcluster.Cluster, what string) {
	t.Helper()
	if out, err := rdmafsOn(t, c, "admin", "check", c.MetaAddr); err != nil || !strings.Contains(out, "no problems") {
		t.Fatalf("%s: rdmafs admin check: %v\n%s", what, err, out)
	}
}

// snapTree is what snapWriteTree wrote.
type snapTree struct {
	sums  map[string][32]byte // every regular file but the hot ones, by path in the tree
	sizes map[string]int
	hot   []*snapHot
	dirs  []string          // every directory, the root ("") included
	links map[string]string // symlink → target
	hard  [2]string         // two names of one file
	bytes int64
}

// snapWriteTree writes the tree at root.
func snapWriteTree(t *testing.T, root string) *snapTree {
	t.Helper()
	tr := &snapTree{sums: map[string][32]byte{}, sizes: map[string]int{}, links: map[string]string{}, dirs: []string{""}}
	mkdir := func(rel string) {
		if err := os.Mkdir(filepath.Join(root, rel), 0o755); err != nil {
			t.Fatal(err)
		}
		if rel != "" {
			tr.dirs = append(tr.dirs, rel)
		}
	}
	write := func(rel string, data []byte) {
		if err := os.WriteFile(filepath.Join(root, rel), data, 0o644); err != nil {
			t.Fatal(err)
		}
		tr.sizes[rel] = len(data)
		tr.bytes += int64(len(data))
	}
	mkdir("")
	mkdir("big")
	for i, f := range snapBigFiles {
		data := make([]byte, f.size)
		rand.NewChaCha8([32]byte{byte(i), 's'}).Read(data)
		write(f.name, data)
		if f.hot {
			h := newSnapHot(f.name, data)
			h.from, h.to = f.from, f.to
			tr.hot = append(tr.hot, h)
		} else {
			tr.sums[f.name] = sha256.Sum256(data)
		}
	}
	// The tree grows with cold files of 64 MiB to about 1 GiB, or to
	// RDMAFS_SNAPSHOT_TREE_MIB.
	mib := 1024
	if v, err := strconv.Atoi(os.Getenv("RDMAFS_SNAPSHOT_TREE_MIB")); err == nil {
		mib = v
	}
	if tr.bytes < int64(mib)<<20 {
		mkdir("more")
		for i := 0; tr.bytes < int64(mib)<<20; i++ {
			data := make([]byte, 64<<20)
			rand.NewChaCha8([32]byte{byte(i), 'm'}).Read(data)
			rel := fmt.Sprintf("more/m%02d", i)
			write(rel, data)
			tr.sums[rel] = sha256.Sum256(data)
		}
	}
	for _, d := range []string{"small", "small/a", "small/b", "small/a/deep", "small/a/deep/er", "links", "empty"} {
		mkdir(d)
	}
	sub := []string{"small", "small/a", "small/b", "small/a/deep", "small/a/deep/er"}
	r := rand.New(rand.NewPCG(1, 2))
	for i := range snapSmallFiles {
		rel := fmt.Sprintf("%s/f%03d", sub[i%len(sub)], i)
		n := r.IntN(128 << 10)
		if i%17 == 0 {
			n = 0
		}
		data := pattern(n, uint64(1000+i))
		write(rel, data)
		tr.sums[rel] = sha256.Sum256(data)
	}
	tr.hard = [2]string{"small/a/f001", "links/hard"}
	if err := os.Link(filepath.Join(root, tr.hard[0]), filepath.Join(root, tr.hard[1])); err != nil {
		t.Fatal(err)
	}
	tr.links["links/sym"] = "../big/b5"
	if err := os.Symlink("../big/b5", filepath.Join(root, "links/sym")); err != nil {
		t.Fatal(err)
	}
	return tr
}

// snapHot is a file the writer rewrites: its content now, and every state
// it has been in (the initial one first), each kept as snapStateSum of its
// bytes, with when the write that made it began and when its fsync returned.
type snapHot struct {
	name        string
	data        []byte
	blocks      [][32]byte // SHA-256 of each snapBlock of data
	states      [][32]byte
	stateBlocks [][][32]byte // blocks of each state, for the message of a failed check
	begun       []time.Time  // begun[j] and synced[j]: the write that made states[j+1]
	synced      []time.Time
	writes      [][2]int // its offset and length
	from, to    int      // the range the writer writes in
}

func newSnapHot(name string, data []byte) *snapHot {
	h := &snapHot{name: name, data: data}
	for off := 0; off < len(data); off += snapBlock {
		h.blocks = append(h.blocks, sha256.Sum256(data[off:min(off+snapBlock, len(data))]))
	}
	h.states = [][32]byte{snapStateSum(len(data), h.blocks)}
	h.stateBlocks = [][][32]byte{slices.Clone(h.blocks)}
	return h
}

// apply records a write of p at off, begun at begun and fsynced at synced.
func (h *snapHot) apply(p []byte, off int, begun, synced time.Time) {
	copy(h.data[off:], p)
	for b := off / snapBlock; b*snapBlock < off+len(p); b++ {
		h.blocks[b] = sha256.Sum256(h.data[b*snapBlock : min((b+1)*snapBlock, len(h.data))])
	}
	h.states = append(h.states, snapStateSum(len(h.data), h.blocks))
	h.stateBlocks = append(h.stateBlocks, slices.Clone(h.blocks))
	h.begun, h.synced = append(h.begun, begun), append(h.synced, synced)
	h.writes = append(h.writes, [2]int{off, len(p)})
}

// snapStateSum is a file's checksum from its size and the SHA-256 of each of
// its snapBlock blocks: a state of a hot file is one, and a write updates it
// without hashing the whole file again.
func snapStateSum(size int, blocks [][32]byte) [32]byte {
	h := sha256.New()
	binary.Write(h, binary.LittleEndian, int64(size))
	for _, b := range blocks {
		h.Write(b[:])
	}
	var out [32]byte
	h.Sum(out[:0])
	return out
}

// snapFileBlocks reads a file through the mount (its cached pages dropped
// first) and returns its size and the SHA-256 of each snapBlock.
func snapFileBlocks(t *testing.T, p string) (int, [][32]byte) {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		t.Fatal(err)
	}
	var blocks [][32]byte
	size := 0
	buf := make([]byte, snapBlock)
	for {
		n, err := io.ReadFull(f, buf)
		if n > 0 {
			blocks = append(blocks, sha256.Sum256(buf[:n]))
			size += n
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return size, blocks
		}
		if err != nil {
			t.Fatalf("read %s: %v", p, err)
		}
	}
}

// snapWriter rewrites the hot files: 1 MiB of random bytes at a random
// (page-aligned) offset of one of them (in its range from, to), then fsync,
// over and over. mu is held
// for each write and its fsync, so that a holder of mu pauses it. The
// offsets are page-aligned so that each write reaches the mount as one FUSE
// write (MaxWrite is 1 MiB; an unaligned 1 MiB write spans 257 pages, which
// the kernel sends as two): a snapshot may then hold the file as it was
// before or after the write, never half of it.
type snapWriter struct {
	mu    sync.Mutex
	hot   []*snapHot
	files []*os.File
	done  *progress // writes fsynced
	quit  atomic.Bool
	wg    sync.WaitGroup
	errMu sync.Mutex
	err   []error
}

func startSnapWriter(t *testing.T, root string, hot []*snapHot) *snapWriter {
	t.Helper()
	w := &snapWriter{hot: hot, done: newProgress()}
	for _, h := range hot {
		f, err := os.OpenFile(filepath.Join(root, h.name), os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		w.files = append(w.files, f)
	}
	w.wg.Go(func() {
		r := rand.New(rand.NewPCG(7, 8))
		bytes := rand.NewChaCha8([32]byte{7, 8})
		buf := make([]byte, snapBlock)
		for !w.quit.Load() {
			i := r.IntN(len(w.hot))
			h, f := w.hot[i], w.files[i]
			off := h.from + r.IntN((h.to-h.from-len(buf))/4096+1)*4096
			bytes.Read(buf)
			w.mu.Lock()
			begun := time.Now()
			_, err := f.WriteAt(buf, int64(off))
			if err == nil {
				err = f.Sync()
			}
			if err != nil {
				w.mu.Unlock()
				w.errMu.Lock()
				w.err = append(w.err, fmt.Errorf("%s: write of %d at %d: %w", h.name, len(buf), off, err))
				w.errMu.Unlock()
				w.done.fail()
				return
			}
			h.apply(buf, off, begun, time.Now())
			w.mu.Unlock()
			w.done.step()
		}
	})
	return w
}

func (w *snapWriter) errs() []error {
	w.errMu.Lock()
	defer w.errMu.Unlock()
	return slices.Clone(w.err)
}

// stop ends the writer (once; later calls only check it) and fails the test
// if a write failed.
func (w *snapWriter) stop(t *testing.T) {
	t.Helper()
	if !w.quit.Swap(true) {
		w.wg.Wait()
		for _, f := range w.files {
			if err := f.Close(); err != nil {
				t.Errorf("close: %v", err)
			}
		}
	}
	if errs := w.errs(); len(errs) > 0 {
		t.Fatalf("the writer failed: %v", errs)
	}
}

// since returns how many writes the writer fsynced after at (with mu held)
// and the number of distinct stripes they wrote.
func (w *snapWriter) since(at time.Time) (writes, stripes int) {
	touched := map[string]bool{}
	for _, h := range w.hot {
		for j, s := range h.synced {
			if s.Before(at) {
				continue
			}
			writes++
			off, n := h.writes[j][0], h.writes[j][1]
			for st := off / snapStripe; st*snapStripe < off+n; st++ {
				touched[fmt.Sprintf("%s/%d", h.name, st)] = true
			}
		}
	}
	return writes, len(touched)
}

// snapCheckCopy checks dst, the snapshot of src taken from start to end
// while the writer ran: the same entries, the files not written byte-exact,
// the hard link one file, the symlink's target, and each hot file one whole
// state the writer left during the snapshot: at least every write fsynced
// before it began, none begun after it ended. It returns the checksum of
// the state each hot file's copy holds.
func snapCheckCopy(t *testing.T, tree *snapTree, src, dst string, start, end time.Time) map[string][32]byte {
	t.Helper()
	snapCheckEntries(t, tree, src, dst)
	snapCheckMetadata(t, tree, src, dst)
	states := map[string][32]byte{}
	for _, h := range tree.hot {
		lo := 0 // states[lo]: every write fsynced before the snapshot began
		for lo < len(h.synced) && h.synced[lo].Before(start) {
			lo++
		}
		hi := 0 // states[hi]: the last a write begun before its end made
		for hi < len(h.begun) && h.begun[hi].Before(end) {
			hi++
		}
		size, blocks := snapFileBlocks(t, filepath.Join(dst, h.name))
		got := snapStateSum(size, blocks)
		j := slices.Index(h.states, got)
		switch {
		case j >= lo && j <= hi:
			t.Logf("dst/%s holds the state after write %d of %d (%d fsynced before the snapshot began, %d begun before it ended: %d overlapped it)",
				h.name, j, len(h.states)-1, lo, hi, hi-lo)
		case j >= 0:
			t.Fatalf("dst/%s holds the state after write %d, outside the snapshot: %d writes were fsynced before it began, %d begun before it ended",
				h.name, j, lo, hi)
		default:
			t.Fatalf("dst/%s (%d bytes, want %d) is none of the %d states the writer left (%d writes fsynced before the snapshot began, %d begun before it ended): a mix. Its blocks that differ between states:\n%s",
				h.name, size, len(h.data), len(h.states), lo, hi, snapBlockOrigins(h, blocks))
		}
		states[h.name] = got
	}
	snapCheckContents(t, "dst", dst, tree, tree.sums, func(h *snapHot) [32]byte { return states[h.name] })
	return states
}

// snapBlockOrigins describes the blocks of a hot file's copy that are not
// the same in every state the writer left, for the message of a failed
// check: the states each equals (none: bytes the writer never wrote there).
func snapBlockOrigins(h *snapHot, blocks [][32]byte) string {
	var lines []string
	for b, sum := range blocks {
		var in []string
		varies := false
		for j, st := range h.stateBlocks {
			if b >= len(st) {
				continue
			}
			varies = varies || st[b] != h.stateBlocks[0][b]
			if st[b] == sum {
				in = append(in, strconv.Itoa(j))
			}
		}
		if varies || len(in) == 0 {
			lines = append(lines, fmt.Sprintf("  block %d: as in states [%s]", b, strings.Join(in, " ")))
		}
	}
	return strings.Join(lines, "\n")
}

// snapCheckSource checks src after the writer stopped: every file as
// written, the hot files in the writer's last state.
func snapCheckSource(t *testing.T, tree *snapTree, src string) {
	t.Helper()
	writes := 0
	for _, h := range tree.hot {
		writes += len(h.writes)
	}
	snapCheckContents(t, "src", src, tree, tree.sums, func(h *snapHot) [32]byte { return h.states[len(h.states)-1] })
	t.Logf("src holds the writer's last state after its %d writes", writes)
}

// snapCheckContents checks the bytes of every file below root: sums for the
// files not written, hot's result for each hot file, the hard link and the
// symlink.
func snapCheckContents(t *testing.T, what, root string, tree *snapTree, sums map[string][32]byte, hot func(*snapHot) [32]byte) {
	t.Helper()
	for rel, want := range sums {
		if got := fileSum(t, filepath.Join(root, rel)); got != want {
			t.Fatalf("%s: %s reads back different bytes (%d bytes written)", what, rel, tree.sizes[rel])
		}
	}
	for _, h := range tree.hot {
		size, blocks := snapFileBlocks(t, filepath.Join(root, h.name))
		if snapStateSum(size, blocks) != hot(h) {
			t.Fatalf("%s: %s (%d bytes) is not in the state it should be", what, h.name, size)
		}
	}
	if got := fileSum(t, filepath.Join(root, tree.hard[1])); got != sums[tree.hard[0]] {
		t.Fatalf("%s: the hard link %s reads back different bytes from %s", what, tree.hard[1], tree.hard[0])
	}
	for l, want := range tree.links {
		if got, err := os.Readlink(filepath.Join(root, l)); err != nil || got != want {
			t.Fatalf("%s: symlink %s: %q, %v (want %q)", what, l, got, err, want)
		}
	}
}

// snapCheckEntries checks that dst lists the entries src does, of the same
// types, and that its hard link is one file, not src's.
func snapCheckEntries(t *testing.T, tree *snapTree, src, dst string) {
	t.Helper()
	list := func(root string) []string {
		var out []string
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(root, p)
			out = append(out, fmt.Sprintf("%s %v", rel, d.Type()))
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		sort.Strings(out)
		return out
	}
	a, b := list(src), list(dst)
	if !slices.Equal(a, b) {
		t.Fatalf("dst has %d entries, src %d: they differ (first of dst: %q)", len(b), len(a), b[:min(len(b), 5)])
	}
	var s0, s1, d0, d1 unix.Stat_t
	for _, x := range []struct {
		p  string
		st *unix.Stat_t
	}{{filepath.Join(src, tree.hard[0]), &s0}, {filepath.Join(src, tree.hard[1]), &s1},
		{filepath.Join(dst, tree.hard[0]), &d0}, {filepath.Join(dst, tree.hard[1]), &d1}} {
		if err := unix.Lstat(x.p, x.st); err != nil {
			t.Fatal(err)
		}
	}
	if d0.Ino != d1.Ino || d0.Nlink != 2 || d0.Ino == s0.Ino || s0.Ino != s1.Ino {
		t.Fatalf("hard link: src inodes %d/%d, dst %d/%d with %d links: want one file of 2 links in dst, not src's",
			s0.Ino, s1.Ino, d0.Ino, d1.Ino, d0.Nlink)
	}
	t.Logf("dst lists the %d entries of src", len(a))
}

// snapCheckMetadata compares the mode, owner and extended attributes of
// every entry of dst with src's, and the modification time of every file and
// symlink the writer did not touch. Directories' modification times are
// only logged: the copy's directories take the time of the snapshot (each
// entry linked into them sets it), though the snapshot is documented to keep
// times.
func snapCheckMetadata(t *testing.T, tree *snapTree, src, dst string) {
	t.Helper()
	hot := map[string]bool{}
	for _, h := range tree.hot {
		hot[h.name] = true
	}
	var diffs []string
	n := 0
	err := filepath.WalkDir(src, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		var a, b unix.Stat_t
		if err := unix.Lstat(p, &a); err != nil {
			return err
		}
		if err := unix.Lstat(filepath.Join(dst, rel), &b); err != nil {
			return err
		}
		n++
		switch {
		case a.Mode != b.Mode || a.Uid != b.Uid || a.Gid != b.Gid:
			diffs = append(diffs, fmt.Sprintf("%s: mode %o/%o owner %d:%d/%d:%d", rel, a.Mode, b.Mode, a.Uid, a.Gid, b.Uid, b.Gid))
		case !hot[rel] && a.Mtim != b.Mtim:
			diffs = append(diffs, fmt.Sprintf("%s: mtime %d.%09d/%d.%09d", rel, a.Mtim.Sec, a.Mtim.Nsec, b.Mtim.Sec, b.Mtim.Nsec))
		}
		if a.Mode&unix.S_IFMT != unix.S_IFLNK {
			buf := make([]byte, 256)
			m, errA := unix.Getxattr(p, "user.snap", buf)
			want := string(buf[:max(m, 0)])
			m, errB := unix.Getxattr(filepath.Join(dst, rel), "user.snap", buf)
			if got := string(buf[:max(m, 0)]); (errA == nil) != (errB == nil) || got != want {
				diffs = append(diffs, fmt.Sprintf("%s: xattr user.snap %q (%v), want %q (%v)", rel, got, errB, want, errA))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(diffs) > 0 {
		t.Fatalf("%d of %d entries of dst differ from src (src/dst), first ones:\n%s", len(diffs), n, strings.Join(diffs[:min(len(diffs), 10)], "\n"))
	}
	t.Logf("dst keeps the modes, owners, extended attributes and times (directories' too) of src's %d entries", n)
}

// snapOverwrite writes p at off of the file at path and fsyncs it.
func snapOverwrite(t *testing.T, path string, p []byte, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(p, off); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// snapPatchedSum checks that the file at path (size bytes) reads back with p
// at off and returns its SHA-256.
func snapPatchedSum(t *testing.T, path string, size int, p []byte, off int) [32]byte {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != size || string(got[off:off+len(p)]) != string(p) {
		t.Fatalf("%s after a write of %d bytes at %d: %d bytes, the write's bytes not there", path, len(p), off, len(got))
	}
	return sha256.Sum256(got)
}

// snapUsed is the space the chunkservers report using (status's used), by
// chunkserver id, and its sum.
type snapUsed struct {
	sum int64
	per map[string]int64
}

// snapStatus runs `rdmafs status --json` against c.
func snapStatus(t *testing.T, c *devcluster.Cluster) *metapb.StatusReply {
	t.Helper()
	out, err := rdmafsOn(t, c, "status", c.MetaAddr, "--json")
	if err != nil {
		t.Fatalf("rdmafs status --json: %v\n%s", err, out)
	}
	st := &metapb.StatusReply{}
	if err := protojson.Unmarshal([]byte(out), st); err != nil {
		t.Fatalf("rdmafs status --json: %v\n%s", err, out)
	}
	return st
}

func snapUsedOf(st *metapb.StatusReply) snapUsed {
	u := snapUsed{per: map[string]int64{}}
	for _, cs := range st.Chunkservers {
		u.per[cs.Id] = int64(cs.Used)
		u.sum += int64(cs.Used)
	}
	return u
}

// snapSettledUsed waits until no chunk delete is pending and every
// chunkserver reported the same space in two heartbeats after that, and
// returns it.
func snapSettledUsed(t *testing.T, c *devcluster.Cluster, what string) snapUsed {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	var last snapUsed
	var lastAt time.Time
	for {
		st := snapStatus(t, c)
		u := snapUsedOf(st)
		oldest := int64(0)
		for _, cs := range st.Chunkservers {
			if oldest == 0 || cs.LastHeartbeatNs < oldest {
				oldest = cs.LastHeartbeatNs
			}
		}
		switch {
		case st.PendingDeletes > 0 || st.ChunkserversUp() != len(c.Chunk):
			lastAt = time.Time{}
		case lastAt.IsZero() || !maps.Equal(u.per, last.per):
			last, lastAt = u, time.Now()
		case time.Unix(0, oldest).After(lastAt.Add(time.Second)): // two heartbeats (500ms) since
			return u
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: the space used did not settle in a minute: %d pending deletes, %d of %d chunkservers up, used %v",
				what, st.PendingDeletes, st.ChunkserversUp(), len(c.Chunk), u.per)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// snapWaitSpace waits until no chunk delete is pending and every
// chunkserver uses at most slack bytes more than in base.
func snapWaitSpace(t *testing.T, c *devcluster.Cluster, base snapUsed, slack int64) {
	t.Helper()
	start := time.Now()
	deadline := start.Add(time.Minute)
	for {
		st := snapStatus(t, c)
		u := snapUsedOf(st)
		var over []string
		for id, b := range base.per {
			if u.per[id] > b+slack {
				over = append(over, fmt.Sprintf("%s: %d bytes (%d before)", id, u.per[id], b))
			}
		}
		if st.PendingDeletes == 0 && len(over) == 0 {
			t.Logf("space back after %v: %d MiB used (%d MiB on the empty file system)", time.Since(start).Round(time.Millisecond), u.sum>>20, base.sum>>20)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("space not given back a minute after the removal: %d chunk deletes pending; over %d MiB more than before: %s",
				st.PendingDeletes, slack>>20, strings.Join(over, "; "))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestRmrLargeTree removes 20,000 empty files in 20 directories with
// `rdmafs rmr` through the mount, timed: the tree is gone, also for a look-up
// of one of its files, and meta counts none of its inodes.
func TestRmrLargeTree(t *testing.T) {
	needRoot(t)
	c := upWith(t, func(cfg *devcluster.Config) { cfg.Transport = "tcp" })
	const dirs, perDir = 20, 1000
	root := filepath.Join(c.MountPoint, "many")
	empty := snapStatus(t, c)
	for d := range dirs {
		if err := os.MkdirAll(filepath.Join(root, fmt.Sprintf("d%02d", d)), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, dirs)
	for d := range dirs {
		wg.Go(func() {
			for i := range perDir {
				f, err := os.Create(filepath.Join(root, fmt.Sprintf("d%02d", d), fmt.Sprintf("f%04d", i)))
				if err == nil {
					err = f.Close()
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("%d files created through the mount in %v", dirs*perDir, time.Since(start).Round(time.Millisecond))
	// The mount may answer creates before meta has them (it creates ahead
	// under its directory leases): meta counts them soon after.
	for deadline := time.Now().Add(30 * time.Second); ; {
		st := snapStatus(t, c)
		files, ds := st.Files-empty.Files, st.Directories-empty.Directories
		if files == dirs*perDir && ds == dirs+1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("meta counts %d more files and %d more directories after the creates, want %d and %d", files, ds, dirs*perDir, dirs+1)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// A file looked up just before, so the kernel holds its entry.
	probe := filepath.Join(root, "d07", "f0500")
	if _, err := os.Lstat(probe); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	out, err := rdmafs(t, "rmr", root)
	took := time.Since(start)
	if err != nil {
		t.Fatalf("rdmafs rmr: %v\n%s", err, out)
	}
	t.Logf("rdmafs rmr of %d files in %d directories: %v, %.0f files/s (%s)", dirs*perDir, dirs, took.Round(time.Millisecond),
		float64(dirs*perDir)/took.Seconds(), strings.TrimSpace(out))
	for _, p := range []string{root, probe, filepath.Join(root, "d07")} {
		if _, err := os.Lstat(p); !errors.Is(err, syscall.ENOENT) {
			t.Errorf("lstat %s after rmr: %v, want ENOENT", p, err)
		}
	}
	ents, err := os.ReadDir(c.MountPoint)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.Name() == "many" {
			t.Errorf("the mount's root still lists %q after rmr", e.Name())
		}
	}
	if st := snapStatus(t, c); st.Files != empty.Files || st.Directories != empty.Directories {
		t.Errorf("after rmr meta counts %d files and %d directories, want %d and %d, as before the tree", st.Files, st.Directories,
			empty.Files, empty.Directories)
	}
}
