package core

import (
	"bytes"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/rdmafs/rdmafs/meta/metapb"
)

// FuzzInlinePatch feeds inline commits decoded from arbitrary bytes to the
// checks of CommitStripes: one they accept applies without a panic and
// gives exactly length bytes, the old ones where no patch wrote.
func FuzzInlinePatch(f *testing.F) {
	seed := &metapb.StripeCommit{Inline: true, Patch: true, Length: 12,
		Patches: []*metapb.InlinePatch{{Offset: 2, Data: []byte("ab")}, {Offset: 11, Data: []byte("!")}}}
	b, _ := proto.Marshal(seed)
	f.Add(b, []byte("old bytes, some"))
	f.Add([]byte{}, []byte{})
	l := &metapb.Layout{K: 4, M: 2, Unit: 64 << 10, InlineMax: 4096}
	f.Fuzz(func(t *testing.T, msg, old []byte) {
		sc := &metapb.StripeCommit{}
		if proto.Unmarshal(msg, sc) != nil || !sc.Inline || !sc.Patch {
			return
		}
		if checkInline(l, sc) != nil {
			return
		}
		data := patchInline(old, sc)
		if uint64(len(data)) != sc.Length {
			t.Fatalf("%d bytes for length %d", len(data), sc.Length)
		}
		if len(sc.Patches) == 0 {
			n := min(len(old), len(data))
			if !bytes.Equal(data[:n], old[:n]) || bytes.ContainsFunc(data[n:], func(r rune) bool { return r != 0 }) {
				t.Fatalf("no patch, yet the bytes changed")
			}
		}
	})
}
