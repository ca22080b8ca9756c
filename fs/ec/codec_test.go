package ec

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"github.com/klauspost/reedsolomon"
)

// stripe is a test stripe: the file data and its shards under the convention.
type stripe struct {
	l      Layout
	n      int64
	data   []byte   // the stripe's n bytes of file data
	shards [][]byte // trimmed data shards (nil beyond EOF), then parity of length L
}

func newStripe(t testing.TB, l Layout, n int64, seed uint64) *stripe {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 1))
	s := &stripe{l: l, n: n, data: make([]byte, n)}
	for i := range s.data {
		s.data[i] = byte(r.Uint32())
	}
	L := l.ShardLen(n)
	for i := range l.K {
		d := l.DataShardLen(n, i)
		if d == 0 {
			s.shards = append(s.shards, nil)
			continue
		}
		off := int64(i) * l.Unit
		s.shards = append(s.shards, s.data[off:off+int64(d)])
	}
	for range l.M {
		s.shards = append(s.shards, make([]byte, L))
	}
	return s
}

// refParity computes the parity of s independently: zero-padded copies of the
// data shards through plain reedsolomon (or copies for replication).
func refParity(t testing.TB, s *stripe) [][]byte {
	t.Helper()
	L := s.l.ShardLen(s.n)
	all := make([][]byte, s.l.Shards())
	for i := range all {
		all[i] = make([]byte, L)
		if i < s.l.K {
			copy(all[i], s.shards[i])
		}
	}
	if s.l.M == 0 {
		return nil
	}
	if s.l.K == 1 {
		for i := 1; i < len(all); i++ {
			copy(all[i], all[0])
		}
		return all[1:]
	}
	enc, err := reedsolomon.New(s.l.K, s.l.M)
	if err != nil {
		t.Fatal(err)
	}
	if err := enc.Encode(all); err != nil {
		t.Fatal(err)
	}
	return all[s.l.K:]
}

var codecLayouts = []Layout{
	{K: 1, M: 0, Unit: 4096},
	{K: 1, M: 2, Unit: 4096},
	{K: 2, M: 1, Unit: 4096},
	{K: 3, M: 0, Unit: 4096},
	{K: 4, M: 2, Unit: 4096},
	{K: 4, M: 2, Unit: 3 * 4096},
	{K: 8, M: 3, Unit: 4096},
	{K: 6, M: 6, Unit: 4096},
}

// stripeLens returns interesting stripe data lengths for l.
func stripeLens(l Layout) []int64 {
	u, ss := l.Unit, l.StripeSize()
	c := []int64{1, 100, u - 1, u, u + 1, 2*u - 7, ss/2 + 3, ss - 1, ss}
	var out []int64
	for _, n := range c {
		if n >= 1 && n <= ss {
			out = append(out, n)
		}
	}
	return out
}

func TestEncodeMatchesReference(t *testing.T) {
	for _, l := range codecLayouts {
		c, err := NewCodec(l)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range stripeLens(l) {
			t.Run(fmt.Sprintf("%v/n=%d", l, n), func(t *testing.T) {
				s := newStripe(t, l, n, uint64(n))
				want := refParity(t, s)
				before := bytes.Clone(s.data)
				if err := c.Encode(s.shards); err != nil {
					t.Fatal(err)
				}
				for j, p := range want {
					if !bytes.Equal(s.shards[l.K+j], p) {
						t.Fatalf("parity %d differs from reference", j)
					}
				}
				if !bytes.Equal(before, s.data) {
					t.Fatal("Encode modified data")
				}
				for i := range l.K {
					if len(s.shards[i]) != l.DataShardLen(n, i) {
						t.Fatalf("Encode changed the length of data shard %d", i)
					}
				}
				ok, err := c.Verify(s.shards)
				if err != nil || !ok {
					t.Fatalf("Verify = %v, %v; want true", ok, err)
				}
				if l.M > 0 {
					p := s.shards[l.K+l.M-1]
					p[len(p)-1] ^= 1
					if ok, err := c.Verify(s.shards); err != nil || ok {
						t.Fatalf("Verify after corrupting parity = %v, %v; want false", ok, err)
					}
					p[len(p)-1] ^= 1
					d := s.shards[l.K-1]
					if len(d) == 0 {
						d = s.shards[0]
					}
					d[0] ^= 0x80
					if ok, err := c.Verify(s.shards); err != nil || ok {
						t.Fatalf("Verify after corrupting data = %v, %v; want false", ok, err)
					}
				}
			})
		}
	}
}

