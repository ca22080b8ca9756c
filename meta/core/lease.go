package core

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"slices"
	"syscall"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/rdmafs/rdmafs/meta/keys"
	"github.com/rdmafs/rdmafs/meta/kv"
	"github.com/rdmafs/rdmafs/meta/metaerr"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// Directory leases let one session answer lookups of missing names and
// creates in a directory by itself, as CephFS's directory capabilities do.
// A Lookup with lease of a missing name grants the session the directory's
// lease with the list of its names, unless another session holds it, holds
// or is creating a name in it, or it was recalled within LeaseBackoff (two
// sessions sharing a directory would hand the lease back and forth). While
// the lease is held, every call of another session that reads the
// directory's entries or attributes or changes them first recalls it: the
// holder hears of the recall through its Recalls call, stops answering for
// the directory, sends every call it answered early, and gives the lease
// back; then the call goes on. A holder that does not give it back within
// LeaseRecallTimeout, or has not called Recalls for LeaseSilence (a dead
// mount), loses it without being asked. Leases live in this server's memory:
// its epoch, in every grant and Recalls reply, tells the holders of another
// run's leases that they hold nothing.
//
// A holder decides the locks of the files it created under its lease by
// itself and sends them behind (fs/locks.go). A lease taken back without
// being given back leaves a fence: until its holder gives it back (which it
// does once its calls behind are sent) or its session ends, locks of other
// sessions on the files created under it wait, as they would for the locks
// the holder may have granted and not sent yet.

// MaxLeaseNames is the most entries a directory may have to be leased: the
// grant lists them all, at most 2 MiB with names of NAME_MAX bytes, half of
// gRPC's default bound on a message the mount receives.
const MaxLeaseNames = 8192

// maxLeases bounds the leases held at once.
const maxLeases = 1 << 16

// dirLease is a directory held by a session; done is closed when it ends.
type dirLease struct {
	id, dir, session uint64
	recalledAt       time.Time // zero until recalled
	done             chan struct{}
	created          []uint64 // files the holder created under it
}

// fence is what a lease taken back from its holder leaves: the files the
// holder created under it, whose locks other sessions wait for.
type fence struct {
	session, dir uint64
	inos         []uint64
}

// leaseHolder is what meta keeps of a session that calls Recalls.
type leaseHolder struct {
	recall   []uint64      // lease ids to recall, not yet delivered
	wake     chan struct{} // a recall is waiting (cap 1)
	polling  int           // Recalls calls waiting
	lastPoll time.Time     // when the last one returned
}

// leases is the table of directory leases; it shares reservations' mutex,
// since a grant and a reservation of a name in the same directory exclude
// each other.
type leases struct {
	epoch     uint64
	next      uint64
	byDir     map[uint64]*dirLease
	byID      map[uint64]*dirLease
	holders   map[uint64]*leaseHolder
	contended map[uint64]time.Time // directory → when its lease was last recalled
	fences    map[uint64]*fence    // lease id → what it left
	fenced    map[uint64]uint64    // file → the lease id of its fence
}

func (l *leases) init() {
	var b [8]byte
	_, _ = rand.Read(b[:])
	l.epoch = binary.LittleEndian.Uint64(b[:]) | 1
	l.byDir = map[uint64]*dirLease{}
	l.byID = map[uint64]*dirLease{}
	l.holders = map[uint64]*leaseHolder{}
	l.contended = map[uint64]time.Time{}
	l.fences = map[uint64]*fence{}
	l.fenced = map[uint64]uint64{}
}

// dropLeaseLocked ends a lease (caller holds reservations.mu).
func (r *reservations) dropLeaseLocked(l *dirLease) {
	delete(r.leases.byDir, l.dir)
	delete(r.leases.byID, l.id)
	r.nLeases.Add(-1)
	close(l.done)
}

// takeBackLocked ends a lease its holder did not give back, fencing the
// files it created under it, and those whose creates it sent before it
// learns of the loss (noteCreated adds them).
func (r *reservations) takeBackLocked(l *dirLease) {
	// The fence stands before the lease goes, so that a create that reads
	// both counts without the lock (noteCreated) never sees neither.
	r.leases.fences[l.id] = &fence{session: l.session, dir: l.dir, inos: l.created}
	r.nFences.Add(1)
	for _, ino := range l.created {
		r.leases.fenced[ino] = l.id
	}
	r.dropLeaseLocked(l)
}

