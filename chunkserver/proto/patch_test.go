package proto

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
)

// makePatch encodes a patch of ranges whose data is taken from src at the
// ranges' offsets.
func makePatch(ranges []PatchRange, src []byte) []byte {
	p := make([]byte, PatchHeaderLen(len(ranges)))
	EncodePatchHeader(p, ranges)
	for _, r := range ranges {
		p = append(p, src[r.Off:r.Off+r.Len]...)
	}
	return p
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7)
	}
	return b
}

func TestEncodePatchHeader(t *testing.T) {
	ranges := []PatchRange{{Off: 1, Len: 2}, {Off: 0x01020304, Len: 0x0a0b0c0d}}
	b := make([]byte, PatchHeaderLen(len(ranges))+3)
	n := EncodePatchHeader(b, ranges)
	want := []byte{2, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 4, 3, 2, 1, 0x0d, 0x0c, 0x0b, 0x0a}
	if n != 24 || PatchHeaderLen(2) != 24 || PatchHeaderLen(0) != 8 || !bytes.Equal(b[:n], want) {
		t.Fatalf("EncodePatchHeader = %d % x, want 24 % x", n, b[:n], want)
	}
}

func TestApplyPatch(t *testing.T) {
	const size = 1000
	base := pattern(size, 1)
	src := pattern(size, 100) // the new contents the patches take their bytes from
	tests := []struct {
		name   string
		ranges []PatchRange
	}{
		{"no ranges", nil},
		{"one byte", []PatchRange{{Off: 0, Len: 1}}},
		{"last byte", []PatchRange{{Off: size - 1, Len: 1}}},
		{"everything", []PatchRange{{Off: 0, Len: size}}},
		{"adjacent", []PatchRange{{Off: 10, Len: 5}, {Off: 15, Len: 5}}},
		{"three", []PatchRange{{Off: 3, Len: 100}, {Off: 500, Len: 17}, {Off: 900, Len: 100}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dst := append([]byte(nil), base...)
			if err := ApplyPatch(dst, makePatch(tc.ranges, src)); err != nil {
				t.Fatal(err)
			}
			want := append([]byte(nil), base...)
			for _, r := range tc.ranges {
				copy(want[r.Off:r.Off+r.Len], src[r.Off:])
			}
			if !bytes.Equal(dst, want) {
				t.Fatal("patched version differs from the model")
			}
		})
	}
}

func TestApplyPatchErrors(t *testing.T) {
	const size = 1000
	src := pattern(size, 100)
	valid := makePatch([]PatchRange{{Off: 10, Len: 20}, {Off: 100, Len: 5}}, src)
	mod := func(f func(p []byte) []byte) []byte { return f(append([]byte(nil), valid...)) }
	put32 := func(p []byte, off int, v uint32) []byte { binary.LittleEndian.PutUint32(p[off:], v); return p }
	tests := []struct {
		name  string
		patch []byte
	}{
		{"empty", nil},
		{"short header", []byte{0, 0, 0, 0, 0, 0, 0}},
		{"reserved set", mod(func(p []byte) []byte { return put32(p, 4, 1) })},
		{"count over the patch", mod(func(p []byte) []byte { return put32(p, 0, 1000) })},
		{"count huge", mod(func(p []byte) []byte { return put32(p, 0, 0xffffffff) })},
		{"data short", valid[:len(valid)-1]},
		{"data long", append(append([]byte(nil), valid...), 0)},
		{"no ranges with data", append(makePatch(nil, src), 1)},
		{"empty range", makePatch([]PatchRange{{Off: 10, Len: 0}}, src)},
		{"unsorted", makePatch([]PatchRange{{Off: 100, Len: 5}, {Off: 10, Len: 20}}, src)},
		{"overlap", makePatch([]PatchRange{{Off: 10, Len: 20}, {Off: 29, Len: 5}}, src)},
		{"same offset", makePatch([]PatchRange{{Off: 10, Len: 1}, {Off: 10, Len: 1}}, src)},
		{"past the end", mod(func(p []byte) []byte { return put32(p, 16, size-4) })},
		{"offset past the end", append(put32(put32(put32(make([]byte, 16), 0, 1), 8, size), 12, 1), 0)},
		{"offset plus length overflows", append(put32(put32(put32(make([]byte, 16), 0, 1), 8, 0xffffffff), 12, 2), 0, 0)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dst := pattern(size, 1)
			err := ApplyPatch(dst, tc.patch)
			if !errors.Is(err, ErrBadPatch) {
				t.Fatalf("ApplyPatch = %v, want ErrBadPatch", err)
			}
			if !bytes.Equal(dst, pattern(size, 1)) {
				t.Fatal("a refused patch changed dst")
			}
		})
	}
	// A valid patch checked against a version too short for it.
	if err := ApplyPatch(make([]byte, 104), valid); !errors.Is(err, ErrBadPatch) {
		t.Fatalf("patch past a short version = %v", err)
	}
}

