package posixcheck

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Limits of the random operations.
const (
	maxSize     = 4 << 20   // offsets and sizes keep the file within this
	maxIO       = 300 << 10 // the largest single read, write, copy or mapping
	srcSize     = 1 << 20   // the scratch file copy_file_range copies from
	ringLen     = 20        // operations kept for the diagnostic
	verifyEvery = 100       // whole-file comparison interval, in operations
	stripe      = 256 << 10 // fstest's default layout: 4 units of 64 KiB
)

// opKind is one kind of random operation.
type opKind int

const (
	opWrite opKind = iota
	opRead
	opMmapWrite
	opMmapRead
	opTruncate
	opFalloc
	opFallocKeep
	opPunch
	opCopy
	opFsync
	opFdatasync
	opReopen
	opReopenTrunc
	opVerify // not drawn: the periodic whole-file comparison
	numKinds
)

var kindNames = [numKinds]string{
	opWrite:       "pwrite",
	opRead:        "pread",
	opMmapWrite:   "mmap-write",
	opMmapRead:    "mmap-read",
	opTruncate:    "ftruncate",
	opFalloc:      "fallocate(0)",
	opFallocKeep:  "fallocate(KEEP_SIZE)",
	opPunch:       "fallocate(PUNCH_HOLE|KEEP_SIZE)",
	opCopy:        "copy_file_range",
	opFsync:       "fsync",
	opFdatasync:   "fdatasync",
	opReopen:      "close+open",
	opReopenTrunc: "close+open(O_TRUNC)",
	opVerify:      "verify",
}

func (k opKind) String() string { return kindNames[k] }

// weights, in thousandths, of the operations drawn; mmap ones only where the
// variant maps the file.
var weights = [numKinds]int{
	opWrite:       240,
	opRead:        180,
	opMmapWrite:   70,
	opMmapRead:    60,
	opTruncate:    50,
	opFalloc:      35,
	opFallocKeep:  25,
	opPunch:       35,
	opCopy:        60,
	opFsync:       20,
	opFdatasync:   20,
	opReopen:      20,
	opReopenTrunc: 4,
}

// op is one operation as run, with its parameters, for the diagnostic.
type op struct {
	idx    int
	kind   opKind
	off, n int64  // file range (size for ftruncate)
	aux    int64  // copy_file_range: the source offset; mmap: the mapping offset
	size   int64  // the model's size before the operation
	note   string // flags, results
}

func (o op) String() string {
	s := fmt.Sprintf("#%d %s", o.idx, o.kind)
	switch o.kind {
	case opWrite, opRead, opFalloc, opFallocKeep, opPunch:
		s += fmt.Sprintf(" off=%d len=%d", o.off, o.n)
	case opMmapWrite, opMmapRead:
		s += fmt.Sprintf(" off=%d len=%d (mapped at %d)", o.off, o.n, o.aux)
	case opCopy:
		s += fmt.Sprintf(" src_off=%d dst_off=%d len=%d", o.aux, o.off, o.n)
	case opTruncate:
		s += fmt.Sprintf(" size=%d", o.n)
	}
	s += fmt.Sprintf(" [size before %d]", o.size)
	if o.note != "" {
		s += " " + o.note
	}
	return s
}

// variant is one way of running the checker.
type variant struct {
	name string
	mmap bool // mmap reads and writes
	// other, when set, is a second view of the directory (another mount):
	// at every whole-file comparison the file is closed, read whole there
	// and reopened.
	other bool
}

// variants are the subtests, in the order the operation count is split over.
var variants = []variant{
	{name: "one-mount"},
	{name: "one-mount-mmap", mmap: true},
	{name: "two-mounts", mmap: true, other: true},
}

// checker runs random operations on one file and compares them with a model.
type checker struct {
	t       testing.TB
	v       variant
	seed    uint64
	dir     string
	other   string // directory where the file is read for close-to-open checks
	name    string
	path    string
	r       *rand.Rand
	fd      int
	srcFd   int
	mm      *mmapHelper // the process that maps the file (mmap variants)
	diffAt  int64       // the first differing offset of a failed comparison, or -1
	src     []byte      // the scratch file's bytes
	model   []byte
	ring    [ringLen]op
	nring   int
	cur     op
	pageSz  int64
	unsupp  map[opKind]bool
	counts  [numKinds]int
	maxSeen int
	repro   func(seed uint64, nops int) string
}

