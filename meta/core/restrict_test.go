package core

import "testing"

// TestTokenAllowedBound: a token's allowed set never grows past maxAllowed,
// and starting again keeps the subdirectory.
func TestTokenAllowedBound(t *testing.T) {
	st := &tokenState{root: 5, allowed: map[uint64]struct{}{5: {}}, sessions: map[uint64]struct{}{}}
	for i := uint64(0); i < maxAllowed+10; i++ {
		st.rememberLocked(100 + i)
	}
	if n := len(st.allowed); n > maxAllowed {
		t.Fatalf("%d allowed inodes, bound %d", n, maxAllowed)
	}
	if _, ok := st.allowed[5]; !ok {
		t.Fatal("the subdirectory left the allowed set")
	}
	if _, ok := st.allowed[100+maxAllowed+9]; !ok {
		t.Fatal("the last inode remembered is not allowed")
	}
}
