package fileio

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/rdmafs/rdmafs/meta/metapb"
)

// applyPatches is meta's patchInline (meta/core), here to check the
// patches against the bytes they must produce.
func applyPatches(old []byte, n int, patches []*metapb.InlinePatch) []byte {
	data := make([]byte, n)
	copy(data, old)
	for _, p := range patches {
		copy(data[p.Offset:], p.Data)
	}
	return data
}

// TestInlinePatches checks that the patches of random rewrites, growths and
// cuts of a small file turn the old bytes into the new ones, that they stay
// small when little changed, and that a mostly new file goes whole.
func TestInlinePatches(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 2000 {
		old := make([]byte, r.IntN(64<<10))
		for j := range old {
			old[j] = byte(r.IntN(4)) // zeros among them
		}
		n := len(old)
		switch r.IntN(3) {
		case 0:
			n = r.IntN(64 << 10)
		case 1:
			n = len(old) + r.IntN(8<<10)
		}
		data := make([]byte, n)
		copy(data, old)
		changed, writes := 0, 0
		for range r.IntN(6) {
			if n == 0 {
				break
			}
			off := r.IntN(n)
			w := min(n-off, 1+r.IntN(4096))
			for j := off; j < off+w; j++ {
				data[j] = byte(r.IntN(256))
			}
			changed += w
			writes++
		}
		patches, ok := inlinePatches(old, data)
		if !ok {
			if n > len(old) || changed > n/8 {
				continue // a large share of new bytes may go whole
			}
			t.Fatalf("case %d: %d bytes, %d changed: not patched", i, n, changed)
		}
		if got := applyPatches(old, n, patches); !bytes.Equal(got, data) {
			t.Fatalf("case %d: patches of %d bytes over %d old ones do not give the new bytes", i, n, len(old))
		}
		sent := 0
		for _, p := range patches {
			sent += len(p.Data)
		}
		// Each write costs at most its bytes, the blocks it starts and ends
		// in, and a merge across one equal block.
		if limit := changed + writes*3*patchBlock; sent > limit {
			t.Fatalf("case %d: %d patch bytes for %d bytes changed in %d writes (at most %d)", i, sent, changed, writes, limit)
		}
	}
	// A page rewritten in a 48 KiB file: one patch within the page.
	old := bytes.Repeat([]byte{7}, 48<<10)
	data := bytes.Clone(old)
	copy(data[8192+100:], "a new row")
	patches, ok := inlinePatches(old, data)
	if !ok || len(patches) != 1 || patches[0].Offset != 8192+64 || len(patches[0].Data) != 64 {
		t.Fatalf("one changed row: patches %v, ok %v", patches, ok)
	}
	// A whole new file goes whole.
	if _, ok := inlinePatches(old, bytes.Repeat([]byte{9}, 40<<10)); ok {
		t.Fatal("a rewritten file was patched")
	}
}