// runChecker runs n random operations with the given seed on a new file in
// dir; other is the directory to read it from for close-to-open checks (the
// same file system seen by a second mount), used when v.other is set. repro,
// when set, tells how to run the first nops operations of a seed again.
func runChecker(t testing.TB, v variant, seed uint64, n int, dir, other string, repro func(seed uint64, nops int) string) {
	t.Helper()
	c := &checker{
		t: t, v: v, seed: seed, dir: dir, other: other,
		name:   fmt.Sprintf("posixcheck-%s-%d", v.name, seed),
		r:      rand.New(rand.NewPCG(seed, variantStream(v.name))),
		fd:     -1,
		srcFd:  -1,
		diffAt: -1,
		pageSz: int64(os.Getpagesize()),
		unsupp: map[opKind]bool{},
		repro:  repro,
	}
	c.path = filepath.Join(dir, c.name)
	defer c.closeAll()
	start := time.Now()
	c.setup()
	for i := 0; i < n; i++ {
		c.step(i)
		if (i+1)%verifyEvery == 0 || i == n-1 {
			c.verify(i)
		}
	}
	var parts []string
	for k := range opVerify + 1 {
		if c.counts[k] > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", opKind(k), c.counts[k]))
		}
	}
	t.Logf("seed %d: %d operations in %v, final size %d, largest %d; %s",
		seed, n, time.Since(start).Round(time.Millisecond), len(c.model), c.maxSeen, strings.Join(parts, ", "))
}

// variantStream gives each variant a random stream of its own for a seed.
func variantStream(name string) uint64 {
	var h uint64 = 14695981039346656037
	for i := 0; i < len(name); i++ {
		h = (h ^ uint64(name[i])) * 1099511628211
	}
	return h
}

// closeAll ends the helper and closes the descriptors (on failure too).
func (c *checker) closeAll() {
	if c.mm != nil {
		c.mm.stop()
		c.mm = nil
	}
	if c.fd >= 0 {
		unix.Close(c.fd)
		c.fd = -1
	}
	if c.srcFd >= 0 {
		unix.Close(c.srcFd)
		c.srcFd = -1
	}
}

// setup creates the file, empty, and the scratch file copy_file_range reads,
// both through the file system under test.
func (c *checker) setup() {
	c.cur = op{idx: -1, kind: opReopenTrunc, note: "setup"}
	src := filepath.Join(c.dir, c.name+".src")
	fd, err := unix.Open(src, unix.O_RDWR|unix.O_CREAT|unix.O_TRUNC|unix.O_CLOEXEC, 0o644)
	if err != nil {
		c.failf("create %s: %v", src, err)
	}
	c.srcFd = fd
	c.src = make([]byte, srcSize)
	c.fill(c.src)
	if n, err := unix.Pwrite(fd, c.src, 0); err != nil || n != len(c.src) {
		c.failf("writing the scratch file: %d, %v", n, err)
	}
	if err := unix.Fsync(fd); err != nil {
		c.failf("fsync of the scratch file: %v", err)
	}
	if c.v.mmap {
		if c.mm, err = startHelper(); err != nil {
			c.failf("starting the mmap helper: %v", err)
		}
	}
	c.open(unix.O_CREAT | unix.O_TRUNC)
	c.model = c.model[:0]
	c.checkSize()
}

func (c *checker) open(flags int) {
	fd, err := unix.Open(c.path, unix.O_RDWR|unix.O_CLOEXEC|flags, 0o644)
	if err != nil {
		c.failf("open %s: %v", c.path, err)
	}
	c.fd = fd
}