// liftFenceLocked removes fence id and returns its files, whose lock
// waiters the caller wakes.
func (r *reservations) liftFenceLocked(id uint64) []uint64 {
	f := r.leases.fences[id]
	if f == nil {
		return nil
	}
	delete(r.leases.fences, id)
	r.nFences.Add(-1)
	for _, ino := range f.inos {
		if r.leases.fenced[ino] == id {
			delete(r.leases.fenced, ino)
		}
	}
	return f.inos
}

// noteCreated records that session created ino in dir: under its lease, or
// under one taken back from it whose fence still stands.
func (r *reservations) noteCreated(session, dir, ino uint64) {
	if r.nLeases.Load() == 0 && r.nFences.Load() == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if l := r.leases.byDir[dir]; l != nil && l.session == session {
		l.created = append(l.created, ino)
		return
	}
	for id, f := range r.leases.fences {
		if f.session == session && f.dir == dir {
			f.inos = append(f.inos, ino)
			r.leases.fenced[ino] = id
			return
		}
	}
}

// fencedBy returns the session whose fence keeps session's locks of ino
// waiting, or 0.
func (r *reservations) fencedBy(session, ino uint64) uint64 {
	if r.nFences.Load() == 0 {
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if id, ok := r.leases.fenced[ino]; ok {
		if f := r.leases.fences[id]; f.session != session {
			return f.session
		}
	}
	return 0
}

// otherLeaseLocked returns the lease of dir if a session other than session
// holds it.
func (r *reservations) otherLeaseLocked(session, dir uint64) *dirLease {
	if l := r.leases.byDir[dir]; l != nil && l.session != session {
		return l
	}
	return nil
}

// recallLocked asks l's holder for it back (once) and returns how long the
// caller may wait for it; 0 means the lease was taken back at once (its
// holder is gone, or did not answer in time).
func (s *Service) recallLocked(l *dirLease, now time.Time) time.Duration {
	r := &s.reserved
	h := r.leases.holders[l.session]
	if l.recalledAt.IsZero() {
		l.recalledAt = now
		if len(r.leases.contended) >= maxLeases {
			for dir, t := range r.leases.contended { // past the backoff: forgotten
				if now.Sub(t) >= s.cfg.LeaseBackoff {
					delete(r.leases.contended, dir)
				}
			}
		}
		r.leases.contended[l.dir] = now
		if h != nil {
			h.recall = append(h.recall, l.id)
			select {
			case h.wake <- struct{}{}:
			default:
			}
		}
	}
	if h == nil || (h.polling == 0 && now.Sub(h.lastPoll) > s.cfg.LeaseSilence) {
		r.takeBackLocked(l)
		return 0
	}
	left := l.recalledAt.Add(s.cfg.LeaseRecallTimeout).Sub(now)
	if left <= 0 {
		s.log.Warn("a directory lease was not given back in time: taken back", "dir", l.dir, "session", l.session)
		r.takeBackLocked(l)
		return 0
	}
	// Wake up now and then to notice a holder that went silent.
	return min(left, s.cfg.LeaseSilence/4)
}

// awaitLease returns once no session other than session holds dir's lease,
// recalling it if one does.
func (s *Service) awaitLease(ctx context.Context, session, dir uint64) error {
	r := &s.reserved
	if r.nLeases.Load() == 0 {
		return nil
	}
	for {
		r.mu.Lock()
		l := r.otherLeaseLocked(session, dir)
		if l == nil {
			r.mu.Unlock()
			return nil
		}
		wait := s.recallLocked(l, s.now())
		r.mu.Unlock()
		if err := waitFor(ctx, l.done, wait); err != nil {
			return err
		}
	}
}

// grantLease gives session dir's lease, if it may have it; nil if not. The
// caller lists the directory's names after the grant, so that any change
// by another session after the listing recalls the lease first.
func (s *Service) grantLease(session, dir uint64) *dirLease {
	r := &s.reserved
	now := s.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	h := r.leases.holders[session]
	if h == nil || (h.polling == 0 && now.Sub(h.lastPoll) > s.cfg.LeaseSilence/2) {
		return nil // the session does not listen for recalls
	}
	if l := r.leases.byDir[dir]; l != nil {
		return nil // held (by session itself: it asked again, having lost track)
	}
	if t, ok := r.leases.contended[dir]; ok {
		if now.Sub(t) < s.cfg.LeaseBackoff {
			return nil
		}
		delete(r.leases.contended, dir)
	}
	if len(r.leases.byID) >= maxLeases {
		return nil
	}
	if r.dirs[dir] > 0 {
		for k, res := range r.names {
			if k.dir == dir && res.session != session && r.live(k, now) != nil {
				return nil // another session holds or is creating a name in it
			}
		}
	}
	r.leases.next++
	l := &dirLease{id: r.leases.next, dir: dir, session: session, done: make(chan struct{})}
	r.leases.byDir[dir] = l
	r.leases.byID[l.id] = l
	r.nLeases.Add(1)
	return l
}

// releaseLease ends session's lease l if it is still the one granted.
func (s *Service) releaseLease(l *dirLease) {
	r := &s.reserved
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.leases.byID[l.id] == l {
		r.dropLeaseLocked(l)
	}
}

// listNames returns the names of dir's entries, or false if it has more
// than MaxLeaseNames.
func listNames(r kv.Reader, dir uint64) ([]string, bool, error) {
	var names []string
	start := keys.CookiePrefix(dir)
	err := r.Scan(start, kv.PrefixEnd(start), MaxLeaseNames+1, func(_, v []byte) error {
		cr := &metapb.CookieRecord{}
		if err := proto.Unmarshal(v, cr); err != nil {
			return err
		}
		names = append(names, cr.Name)
		return nil
	})
	if err != nil {
		return nil, false, err
	}
	if dir == RootIno {
		names = append(names, TrashName) // there, though no entry records it
	}
	return names, len(names) <= MaxLeaseNames, nil
}

// Recalls implements metapb.MetaServer: it ends the leases the session gives
// back and waits up to LeasePollWait for recalls of those it holds (at once
// for a caller of another epoch).
func (s *Service) Recalls(ctx context.Context, req *metapb.RecallsRequest) (*metapb.RecallsReply, error) {
	if err := s.checkSession(req.SessionId); err != nil {
		return nil, err
	}
	r := &s.reserved
	r.mu.Lock()
	h := r.leases.holders[req.SessionId]
	if h == nil {
		h = &leaseHolder{wake: make(chan struct{}, 1)}
		r.leases.holders[req.SessionId] = h
	}
	var unfenced []uint64
	if req.Epoch == r.leases.epoch {
		for _, id := range req.Release {
			if l := r.leases.byID[id]; l != nil && l.session == req.SessionId {
				r.dropLeaseLocked(l)
			} else if f := r.leases.fences[id]; f != nil && f.session == req.SessionId {
				unfenced = append(unfenced, r.liftFenceLocked(id)...)
			}
		}
	}
	if len(unfenced) > 0 {
		r.mu.Unlock()
		for _, ino := range unfenced {
			s.lockChanged(ino)
		}
		r.mu.Lock()
	}
	out := &metapb.RecallsReply{Epoch: r.leases.epoch, SilenceMs: uint32(max(s.cfg.LeaseSilence.Milliseconds(), 1))}
	// A caller that does not know the epoch yet gets it at once.
	if len(h.recall) == 0 && req.Epoch == r.leases.epoch {
		h.polling++
		r.mu.Unlock()
		t := time.NewTimer(s.cfg.LeasePollWait)
		select {
		case <-h.wake:
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
		r.mu.Lock()
		h.polling--
		h.lastPoll = s.now()
		if ctx.Err() != nil {
			r.mu.Unlock() // the recalls wait for the next call
			return nil, metaerr.New(syscall.EINTR, "recalls: %v", ctx.Err())
		}
	}
	out.Recall, h.recall = h.recall, nil
	// A fence lasts until its holder gives the lease back: its recall goes
	// out again with every answer, in case one was lost.
	for id, f := range r.leases.fences {
		if f.session == req.SessionId && !slices.Contains(out.Recall, id) {
			out.Recall = append(out.Recall, id)
		}
	}
	h.lastPoll = s.now()
	r.mu.Unlock()
	return out, nil
}

// dropSessionLeasesLocked ends the leases and fences of a session that
// ended and returns the files whose fences it lifted.
func (r *reservations) dropSessionLeasesLocked(session uint64) []uint64 {
	for _, l := range r.leases.byDir {
		if l.session == session {
			r.dropLeaseLocked(l)
		}
	}
	delete(r.leases.holders, session)
	var unfenced []uint64
	for id, f := range r.leases.fences {
		if f.session == session {
			unfenced = append(unfenced, r.liftFenceLocked(id)...)
		}
	}
	return unfenced
}