func TestEncodePaddedEqualsTrimmed(t *testing.T) {
	// Storing data shards zero-padded to L or trimmed gives the same parity.
	l := Layout{K: 4, M: 2, Unit: 8192}
	c, _ := NewCodec(l)
	n := int64(8192 + 10)
	s := newStripe(t, l, n, 7)
	if err := c.Encode(s.shards); err != nil {
		t.Fatal(err)
	}
	padded := make([][]byte, 6)
	for i := range padded {
		padded[i] = make([]byte, 8192)
		if i < 4 {
			copy(padded[i], s.shards[i])
		}
	}
	if err := c.Encode(padded); err != nil {
		t.Fatal(err)
	}
	for i := 4; i < 6; i++ {
		if !bytes.Equal(padded[i], s.shards[i]) {
			t.Fatalf("parity %d: padded and trimmed data disagree", i)
		}
	}
}

// subsets calls fn with every subset of {0..n-1} of size 1..max as a bitmask.
func subsets(n, maxSize int, fn func(mask uint64)) {
	for mask := uint64(1); mask < 1<<n; mask++ {
		if c := popcount(mask); c <= maxSize {
			fn(mask)
		}
	}
}

func popcount(x uint64) int {
	c := 0
	for ; x != 0; x &= x - 1 {
		c++
	}
	return c
}

func TestReconstructEveryLossPattern(t *testing.T) {
	for _, l := range codecLayouts {
		c, _ := NewCodec(l)
		for _, n := range stripeLens(l) {
			s := newStripe(t, l, n, uint64(n)+3)
			if err := c.Encode(s.shards); err != nil {
				t.Fatal(err)
			}
			L := l.ShardLen(n)
			for _, dataOnly := range []bool{true, false} {
				subsets(l.Shards(), l.M, func(mask uint64) {
					name := fmt.Sprintf("%v n=%d lost=%b dataOnly=%v", l, n, mask, dataOnly)
					got := make([][]byte, l.Shards())
					for i := range got {
						if mask&(1<<i) == 0 {
							got[i] = s.shards[i]
							continue
						}
						// a fresh buffer, dirty, with spare capacity
						buf := bytes.Repeat([]byte{0xEE}, L+5)
						got[i] = buf[:0]
					}
					var err error
					if dataOnly {
						err = c.ReconstructData(got, n)
					} else {
						err = c.Reconstruct(got, n)
					}
					if err != nil {
						t.Fatalf("%s: %v", name, err)
					}
					for i := range got {
						lost := mask&(1<<i) != 0
						switch {
						case i < l.K && l.DataShardLen(n, i) == 0:
							if lost && len(got[i]) != 0 {
								t.Fatalf("%s: shard %d beyond EOF got %d bytes", name, i, len(got[i]))
							}
						case i >= l.K && dataOnly && lost:
							if len(got[i]) != 0 {
								t.Fatalf("%s: ReconstructData rebuilt parity %d", name, i)
							}
						default:
							if !bytes.Equal(got[i], s.shards[i]) {
								t.Fatalf("%s: shard %d wrong (len %d, want %d)", name, i, len(got[i]), len(s.shards[i]))
							}
							if lost && got[i][:len(got[i])+1][len(got[i])] != 0xEE {
								t.Fatalf("%s: shard %d: wrote past its rebuilt length", name, i)
							}
						}
					}
				})
			}
		}
	}
}

func TestReconstructTooFew(t *testing.T) {
	l := Layout{K: 4, M: 2, Unit: 4096}
	c, _ := NewCodec(l)
	s := newStripe(t, l, l.StripeSize(), 1)
	if err := c.Encode(s.shards); err != nil {
		t.Fatal(err)
	}
	got := append([][]byte(nil), s.shards...)
	got[0], got[2], got[5] = make([]byte, 0, 4096), make([]byte, 0, 4096), make([]byte, 0, 4096)
	err := c.ReconstructData(got, l.StripeSize())
	if !errors.Is(err, ErrTooFewShards) || !strings.Contains(err.Error(), "3 of 6 shards available, need 4") {
		t.Fatalf("err = %v; want ErrTooFewShards naming 3 of 6, need 4", err)
	}
	// With a short stripe, shards beyond EOF count as available.
	s = newStripe(t, l, 100, 2) // only data shard 0 has data
	if err := c.Encode(s.shards); err != nil {
		t.Fatal(err)
	}
	got = [][]byte{make([]byte, 0, 100), nil, nil, nil, nil, s.shards[5]}
	if err := c.ReconstructData(got, 100); err != nil {
		t.Fatalf("short stripe with one parity left: %v", err)
	}
	if !bytes.Equal(got[0], s.data) {
		t.Fatal("short stripe rebuilt wrong")
	}
}

