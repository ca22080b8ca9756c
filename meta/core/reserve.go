package core

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Name reservations let a client answer a create before meta has applied it.
// A Lookup with reserve that finds no entry holds the name for the caller's
// session for ReserveTTL; the client, having seen the reservation in time,
// answers the kernel's create at once with an inode number of its own range
// and sends the create behind (CreateRequest.ino). Meanwhile every operation
// that could make that create fail waits: a name-creating call of another
// session on the same name, and the calls of other sessions that change the
// directory's permissions or remove it. A client's deadline is half the TTL
// from before it sent the lookup, so its create is sent while meta still
// holds the name. After a start with live sessions, when the reservations
// of the previous server are lost, those calls wait for ReserveGrace, long
// enough for clients to replay their creates.

// maxReservations bounds the names held at once; past it lookups reserve
// nothing (their creates go the synchronous way).
const maxReservations = 1 << 16

// reservation is a name held by a session; done is closed when it ends.
type reservation struct {
	session uint64
	expires time.Time
	busy    int // calls of the holder running on the name (not expired meanwhile)
	done    chan struct{}
}

type nameKey struct {
	dir  uint64
	name string
}

// reservations is the names held: by name and by directory.
type reservations struct {
	mu         sync.Mutex
	names      map[nameKey]*reservation
	dirs       map[uint64]int // names held per directory
	graceUntil time.Time
	leases     leases       // directory leases (lease.go)
	nLeases    atomic.Int64 // leases held: calls skip the lease check when 0
	nFences    atomic.Int64 // fences standing: creates and locks skip them when 0
}

func (r *reservations) init(graceUntil time.Time) {
	r.names = map[nameKey]*reservation{}
	r.dirs = map[uint64]int{}
	r.graceUntil = graceUntil
	r.leases.init()
}

// live returns the reservation of k if it has not ended, dropping it if it
// has expired (caller holds r.mu).
func (r *reservations) live(k nameKey, now time.Time) *reservation {
	res := r.names[k]
	if res == nil {
		return nil
	}
	if res.busy == 0 && !now.Before(res.expires) {
		r.dropLocked(k, res)
		return nil
	}
	return res
}

func (r *reservations) dropLocked(k nameKey, res *reservation) {
	delete(r.names, k)
	if r.dirs[k.dir]--; r.dirs[k.dir] <= 0 {
		delete(r.dirs, k.dir)
	}
	close(res.done)
}

// reserve holds (dir, name) for session until now+ttl, unless another
// session holds it; it reports whether session holds it now.
func (r *reservations) reserve(session, dir uint64, name string, now time.Time, ttl time.Duration) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.otherLeaseLocked(session, dir) != nil {
		return false
	}
	k := nameKey{dir, name}
	if res := r.live(k, now); res != nil {
		if res.session != session {
			return false
		}
		res.expires = now.Add(ttl)
		return true
	}
	if len(r.names) >= maxReservations {
		r.sweepLocked(now)
		if len(r.names) >= maxReservations {
			return false
		}
	}
	r.names[k] = &reservation{session: session, expires: now.Add(ttl), done: make(chan struct{})}
	r.dirs[dir]++
	return true
}

// unreserve drops session's reservation of (dir, name) unless a call of the
// holder is running on it.
func (r *reservations) unreserve(session, dir uint64, name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := nameKey{dir, name}
	if res := r.names[k]; res != nil && res.session == session && res.busy == 0 {
		r.dropLocked(k, res)
	}
}

func (r *reservations) sweepLocked(now time.Time) {
	for k, res := range r.names {
		if res.busy == 0 && !now.Before(res.expires) {
			r.dropLocked(k, res)
		}
	}
}

// dropSession ends every reservation, lease and fence of session and
// returns the files whose fences it lifted.
func (r *reservations) dropSession(session uint64) []uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	unfenced := r.dropSessionLeasesLocked(session)
	for k, res := range r.names {
		if res.session == session {
			r.dropLocked(k, res)
		}
	}
	return unfenced
}

