package metapb

import "testing"

func TestChunkserversUp(t *testing.T) {
	var none *StatusReply
	if n := none.ChunkserversUp(); n != 0 {
		t.Errorf("nil status: %d up", n)
	}
	st := &StatusReply{Chunkservers: []*ChunkserverStatus{{Up: true}, {}, {Up: true}}}
	if n := st.ChunkserversUp(); n != 2 {
		t.Errorf("%d up, want 2", n)
	}
}
