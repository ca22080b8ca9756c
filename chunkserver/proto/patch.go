package proto

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// ErrBadPatch is wrapped by the errors of ApplyPatch: the patch is malformed or
// does not fit the version it is applied to.
var ErrBadPatch = errors.New("proto: bad patch")

// PatchRange is one range of a patch: Len bytes written at offset Off of the version.
type PatchRange struct{ Off, Len uint32 }

// patchFixedLen is the size of a patch header without its ranges: count u32 |
// reserved u32.
const patchFixedLen = 8

// patchRangeLen is the encoded size of one range: off u32 | len u32.
const patchRangeLen = 8

// PatchHeaderLen returns the encoded size of the header of a patch of n ranges (8 + 8n).
func PatchHeaderLen(n int) int { return patchFixedLen + patchRangeLen*n }

// EncodePatchHeader writes the header of a patch with ranges into b, which must have
// room for PatchHeaderLen(len(ranges)) bytes, and returns the bytes written. The
// caller appends the ranges' bytes, back to back in the order of ranges, to make
// the patch. It does not check the ranges (ApplyPatch does) and panics when b is
// too small.
func EncodePatchHeader(b []byte, ranges []PatchRange) int {
	n := PatchHeaderLen(len(ranges))
	_ = b[n-1] // one bounds check
	binary.LittleEndian.PutUint32(b[0:], uint32(len(ranges)))
	binary.LittleEndian.PutUint32(b[4:], 0)
	for i, r := range ranges {
		q := b[patchFixedLen+i*patchRangeLen:]
		binary.LittleEndian.PutUint32(q[0:], r.Off)
		binary.LittleEndian.PutUint32(q[4:], r.Len)
	}
	return n
}

// ApplyPatch checks patch against a version of len(dst) bytes and then copies its ranges
// into dst. The ranges must be sorted by offset, not overlap, have len > 0, lie inside dst,
// and their bytes must exactly fill the rest of patch after the header; the
// reserved header field must be 0. On any error, which wraps ErrBadPatch, dst is
// untouched (everything is checked first, then copied). It does not allocate
// unless it fails.
func ApplyPatch(dst, patch []byte) error {
	if len(patch) < patchFixedLen {
		return fmt.Errorf("%w: %d bytes, shorter than a header", ErrBadPatch, len(patch))
	}
	count := uint64(binary.LittleEndian.Uint32(patch[0:]))
	if r := binary.LittleEndian.Uint32(patch[4:]); r != 0 {
		return fmt.Errorf("%w: reserved field %#x is not 0", ErrBadPatch, r)
	}
	if count > uint64(len(patch)-patchFixedLen)/patchRangeLen {
		return fmt.Errorf("%w: %d ranges do not fit in %d bytes", ErrBadPatch, count, len(patch))
	}
	hdr := patchFixedLen + int(count)*patchRangeLen
	table := patch[patchFixedLen:hdr]
	data := patch[hdr:]
	var end, total uint64 // end of the previous range; bytes of the ranges so far
	for i := 0; i < len(table); i += patchRangeLen {
		off := uint64(binary.LittleEndian.Uint32(table[i:]))
		n := uint64(binary.LittleEndian.Uint32(table[i+4:]))
		switch {
		case n == 0:
			return fmt.Errorf("%w: range %d at %d is empty", ErrBadPatch, i/patchRangeLen, off)
		case off < end:
			return fmt.Errorf("%w: range %d at %d overlaps or precedes the previous one, which ends at %d", ErrBadPatch, i/patchRangeLen, off, end)
		case off+n > uint64(len(dst)):
			return fmt.Errorf("%w: range %d [%d,+%d) outside the version of %d bytes", ErrBadPatch, i/patchRangeLen, off, n, len(dst))
		}
		end = off + n
		total += n
	}
	if total != uint64(len(data)) {
		return fmt.Errorf("%w: ranges of %d bytes with %d bytes of data", ErrBadPatch, total, len(data))
	}
	for i := 0; i < len(table); i += patchRangeLen {
		off := int(binary.LittleEndian.Uint32(table[i:]))
		n := int(binary.LittleEndian.Uint32(table[i+4:]))
		data = data[copy(dst[off:off+n], data[:n]):]
	}
	return nil
}