// acquireName waits until no other session holds (dir, name) (and, unless
// replay, until the grace after the start has passed), then holds the name
// for session while its call runs; release must follow. A call of the
// holder itself does not wait: this is how its create consumes the
// reservation.
func (s *Service) acquireName(ctx context.Context, session, dir uint64, name string, replay bool) (release func(), err error) {
	r := &s.reserved
	k := nameKey{dir, name}
	for {
		if err := s.waitGrace(ctx, replay); err != nil {
			return nil, err
		}
		now := s.now()
		r.mu.Lock()
		if l := r.otherLeaseLocked(session, dir); l != nil {
			wait := s.recallLocked(l, now)
			r.mu.Unlock()
			if err := waitFor(ctx, l.done, wait); err != nil {
				return nil, err
			}
			continue
		}
		res := r.live(k, now)
		if res == nil || (session != 0 && res.session == session) {
			if res == nil {
				res = &reservation{session: session, done: make(chan struct{})}
				r.names[k] = res
				r.dirs[dir]++
			}
			res.busy++
			r.mu.Unlock()
			// The holder's call consumed the name: it ends once the call's
			// transaction is readable (afterLogged), so that no other
			// session finds the name free before it can see the change.
			return func() {
				afterLogged(ctx, func() {
					r.mu.Lock()
					defer r.mu.Unlock()
					if res.busy--; res.busy == 0 && r.names[k] == res {
						r.dropLocked(k, res)
					}
				})
			}, nil
		}
		wait := res.expires.Sub(now)
		if res.busy > 0 {
			wait = time.Hour // another call on the name: until it ends
		}
		r.mu.Unlock()
		if err := waitFor(ctx, res.done, wait); err != nil {
			return nil, err
		}
	}
}

// awaitDir waits until no session other than session holds a name in dir
// or its lease: a change of dir's permissions or its removal must not make
// a create the holder has answered fail.
func (s *Service) awaitDir(ctx context.Context, session, dir uint64) error {
	r := &s.reserved
	for {
		if err := s.waitGrace(ctx, false); err != nil {
			return err
		}
		if err := s.awaitLease(ctx, session, dir); err != nil {
			return err
		}
		now := s.now()
		r.mu.Lock()
		if r.dirs[dir] == 0 {
			r.mu.Unlock()
			return nil
		}
		var other *reservation
		var otherKey nameKey
		for k, res := range r.names {
			if k.dir == dir && res.session != session {
				other, otherKey = res, k
				break
			}
		}
		if other == nil {
			r.mu.Unlock()
			return nil
		}
		if other.busy == 0 && !now.Before(other.expires) {
			r.dropLocked(otherKey, other)
			r.mu.Unlock()
			continue
		}
		wait := other.expires.Sub(now)
		if other.busy > 0 {
			wait = time.Hour
		}
		r.mu.Unlock()
		if err := waitFor(ctx, other.done, wait); err != nil {
			return err
		}
	}
}

// waitGrace waits, unless replay, until the grace after the start is over.
func (s *Service) waitGrace(ctx context.Context, replay bool) error {
	if replay {
		return nil
	}
	s.reserved.mu.Lock()
	until := s.reserved.graceUntil
	s.reserved.mu.Unlock()
	if until.IsZero() {
		return nil
	}
	if d := until.Sub(s.now()); d > 0 {
		if err := waitFor(ctx, nil, d); err != nil {
			return err
		}
	}
	s.reserved.mu.Lock()
	s.reserved.graceUntil = time.Time{}
	s.reserved.mu.Unlock()
	return nil
}

// waitFor waits until done is closed, d has passed or ctx ends. A call of
// a chain first lets the chain's calls before it be logged, which releases
// the names they hold: another session this call waits for may be waiting
// for one of them.
func waitFor(ctx context.Context, done <-chan struct{}, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	if err := waitChain(ctx); err != nil {
		return err
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return nil
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
