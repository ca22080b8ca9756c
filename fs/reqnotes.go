package fs

import (
	"context"
	"sync"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// reqNotes carries what go-fuse's node API does not pass on from a raw
// request to the node method serving it (a FLUSH's lock owner, a WRITE's
// or OPEN's request to clear set-user-ID): rawFS notes it under the
// request's cancel channel, unique while the request runs, and the node
// method finds it through its request context.
type reqNotes[T any] struct{ m sync.Map }

// note records v for the request of cancel until the returned function is
// called (when the request has been served).
func (r *reqNotes[T]) note(cancel <-chan struct{}, v T) (done func()) {
	r.m.Store(cancel, v)
	return func() { r.m.Delete(cancel) }
}

// of returns what was noted for the request of ctx, the request's own
// context (not one derived from it).
func (r *reqNotes[T]) of(ctx context.Context) (T, bool) {
	var zero T
	fc, ok := ctx.(*fuse.Context)
	if !ok {
		return zero, false
	}
	v, ok := r.m.Load(fc.Cancel)
	if !ok {
		return zero, false
	}
	return v.(T), true
}
