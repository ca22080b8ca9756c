package chunktest

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/rdmafs/rdmafs/chunkserver/chunk"
	"github.com/rdmafs/rdmafs/chunkserver/store"
)

// Offsets in a slot file's header (chunkserver/store): the chunk id, the
// version, the data length, the data's CRC32C and the header's own.
const (
	hdrChunk    = 8
	hdrVersion  = 16
	hdrLength   = 24
	hdrCRC      = 32
	hdrCRCBytes = 48 // the header's checksum covers the bytes before it
	hdrLen      = 52
)

// SlotFile returns the slot file holding version key under a chunk store's
// data directory (any version of key.Chunk when key.Version is 0), or "".
// Tests use it to damage what a chunkserver stores behind its back.
func SlotFile(dir string, key chunk.Key) string {
	paths, _ := filepath.Glob(filepath.Join(dir, "chunks", "*", "*"))
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			continue
		}
		var hdr [hdrLen]byte
		_, err = f.ReadAt(hdr[:], 0)
		f.Close()
		if err == nil && binary.LittleEndian.Uint64(hdr[hdrChunk:]) == key.Chunk &&
			(key.Version == 0 || binary.LittleEndian.Uint64(hdr[hdrVersion:]) == key.Version) {
			return p
		}
	}
	return ""
}

// FlipData inverts 16 bytes of a slot file's data; with checksums it also
// rewrites the header's checksums to match, as a bug storing the wrong bytes
// would leave them.
func FlipData(t testing.TB, path string, checksums bool) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 16)
	if _, err := f.ReadAt(b, store.DataOffset+100); err != nil {
		t.Fatal(err)
	}
	for i := range b {
		b[i] ^= 0xff
	}
	if _, err := f.WriteAt(b, store.DataOffset+100); err != nil {
		t.Fatal(err)
	}
	if !checksums {
		return
	}
	var hdr [hdrLen]byte
	if _, err := f.ReadAt(hdr[:], 0); err != nil {
		t.Fatal(err)
	}
	data := make([]byte, binary.LittleEndian.Uint64(hdr[hdrLength:]))
	if _, err := f.ReadAt(data, store.DataOffset); err != nil {
		t.Fatal(err)
	}
	binary.LittleEndian.PutUint32(hdr[hdrCRC:], store.Checksum(data))
	binary.LittleEndian.PutUint32(hdr[hdrCRCBytes:], store.Checksum(hdr[:hdrCRCBytes]))
	if _, err := f.WriteAt(hdr[:], 0); err != nil {
		t.Fatal(err)
	}
}

// CopySlot copies the slot file at path, as version key, into a new slot of
// the same data directory (which no chunkd may have open): a version no
// metadata references.
func CopySlot(t testing.TB, dir, path string, key chunk.Key) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil || len(b) < hdrLen {
		t.Fatalf("copy slot %s: %v (%d bytes)", path, err, len(b))
	}
	binary.LittleEndian.PutUint64(b[hdrChunk:], key.Chunk)
	binary.LittleEndian.PutUint64(b[hdrVersion:], key.Version)
	binary.LittleEndian.PutUint32(b[hdrCRCBytes:], store.Checksum(b[:hdrCRCBytes]))
	const slot = 0x7000000001 // far above any slot a test's chunkd made
	dst := filepath.Join(dir, "chunks", slotDir(slot), slotName(slot))
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, 0o400); err != nil { // 0400: a complete version
		t.Fatal(err)
	}
}

// slotDir and slotName name slot n's file as the store does.
func slotDir(n uint64) string  { return fmt.Sprintf("%02x", n%256) }
func slotName(n uint64) string { return fmt.Sprintf("%016x", n) }
