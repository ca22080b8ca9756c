// Package metaerr defines the errors of the metadata service: each carries a
// POSIX errno and a gRPC code, travels as a gRPC status with an ErrorInfo
// detail, and converts back into a syscall.Errno on the client side.
package metaerr

import (
	"errors"
	"fmt"
	"syscall"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rdmafs/rdmafs/meta/metapb"
)

// Error is an error with a POSIX meaning.
type Error struct {
	// Errno is the POSIX error number the file system reports.
	Errno syscall.Errno
	// Code is the gRPC code the error travels with.
	Code codes.Code
	// Msg is a human-readable explanation.
	Msg string
	// ConflictStripes lists the stripes whose compare-and-set failed in a
	// CommitStripes call.
	ConflictStripes []uint64
}

// Error implements error.
func (e *Error) Error() string {
	return fmt.Sprintf("%s (%s)", e.Msg, errnoName(e.Errno))
}

// Is reports whether target is the same errno, so errors.Is(err, syscall.ENOENT) works.
func (e *Error) Is(target error) bool {
	if t, ok := target.(syscall.Errno); ok {
		return t == e.Errno
	}
	return false
}

// GRPCStatus converts the error into a gRPC status with an ErrorInfo detail;
// the gRPC server uses it automatically.
func (e *Error) GRPCStatus() *status.Status {
	st := status.New(e.Code, e.Error())
	if d, err := st.WithDetails(&metapb.ErrorInfo{Errno: uint32(e.Errno), ConflictStripes: e.ConflictStripes}); err == nil {
		return d
	}
	return st
}

// New returns an Error for errno with the gRPC code that fits it.
func New(errno syscall.Errno, format string, args ...any) *Error {
	return &Error{Errno: errno, Code: codeFor(errno), Msg: fmt.Sprintf(format, args...)}
}

// Conflict returns the error of a CommitStripes call whose compare-and-set
// failed for the given stripes.
func Conflict(stripes []uint64, format string, args ...any) *Error {
	return &Error{Errno: syscall.EAGAIN, Code: codes.Aborted, Msg: fmt.Sprintf(format, args...), ConflictStripes: stripes}
}

// Unavailable returns an error for a cluster that cannot serve the request
// now but may soon, such as too few live chunkservers for a layout: errno
// EHOSTDOWN, which writers wait out (bounded) instead of reporting.
func Unavailable(format string, args ...any) *Error {
	return &Error{Errno: syscall.EHOSTDOWN, Code: codes.FailedPrecondition, Msg: fmt.Sprintf(format, args...)}
}

func codeFor(e syscall.Errno) codes.Code {
	switch e {
	case syscall.ENOENT, syscall.ENODATA:
		return codes.NotFound
	case syscall.EEXIST:
		return codes.AlreadyExists
	case syscall.EACCES, syscall.EPERM:
		return codes.PermissionDenied
	case syscall.ENOTEMPTY, syscall.ENOTDIR, syscall.EISDIR, syscall.EBUSY, syscall.EMLINK, syscall.EXDEV, syscall.EHOSTDOWN:
		return codes.FailedPrecondition
	case syscall.ENOSPC, syscall.E2BIG, syscall.EFBIG:
		return codes.ResourceExhausted
	case syscall.EAGAIN:
		return codes.Aborted
	case syscall.EOPNOTSUPP:
		return codes.Unimplemented
	case syscall.EIO:
		return codes.Internal
	default:
		return codes.InvalidArgument
	}
}

func errnoName(e syscall.Errno) string {
	switch e {
	case syscall.ENOENT:
		return "ENOENT"
	case syscall.EEXIST:
		return "EEXIST"
	case syscall.ENOTEMPTY:
		return "ENOTEMPTY"
	case syscall.ENOTDIR:
		return "ENOTDIR"
	case syscall.EISDIR:
		return "EISDIR"
	case syscall.EACCES:
		return "EACCES"
	case syscall.EPERM:
		return "EPERM"
	case syscall.EINVAL:
		return "EINVAL"
	case syscall.ENAMETOOLONG:
		return "ENAMETOOLONG"
	case syscall.ENODATA:
		return "ENODATA"
	case syscall.ERANGE:
		return "ERANGE"
	case syscall.ENOSPC:
		return "ENOSPC"
	case syscall.EBUSY:
		return "EBUSY"
	case syscall.EMLINK:
		return "EMLINK"
	case syscall.E2BIG:
		return "E2BIG"
	case syscall.EAGAIN:
		return "EAGAIN"
	case syscall.EOPNOTSUPP:
		return "EOPNOTSUPP"
	case syscall.EIO:
		return "EIO"
	case syscall.EBADF:
		return "EBADF"
	case syscall.ESTALE:
		return "ESTALE"
	case syscall.EHOSTDOWN:
		return "EHOSTDOWN"
	}
	return fmt.Sprintf("errno %d", int(e))
}

// Errno returns the POSIX errno an error stands for: the errno of an *Error
// (also when wrapped), the errno carried in a gRPC status detail, a mapping
// of the gRPC code when no detail is present, 0 for nil, and EIO otherwise.
func Errno(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	var me *Error
	if errors.As(err, &me) {
		return me.Errno
	}
	var en syscall.Errno
	if errors.As(err, &en) {
		return en
	}
	st, ok := status.FromError(err)
	if !ok {
		return syscall.EIO
	}
	for _, d := range st.Details() {
		if info, ok := d.(*metapb.ErrorInfo); ok && info.Errno != 0 {
			return syscall.Errno(info.Errno)
		}
	}
	switch st.Code() {
	case codes.NotFound:
		return syscall.ENOENT
	case codes.AlreadyExists:
		return syscall.EEXIST
	case codes.PermissionDenied, codes.Unauthenticated:
		return syscall.EACCES
	case codes.InvalidArgument:
		return syscall.EINVAL
	case codes.Aborted:
		return syscall.EAGAIN
	case codes.ResourceExhausted:
		return syscall.ENOSPC
	case codes.Canceled:
		return syscall.EINTR
	case codes.DeadlineExceeded:
		return syscall.ETIMEDOUT
	case codes.Unavailable:
		return syscall.EAGAIN
	}
	return syscall.EIO
}

// ConflictStripes returns the stripes that lost the compare-and-set in a
// failed CommitStripes call, or nil if err is not such a conflict.
func ConflictStripes(err error) []uint64 {
	var me *Error
	if errors.As(err, &me) {
		return me.ConflictStripes
	}
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.Aborted {
		return nil
	}
	for _, d := range st.Details() {
		if info, ok := d.(*metapb.ErrorInfo); ok {
			return info.ConflictStripes
		}
	}
	return nil
}