func (c *checker) close() {
	if c.mm != nil {
		if err := c.mm.release(); err != nil {
			c.failf("mmap helper: closing its descriptor: %v", err)
		}
	}
	err := unix.Close(c.fd)
	c.fd = -1
	if err != nil {
		c.failf("close: %v", err)
	}
}

// fill fills b with random bytes.
func (c *checker) fill(b []byte) {
	for i := 0; i < len(b); i += 8 {
		v := c.r.Uint64()
		for j := i; j < min(i+8, len(b)); j++ {
			b[j] = byte(v)
			v >>= 8
		}
	}
}

// ioSize draws an I/O size from 1 byte to maxIO, mostly small.
func (c *checker) ioSize() int64 {
	switch p := c.r.IntN(100); {
	case p < 40:
		return 1 + c.r.Int64N(4096)
	case p < 55: // whole pages
		return c.pageSz * (1 + c.r.Int64N(16))
	case p < 85:
		return 1 + c.r.Int64N(64<<10)
	default:
		return 1 + c.r.Int64N(maxIO)
	}
}

// offset draws a file offset, mostly within [0, 1.5×size + 64 KiB], with a
// bias to the end of the file and to page and stripe boundaries.
func (c *checker) offset() int64 {
	size := int64(len(c.model))
	limit := min(size+size/2+64<<10, maxSize)
	var off int64
	switch p := c.r.IntN(100); {
	case p < 55:
		off = c.r.Int64N(limit + 1)
	case p < 70: // around the end of the file
		off = size + c.r.Int64N(16<<10) - 8<<10
	case p < 85: // a page boundary, or just off one
		off = c.r.Int64N(limit/c.pageSz+1)*c.pageSz + c.r.Int64N(3) - 1
	default: // a stripe boundary, or near one
		off = c.r.Int64N(limit/stripe+1)*stripe + c.r.Int64N(8<<10) - 4<<10
	}
	return max(0, min(off, maxSize-1))
}

// ioRange draws an offset and a size that keep the file within maxSize.
func (c *checker) ioRange() (int64, int64) {
	off, n := c.offset(), c.ioSize()
	if off+n > maxSize {
		n = maxSize - off
	}
	return off, n
}

func (c *checker) pick() opKind {
	total := 0
	for k := range opVerify {
		total += c.weight(opKind(k))
	}
	x := c.r.IntN(total)
	for k := range opVerify {
		if x -= c.weight(opKind(k)); x < 0 {
			return opKind(k)
		}
	}
	panic("unreachable")
}

func (c *checker) weight(k opKind) int {
	if c.unsupp[k] {
		return 0
	}
	if (k == opMmapWrite || k == opMmapRead) && (!c.v.mmap || len(c.model) == 0) {
		return 0
	}
	return weights[k]
}

// step runs operation i and checks the size after it.
func (c *checker) step(i int) {
	k := c.pick()
	c.cur = op{idx: i, kind: k, size: int64(len(c.model))}
	c.counts[k]++
	switch k {
	case opWrite:
		c.doWrite()
	case opRead:
		c.doRead()
	case opMmapWrite, opMmapRead:
		c.doMmap(k == opMmapWrite)
	case opTruncate:
		c.doTruncate()
	case opFalloc, opFallocKeep, opPunch:
		c.doFallocate(k)
	case opCopy:
		c.doCopy()
	case opFsync:
		c.record()
		if err := unix.Fsync(c.fd); err != nil {
			c.failf("fsync: %v", err)
		}
	case opFdatasync:
		c.record()
		if err := unix.Fdatasync(c.fd); err != nil {
			c.failf("fdatasync: %v", err)
		}
	case opReopen, opReopenTrunc:
		c.record()
		c.close()
		if k == opReopenTrunc {
			c.open(unix.O_TRUNC)
			c.model = c.model[:0]
		} else {
			c.open(0)
		}
	}
	c.maxSeen = max(c.maxSeen, len(c.model))
	c.checkSize()
}

// record puts the current operation in the ring of recent ones.
func (c *checker) record() {
	c.ring[c.nring%ringLen] = c.cur
	c.nring++
}