func TestCodecErrors(t *testing.T) {
	l := Layout{K: 4, M: 2, Unit: 4096}
	c, _ := NewCodec(l)
	b := func(n int) []byte { return make([]byte, n) }
	enc := []struct {
		name   string
		shards [][]byte
		want   string
	}{
		{"count", [][]byte{b(10)}, "1 shards given, want 6"},
		{"empty shard 0", [][]byte{nil, nil, nil, nil, b(0), b(0)}, "data shard 0 has 0 bytes"},
		{"shard 0 over unit", [][]byte{b(4097), nil, nil, nil, b(4097), b(4097)}, "want 1..4096"},
		{"data longer than shard 0", [][]byte{b(10), b(11), nil, nil, b(10), b(10)}, "data shard 1 has 11 bytes"},
		{"short parity", [][]byte{b(10), nil, nil, nil, b(10), b(9)}, "parity shard 5 has 9 bytes"},
	}
	for _, tc := range enc {
		err := c.Encode(tc.shards)
		if !errors.Is(err, ErrShardSize) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Encode %s: err = %v; want ErrShardSize with %q", tc.name, err, tc.want)
		}
		if _, err := c.Verify(tc.shards); !errors.Is(err, ErrShardSize) {
			t.Errorf("Verify %s: err = %v; want ErrShardSize", tc.name, err)
		}
	}
	rec := []struct {
		name   string
		shards [][]byte
		n      int64
		want   string
	}{
		{"n zero", [][]byte{b(10), nil, nil, nil, b(10), b(10)}, 0, "0 bytes of data"},
		{"n too big", [][]byte{b(10), nil, nil, nil, b(10), b(10)}, 4*4096 + 1, "want 1..16384"},
		{"no capacity", [][]byte{b(0), b(4096), b(4096), b(4096), b(4096), b(4096)}, 4 * 4096, "missing shard 0 has capacity 0, need 4096"},
		{"short data", [][]byte{b(4096), b(100), b(0)[:0:0], nil, b(4096), b(4096)}, 4096 + 200, "data shard 1 has 100 bytes, want 200..4096"},
		{"bad parity", [][]byte{b(4096), b(4096), b(4096), b(4096), b(4096), b(4095)}, 4 * 4096, "parity shard 5 has 4095 bytes"},
	}
	for _, tc := range rec {
		err := c.Reconstruct(tc.shards, tc.n)
		if !errors.Is(err, ErrShardSize) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Reconstruct %s: err = %v; want ErrShardSize with %q", tc.name, err, tc.want)
		}
	}
	if _, err := NewCodec(Layout{K: 0, M: 2, Unit: 4096}); !errors.Is(err, ErrInvalidLayout) {
		t.Errorf("NewCodec(bad layout) err = %v", err)
	}
}

func TestReplicationAliasedParity(t *testing.T) {
	// An engine may pass the same buffer as data and replica: no copy, no error.
	c, _ := NewCodec(Layout{K: 1, M: 2, Unit: 4096})
	d := []byte("hello")
	if err := c.Encode([][]byte{d, d, d}); err != nil {
		t.Fatal(err)
	}
	if ok, err := c.Verify([][]byte{d, d, []byte("hellO")}); ok || err != nil {
		t.Fatalf("Verify of differing replica = %v, %v", ok, err)
	}
}

// mmapShards returns shards in off-heap memory, as the engine's registered
// buffers are.
func mmapShards(t testing.TB, count, size int) [][]byte {
	t.Helper()
	mem, err := syscall.Mmap(-1, 0, count*size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		t.Skipf("mmap: %v", err)
	}
	t.Cleanup(func() { syscall.Munmap(mem) })
	out := make([][]byte, count)
	for i := range out {
		out[i] = mem[i*size : (i+1)*size : (i+1)*size]
	}
	return out
}

