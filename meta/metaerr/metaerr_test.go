package metaerr

import (
	"errors"
	"fmt"
	"syscall"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestErrno(t *testing.T) {
	wire := func(e *Error) error { return status.ErrorProto(e.GRPCStatus().Proto()) }
	tests := []struct {
		name string
		err  error
		want syscall.Errno
	}{
		{"nil", nil, 0},
		{"direct", New(syscall.ENOTEMPTY, "x"), syscall.ENOTEMPTY},
		{"wrapped", fmt.Errorf("ctx: %w", New(syscall.EEXIST, "x")), syscall.EEXIST},
		{"over the wire", wire(New(syscall.ENODATA, "x")), syscall.ENODATA},
		{"status without detail", status.Error(codes.NotFound, "x"), syscall.ENOENT},
		{"unauthenticated", status.Error(codes.Unauthenticated, "x"), syscall.EACCES},
		{"plain error", errors.New("boom"), syscall.EIO},
		{"syscall errno", syscall.EBUSY, syscall.EBUSY},
		{"conflict", wire(Conflict([]uint64{3}, "x")), syscall.EAGAIN},
	}
	for _, tt := range tests {
		if got := Errno(tt.err); got != tt.want {
			t.Errorf("%s: Errno = %v, want %v", tt.name, got, tt.want)
		}
	}
	if got := ConflictStripes(wire(Conflict([]uint64{3, 4}, "x"))); fmt.Sprint(got) != "[3 4]" {
		t.Fatalf("ConflictStripes = %v", got)
	}
	if !errors.Is(New(syscall.ENOENT, "x"), syscall.ENOENT) {
		t.Fatal("errors.Is does not match the errno")
	}
	if c := New(syscall.EACCES, "x").Code; c != codes.PermissionDenied {
		t.Fatalf("EACCES travels as %v", c)
	}
}