// resize sets the model's size, zero-filling what it grows by.
func (c *checker) resize(n int64) {
	if n <= int64(len(c.model)) {
		c.model = c.model[:n]
		return
	}
	old := len(c.model)
	if int64(cap(c.model)) >= n {
		c.model = c.model[:n]
		clear(c.model[old:])
		return
	}
	m := make([]byte, n, max(n, maxSize))
	copy(m, c.model)
	c.model = m
}

func (c *checker) modelWrite(b []byte, off int64) {
	if end := off + int64(len(b)); end > int64(len(c.model)) {
		c.resize(end)
	}
	copy(c.model[off:], b)
}

func (c *checker) doWrite() {
	off, n := c.ioRange()
	c.cur.off, c.cur.n = off, n
	c.record()
	b := make([]byte, n)
	c.fill(b)
	got, err := unix.Pwrite(c.fd, b, off)
	if err != nil || int64(got) != n {
		c.failf("pwrite of %d bytes at %d returned %d, %v; want %d", n, off, got, err, n)
	}
	c.modelWrite(b, off)
}

func (c *checker) doRead() {
	off, n := c.ioRange()
	if c.r.IntN(10) == 0 { // sometimes entirely past the end
		off = int64(len(c.model)) + c.r.Int64N(64<<10)
	}
	c.cur.off, c.cur.n = off, n
	c.record()
	b := make([]byte, n)
	got, err := unix.Pread(c.fd, b, off)
	if err != nil {
		c.failf("pread of %d bytes at %d: %v", n, off, err)
	}
	size := int64(len(c.model))
	want := c.model[min(off, size):min(off+n, size)]
	if got != len(want) {
		c.failf("pread of %d bytes at %d returned %d bytes, the model %d", n, off, got, len(want))
	}
	c.compare("pread", b[:got], want, off)
}

// doMmap maps a range within the file's size (the mapping offset page
// aligned) and writes random bytes into it or compares it with the model,
// then unmaps it; msync(MS_SYNC) follows half the writes. The helper process
// does the mapping, on a duplicate of the checker's descriptor.
func (c *checker) doMmap(write bool) {
	size := int64(len(c.model))
	off := c.r.Int64N(size)
	if c.r.IntN(4) == 0 { // the last page or so
		off = max(0, size-c.r.Int64N(2*c.pageSz)-1)
	}
	n := min(c.ioSize(), size-off)
	moff := off &^ (c.pageSz - 1)
	mlen := off + n - moff
	c.cur.off, c.cur.n, c.cur.aux = off, n, moff
	sync := write && c.r.IntN(2) == 0
	if sync {
		c.cur.note = "msync(MS_SYNC)"
	}
	c.record()
	if err := c.mm.use(c.fd); err != nil {
		c.failf("mmap helper: passing the descriptor: %v", err)
	}
	req := request{op: reqRead, moff: uint64(moff), mlen: uint64(mlen), rel: uint64(off - moff), n: uint64(n)}
	var b []byte
	if write {
		b = make([]byte, n)
		c.fill(b)
		req.op = reqWrite
		if sync {
			req.sync = 1
		}
	}
	got, err := c.mm.call(req, -1, b)
	if err != nil {
		c.failf("mmap %s of %d bytes at %d, mapping %d bytes at %d (file size %d): %v",
			map[bool]string{true: "write", false: "read"}[write], n, off, mlen, moff, size, err)
	}
	if write {
		copy(c.model[off:], b)
	} else {
		c.compare("mmap read", got, c.model[off:off+n], off)
	}
}

func (c *checker) doTruncate() {
	size := int64(len(c.model))
	var n int64
	switch p := c.r.IntN(10); {
	case p < 2: // a little, either way
		n = max(0, size+c.r.Int64N(16<<10)-8<<10)
	case p < 3: // a page boundary
		n = c.r.Int64N(min(size+size/2+64<<10, maxSize)/c.pageSz+1) * c.pageSz
	default:
		n = c.r.Int64N(min(size+size/2+64<<10, maxSize) + 1)
	}
	c.cur.n = min(n, maxSize)
	c.record()
	if err := unix.Ftruncate(c.fd, c.cur.n); err != nil {
		c.failf("ftruncate to %d: %v", c.cur.n, err)
	}
	c.resize(c.cur.n)
}