func TestCodecAllocations(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates 1 MiB shards")
	}
	if raceEnabled {
		t.Skip("the race detector makes sync.Pool drop items at random; make test runs this without it")
	}
	l := Layout{K: 4, M: 2, Unit: 1 << 20}
	c, _ := NewCodec(l)
	shards := mmapShards(t, 6, 1<<20)
	for i, s := range shards[:4] {
		for j := range s {
			s[j] = byte(i*7 + j)
		}
	}
	// klauspost/reedsolomon v1.14.2 allocates one small (896-byte) GFNI matrix
	// per coding pass; this package adds nothing to that. A full stripe is one
	// pass, a short one two (real bytes, then padding).
	if a := testing.AllocsPerRun(5, func() {
		if err := c.Encode(shards); err != nil {
			t.Fatal(err)
		}
	}); a > 1 {
		t.Errorf("Encode of a full stripe: %v allocations per call, want at most 1", a)
	}
	short := append([][]byte(nil), shards...)
	short[1] = short[1][:1000] // EOF inside data shard 1
	short[2], short[3] = nil, nil
	if a := testing.AllocsPerRun(5, func() {
		if err := c.Encode(short); err != nil {
			t.Fatal(err)
		}
	}); a > 2 {
		t.Errorf("Encode of a short stripe: %v allocations per call, want at most 2", a)
	}
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	const runs = 10
	for range runs {
		if err := c.Encode(short); err != nil {
			t.Fatal(err)
		}
	}
	runtime.ReadMemStats(&ms1)
	if per := (ms1.TotalAlloc - ms0.TotalAlloc) / runs; per > 4096 {
		t.Errorf("Encode allocates %d bytes per call, want no more than reedsolomon's small matrices", per)
	}
	rep, _ := NewCodec(Layout{K: 1, M: 2, Unit: 1 << 20})
	repShards := mmapShards(t, 3, 1<<20)
	if a := testing.AllocsPerRun(5, func() {
		if err := rep.Encode(repShards); err != nil {
			t.Fatal(err)
		}
	}); a != 0 {
		t.Errorf("replication Encode: %v allocations per call, want 0", a)
	}
	if ok, err := c.Verify(short); !ok || err != nil {
		t.Fatalf("Verify short = %v, %v", ok, err)
	}
	n := int64(1<<20 + 1000)
	// Reconstruct: no shard-sized allocation, only reedsolomon's bookkeeping.
	lost := append([][]byte(nil), short...)
	out0 := mmapShards(t, 2, 1<<20)
	runtime.ReadMemStats(&ms0)
	for range runs {
		lost[0], lost[4] = out0[0][:0], out0[1][:0]
		if err := c.Reconstruct(lost, n); err != nil {
			t.Fatal(err)
		}
	}
	runtime.ReadMemStats(&ms1)
	if per := (ms1.TotalAlloc - ms0.TotalAlloc) / runs; per > 4096 {
		t.Errorf("Reconstruct allocates %d bytes per call, want only small bookkeeping", per)
	}
	if !bytes.Equal(lost[0], shards[0]) || !bytes.Equal(lost[4], shards[4]) {
		t.Fatal("Reconstruct into mmap buffers: wrong data")
	}
}

func TestCodecConcurrentUse(t *testing.T) {
	// One Codec, many goroutines, each with its own stripe and shards slice;
	// with Goroutines > 1 reedsolomon also splits big shards internally.
	for _, opts := range []CodecOptions{{}, {Goroutines: 2}} {
		l := Layout{K: 4, M: 2, Unit: 256 << 10}
		c, err := NewCodec(l, opts)
		if err != nil {
			t.Fatal(err)
		}
		errs := make(chan error, 4)
		for g := range 4 {
			go func() {
				n := l.StripeSize() - int64(g)*100_000
				s := newStripe(t, l, n, uint64(g))
				if err := c.Encode(s.shards); err != nil {
					errs <- err
					return
				}
				got := append([][]byte(nil), s.shards...)
				got[g%4] = make([]byte, 0, l.Unit)
				got[4+g%2] = make([]byte, 0, l.Unit)
				if err := c.Reconstruct(got, n); err != nil {
					errs <- err
					return
				}
				for i := range got {
					if !bytes.Equal(got[i], s.shards[i]) {
						errs <- fmt.Errorf("goroutine %d, opts %+v: shard %d differs", g, opts, i)
						return
					}
				}
				errs <- nil
			}()
		}
		for range 4 {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
	}
}

func TestSmallZeroBuffer(t *testing.T) {
	// Where the zero buffer cannot be a mapping of the zero page it is shorter
	// than a unit, and padding is coded in pieces. Emulate that here.
	l := Layout{K: 4, M: 2, Unit: 5 * 4096}
	c, _ := NewCodec(l)
	c.zero = c.zero[:4096]
	for _, n := range []int64{1, 4096*5 + 3, 3*4096*5 + 1, l.StripeSize()} {
		s := newStripe(t, l, n, 9)
		want := refParity(t, s)
		if err := c.Encode(s.shards); err != nil {
			t.Fatal(err)
		}
		for j, p := range want {
			if !bytes.Equal(s.shards[l.K+j], p) {
				t.Fatalf("n=%d: parity %d wrong with a small zero buffer", n, j)
			}
		}
		if ok, err := c.Verify(s.shards); !ok || err != nil {
			t.Fatalf("n=%d: Verify = %v, %v", n, ok, err)
		}
		L := l.ShardLen(n)
		got := append([][]byte(nil), s.shards...)
		got[0], got[5] = make([]byte, 0, L), make([]byte, 0, L)
		if err := c.Reconstruct(got, n); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got[0], s.shards[0]) || !bytes.Equal(got[5], s.shards[5]) {
			t.Fatalf("n=%d: reconstruction wrong with a small zero buffer", n)
		}
	}
}
