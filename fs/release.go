package fs

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/rdmafs/rdmafs/meta/metapb"
)

// releaseTimeout bounds one call carrying releases (the meta client retries
// and fails over within it).
const releaseTimeout = time.Minute

// maxReleaseBatch is how many releases one call carries at most (meta's
// limit: core.MaxReleasesPerCall + 1).
const maxReleaseBatch = 1025

// releaser sends the releases of closed files' opens to meta. A release
// waits for nothing: while a call is in flight the next ones queue up and go
// together in the following call, so a stream of small files costs one
// release call per batch, not per file. An unlinked file held open is
// deleted when its last release arrives, a moment after its close.
type releaser struct {
	meta    metapb.MetaClient
	session uint64
	early   Early // nil: releases go in calls of their own
	log     *slog.Logger

	mu      sync.Mutex
	queue   []uint64
	sending bool // a goroutine is sending the queue
	idle    chan struct{}
}

// add queues one release of ino and makes sure it is sent: behind the
// mount's other calls when it sends some behind (early.go).
func (r *releaser) add(ino uint64) {
	if r.early != nil && r.early.ReleaseBehind(ino, r.failed) {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.queue = append(r.queue, ino)
	if !r.sending {
		r.sending = true
		r.idle = make(chan struct{})
		go r.send()
	}
}

// send sends the queue in batches until it is empty.
func (r *releaser) send() {
	var batch []uint64
	for {
		r.mu.Lock()
		n := min(len(r.queue), maxReleaseBatch)
		if n == 0 {
			r.sending = false
			close(r.idle)
			r.mu.Unlock()
			return
		}
		batch = append(batch[:0], r.queue[:n]...)
		r.queue = append(r.queue[:0], r.queue[n:]...)
		r.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
		_, err := r.meta.Release(ctx, &metapb.ReleaseRequest{Ino: batch[0], SessionId: r.session, More: batch[1:]})
		cancel()
		if err != nil {
			r.log.Warn("release", "inodes", len(batch), "first", batch[0], "err", err)
		}
	}
}

// failed logs a release sent behind that failed.
func (r *releaser) failed(err error) {
	if err != nil {
		r.log.Warn("release", "err", err)
	}
}

// wait returns once every release queued so far has been sent.
func (r *releaser) wait(ctx context.Context) error {
	if r.early != nil {
		if err := r.early.WaitBehind(ctx); err != nil {
			return err
		}
	}
	r.mu.Lock()
	idle, sending := r.idle, r.sending
	r.mu.Unlock()
	if !sending {
		return nil
	}
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// WaitReleases returns once the releases of every file closed so far have
// reached the metadata service (before an unmount closes the session, and
// for tests).
func (fsys *FS) WaitReleases(ctx context.Context) error { return fsys.releases.wait(ctx) }
