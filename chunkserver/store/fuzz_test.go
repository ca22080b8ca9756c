package store

import (
	"testing"

	"github.com/rdmafs/rdmafs/chunkserver/chunk"
)

// FuzzDecodeHeader: version file headers come from disk and may be damaged; the
// decoder must reject garbage without panicking and round-trip what it accepts.
func FuzzDecodeHeader(f *testing.F) {
	var b [HeaderLen]byte
	encodeHeader(b[:], chunk.Info{Key: chunk.Key{Chunk: 1, Version: 2}, Length: 3, CRC: 4}, 5)
	f.Add(b[:])
	f.Add([]byte("RDCK"))
	f.Fuzz(func(t *testing.T, in []byte) {
		info, seq, err := decodeHeader(in)
		if err != nil {
			return
		}
		var out [HeaderLen]byte
		encodeHeader(out[:], info, seq)
		again, seq2, err := decodeHeader(out[:])
		if err != nil || again != info || seq2 != seq {
			t.Fatalf("round trip %+v -> %+v (%v)", info, again, err)
		}
	})
}

// FuzzParseName: file names in the data dir are untrusted.
func FuzzParseName(f *testing.F) {
	f.Add(fileName(0x1234))
	f.Add("garbage")
	f.Fuzz(func(t *testing.T, name string) {
		k, ok := parseName(name)
		if ok && parseNameMust(t, fileName(k)) != k {
			t.Fatalf("%q -> %v does not round trip", name, k)
		}
	})
}

func parseNameMust(t *testing.T, name string) uint64 {
	k, ok := parseName(name)
	if !ok {
		t.Fatalf("own name %q rejected", name)
	}
	return k
}
