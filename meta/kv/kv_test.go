package kv

import (
	"errors"
	"strings"
	"testing"
)

// TestCallSafely checks that CallSafely returns fn's error as is and turns a
// panic into an error quoting the panic's value.
func TestCallSafely(t *testing.T) {
	boom := errors.New("boom")
	if err := CallSafely(func(Txn) error { return boom }, nil); err != boom {
		t.Fatalf("error passed through as %v, want boom", err)
	}
	if err := CallSafely(func(Txn) error { return nil }, nil); err != nil {
		t.Fatalf("nil error returned as %v", err)
	}
	err := CallSafely(func(Txn) error { panic("bad index 7") }, nil)
	if err == nil || !strings.Contains(err.Error(), "kv: transaction panicked: bad index 7") {
		t.Fatalf("panic returned as %v", err)
	}
}