var fallocModes = map[opKind]uint32{
	opFalloc:     0,
	opFallocKeep: unix.FALLOC_FL_KEEP_SIZE,
	opPunch:      unix.FALLOC_FL_PUNCH_HOLE | unix.FALLOC_FL_KEEP_SIZE,
}

func (c *checker) doFallocate(k opKind) {
	off, n := c.ioRange()
	if k == opPunch && c.r.IntN(3) == 0 && len(c.model) > 0 { // within the file
		off = c.r.Int64N(int64(len(c.model)))
	}
	c.cur.off, c.cur.n = off, n
	c.record()
	err := unix.Fallocate(c.fd, fallocModes[k], off, n)
	if errors.Is(err, unix.EOPNOTSUPP) {
		c.unsupp[k] = true
		c.cur.note = "EOPNOTSUPP"
		c.ring[(c.nring-1)%ringLen] = c.cur
		c.t.Logf("seed %d op #%d: %s returns EOPNOTSUPP: not used from now on", c.seed, c.cur.idx, k)
		return
	}
	if err != nil {
		c.failf("fallocate mode %#x, %d bytes at %d: %v", fallocModes[k], n, off, err)
	}
	switch k {
	case opFalloc:
		if end := off + n; end > int64(len(c.model)) {
			c.resize(end)
		}
	case opPunch:
		if off < int64(len(c.model)) {
			clear(c.model[off:min(off+n, int64(len(c.model)))])
		}
	}
}

// doCopy copies a range of the scratch file into the file with
// copy_file_range, repeating the call on a short count.
func (c *checker) doCopy() {
	dst, n := c.ioRange()
	srcOff := c.r.Int64N(srcSize)
	if c.r.IntN(20) == 0 { // at or past the source's end: nothing to copy
		srcOff = srcSize + c.r.Int64N(2)*c.r.Int64N(8192)
	}
	c.cur.off, c.cur.n, c.cur.aux = dst, n, srcOff
	c.record()
	want := max(0, min(n, srcSize-srcOff))
	var done int64
	calls := 0
	for done < n {
		in, out := srcOff+done, dst+done
		got, err := unix.CopyFileRange(c.srcFd, &in, c.fd, &out, int(n-done), 0)
		calls++
		if err != nil {
			c.failf("copy_file_range of %d bytes from %d to %d (after %d copied): %v", n-done, srcOff+done, dst+done, done, err)
		}
		if got == 0 {
			break
		}
		if in != srcOff+done+int64(got) || out != dst+done+int64(got) {
			c.failf("copy_file_range returned %d but moved the offsets to %d and %d", got, in, out)
		}
		done += int64(got)
	}
	if calls > 1 {
		c.cur.note = fmt.Sprintf("(%d calls)", calls)
		c.ring[(c.nring-1)%ringLen] = c.cur
	}
	if done != want {
		c.failf("copy_file_range copied %d bytes, the model %d", done, want)
	}
	if done > 0 {
		c.modelWrite(c.src[srcOff:srcOff+done], dst)
	}
}

// checkSize compares fstat's size and SEEK_END's offset with the model's.
func (c *checker) checkSize() {
	var st unix.Stat_t
	if err := unix.Fstat(c.fd, &st); err != nil {
		c.failf("fstat: %v", err)
	}
	if st.Size != int64(len(c.model)) {
		c.failf("fstat size %d, the model's %d", st.Size, len(c.model))
	}
	end, err := unix.Seek(c.fd, 0, unix.SEEK_END)
	if err != nil {
		c.failf("lseek SEEK_END: %v", err)
	}
	if end != int64(len(c.model)) {
		c.failf("lseek(0, SEEK_END) = %d, the model's size %d", end, len(c.model))
	}
}