func TestApplyPatchAllocations(t *testing.T) {
	src := pattern(4096, 3)
	patch := makePatch([]PatchRange{{Off: 0, Len: 10}, {Off: 100, Len: 1000}, {Off: 4000, Len: 96}}, src)
	dst := make([]byte, 4096)
	if n := testing.AllocsPerRun(100, func() {
		if err := ApplyPatch(dst, patch); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Fatalf("%v allocations per ApplyPatch", n)
	}
}

func FuzzApplyPatch(f *testing.F) {
	src := pattern(256, 9)
	f.Add(uint16(256), makePatch(nil, src))
	f.Add(uint16(256), makePatch([]PatchRange{{Off: 0, Len: 256}}, src))
	f.Add(uint16(256), makePatch([]PatchRange{{Off: 1, Len: 3}, {Off: 4, Len: 10}, {Off: 200, Len: 56}}, src))
	f.Add(uint16(100), makePatch([]PatchRange{{Off: 90, Len: 20}}, src))                    // past the end
	f.Add(uint16(256), makePatch([]PatchRange{{Off: 10, Len: 20}, {Off: 15, Len: 1}}, src)) // overlap
	f.Add(uint16(256), makePatch([]PatchRange{{Off: 10, Len: 0}}, src))                     // empty range
	f.Add(uint16(0), []byte{})
	f.Add(uint16(16), []byte{1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 7}) // reserved set
	f.Fuzz(func(t *testing.T, size uint16, patch []byte) {
		base := pattern(int(size), 1)
		dst := append([]byte(nil), base...)
		err := ApplyPatch(dst, patch)
		if err != nil {
			if !errors.Is(err, ErrBadPatch) {
				t.Fatalf("error %v does not wrap ErrBadPatch", err)
			}
			if !bytes.Equal(dst, base) {
				t.Fatal("a refused patch changed dst")
			}
			return
		}
		// Accepted: decode it independently and check dst against the model.
		count := int(binary.LittleEndian.Uint32(patch))
		data := patch[PatchHeaderLen(count):]
		want := append([]byte(nil), base...)
		covered := make([]bool, len(base))
		end := 0
		for i := 0; i < count; i++ {
			off := int(binary.LittleEndian.Uint32(patch[8+8*i:]))
			n := int(binary.LittleEndian.Uint32(patch[12+8*i:]))
			if n == 0 || off < end || off+n > len(base) {
				t.Fatalf("accepted range %d [%d,+%d) after %d in a version of %d bytes", i, off, n, end, len(base))
			}
			end = off + n
			if !bytes.Equal(dst[off:off+n], data[:n]) {
				t.Fatalf("range %d [%d,+%d) not in dst", i, off, n)
			}
			copy(want[off:], data[:n])
			for j := off; j < off+n; j++ {
				covered[j] = true
			}
			data = data[n:]
		}
		if len(data) != 0 {
			t.Fatalf("accepted with %d bytes of data left over", len(data))
		}
		for i := range dst {
			if !covered[i] && dst[i] != base[i] {
				t.Fatalf("byte %d outside the ranges changed", i)
			}
		}
		if !bytes.Equal(dst, want) {
			t.Fatal("dst differs from the model")
		}
	})
}