// verify reads the whole file through the open descriptor and, in the
// two-mount variant, closes it, reads it whole through the other mount and
// reopens it.
func (c *checker) verify(i int) {
	c.cur = op{idx: i, kind: opVerify, size: int64(len(c.model))}
	c.counts[opVerify]++
	if c.v.other {
		c.cur.note = "(and close, read through the other mount, reopen)"
	}
	c.record()
	got := make([]byte, 0, len(c.model)+1)
	buf := make([]byte, 1<<20)
	for off := int64(0); ; {
		n, err := unix.Pread(c.fd, buf, off)
		if err != nil {
			c.failf("whole-file read: pread at %d: %v", off, err)
		}
		if n == 0 {
			break
		}
		got = append(got, buf[:n]...)
		off += int64(n)
	}
	c.compareWhole("whole-file read", got)
	if !c.v.other {
		return
	}
	c.close()
	p := filepath.Join(c.other, c.name)
	got, err := os.ReadFile(p)
	if err != nil {
		c.failf("reading %s: %v", p, err)
	}
	c.compareWhole("whole-file read through the other mount after close", got)
	c.open(0)
	c.checkSize()
}

func (c *checker) compareWhole(what string, got []byte) {
	if len(got) != len(c.model) {
		at := firstDiff(got, c.model)
		c.failf("%s: %d bytes, the model %d; first difference at offset %d", what, len(got), len(c.model), at)
	}
	c.compare(what, got, c.model, 0)
}

// compare fails with the first differing offset (in the file) when got is
// not want; base is want[0]'s offset in the file.
func (c *checker) compare(what string, got, want []byte, base int64) {
	if bytes.Equal(got, want) {
		return
	}
	at := firstDiff(got, want)
	// How far the difference runs, to tell a hole from a shifted write.
	end := at
	for end < min(len(got), len(want)) && got[end] != want[end] {
		end++
	}
	zeros := bytes.Count(got[at:end], []byte{0}) == end-at
	c.diffAt = base + int64(at)
	c.failf("%s of %d bytes at %d differs from the model: first differing offset %d (got %#02x, want %#02x); %d bytes differ from there on%s",
		what, len(want), base, base+int64(at), at1(got, at), at1(want, at), end-at, map[bool]string{true: ", read as zeros", false: ""}[zeros])
}

// touches tells whether o changed, or could have changed, the byte at x.
func (o op) touches(x int64) bool {
	switch o.kind {
	case opWrite, opMmapWrite, opFalloc, opPunch, opCopy:
		return o.off <= x && x < o.off+o.n
	case opTruncate:
		return o.n <= x
	case opReopenTrunc:
		return true
	}
	return false
}

func at1(b []byte, i int) int {
	if i < len(b) {
		return int(b[i])
	}
	return -1
}

func firstDiff(a, b []byte) int {
	n := min(len(a), len(b))
	for i := 0; i < n; i++ {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

// failf stops the test with the seed, the operation, the last operations run
// and what went wrong.
func (c *checker) failf(format string, args ...any) {
	c.t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "posixcheck %s seed %d, op #%d (%s): %s\n", c.v.name, c.seed, c.cur.idx, c.cur, fmt.Sprintf(format, args...))
	fmt.Fprintf(&b, "model size %d; file %s\n", len(c.model), c.path)
	first := max(0, c.nring-ringLen)
	fmt.Fprintf(&b, "last %d operations:\n", c.nring-first)
	for j := first; j < c.nring; j++ {
		fmt.Fprintf(&b, "  %s\n", c.ring[j%ringLen])
	}
	if c.diffAt >= 0 {
		var which []string
		for j := first; j < c.nring; j++ {
			if o := c.ring[j%ringLen]; o.touches(c.diffAt) {
				which = append(which, fmt.Sprintf("#%d", o.idx))
			}
		}
		fmt.Fprintf(&b, "of these, those that changed offset %d: %s\n", c.diffAt, strings.Join(append(which, "none")[:max(1, len(which))], " "))
	}
	if c.repro != nil {
		fmt.Fprintf(&b, "reproduce: %s", c.repro(c.seed, c.cur.idx+1))
	}
	c.t.Fatal(b.String())
}
