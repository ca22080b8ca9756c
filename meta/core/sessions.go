package core

import (
	"context"
	"fmt"
	"syscall"
	"time"

	"github.com/rdmafs/rdmafs/meta/auth"
	"github.com/rdmafs/rdmafs/meta/keys"
	"github.com/rdmafs/rdmafs/meta/kv"
	"github.com/rdmafs/rdmafs/meta/metaerr"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// OpenSession implements metapb.MetaServer. A session holds a client's open
// files; it ends with CloseSession or when no keepalive arrives within its TTL.
func (s *Service) OpenSession(ctx context.Context, req *metapb.OpenSessionRequest) (*metapb.OpenSessionReply, error) {
	ttl := time.Duration(req.TtlMs) * time.Millisecond
	if ttl <= 0 {
		ttl = s.cfg.SessionTTL
	}
	ttl = min(max(ttl, 100*time.Millisecond), time.Hour)
	var id uint64
	err := s.update(ctx, func(t kv.Txn) error {
		var err error
		if id, err = nextID(t, counterSession, 1); err != nil {
			return err
		}
		rec := &metapb.SessionRecord{Client: req.Client, TtlMs: ttl.Milliseconds(), OpenedNs: s.now().UnixNano()}
		if tok, ok := auth.TokenFrom(ctx); ok {
			rec.TokenId = tok.ID[:]
		}
		return putMsg(t, keys.Session(id), rec)
	})
	if err != nil {
		return nil, err
	}
	s.sessMu.Lock()
	s.sessions[id] = s.now()
	s.sessTTL[id] = ttl
	s.sessMu.Unlock()
	s.log.Info("session opened", "session", id, "client", req.Client, "ttl", ttl)
	return &metapb.OpenSessionReply{SessionId: id, TtlMs: ttl.Milliseconds()}, nil
}

// maxInoRanges is how many AllocInodes ranges a session record keeps: the
// one a client uses and the ones it fetched ahead.
const maxInoRanges = 4

// maxAllocInodes bounds one AllocInodes call.
const maxAllocInodes = 1 << 16

// AllocInodes implements metapb.MetaServer: it gives the session a range of
// inode numbers for creates it answers before sending them. The range is
// durable before the reply, so that a create replayed after a crash of the
// server's machine still finds it.
func (s *Service) AllocInodes(ctx context.Context, req *metapb.AllocInodesRequest) (*metapb.AllocInodesReply, error) {
	if req.Count == 0 || req.Count > maxAllocInodes {
		return nil, metaerr.New(syscall.EINVAL, "allocate %d inodes: want 1 to %d", req.Count, maxAllocInodes)
	}
	if err := s.checkSession(req.SessionId); err != nil {
		return nil, err
	}
	var first uint64
	err := s.update(ctx, func(t kv.Txn) error {
		rec := &metapb.SessionRecord{}
		if ok, err := getMsg(t, keys.Session(req.SessionId), rec); err != nil {
			return err
		} else if !ok {
			return metaerr.New(syscall.ESTALE, "session %d expired or unknown", req.SessionId)
		}
		var err error
		if first, err = nextID(t, counterIno, uint64(req.Count)); err != nil {
			return err
		}
		rec.InoRanges = append(rec.InoRanges, &metapb.InoRange{First: first, End: first + uint64(req.Count)})
		if n := len(rec.InoRanges); n > maxInoRanges {
			rec.InoRanges = rec.InoRanges[n-maxInoRanges:]
		}
		return putMsg(t, keys.Session(req.SessionId), rec)
	})
	if err != nil {
		return nil, err
	}
	return &metapb.AllocInodesReply{First: first, Count: req.Count}, nil
}

// KeepAlive implements metapb.MetaServer.
func (s *Service) KeepAlive(ctx context.Context, req *metapb.KeepAliveRequest) (*metapb.Empty, error) {
	s.sessMu.Lock()
	defer s.sessMu.Unlock()
	if _, ok := s.sessions[req.SessionId]; !ok {
		return nil, metaerr.New(syscall.ESTALE, "session %d expired or unknown", req.SessionId)
	}
	s.sessions[req.SessionId] = s.now()
	return &metapb.Empty{}, nil
}

// CloseSession implements metapb.MetaServer: it releases every open of the
// session, deleting unlinked files nobody else holds open.
func (s *Service) CloseSession(ctx context.Context, req *metapb.CloseSessionRequest) (*metapb.Empty, error) {
	if out, ok, err := storedReply[*metapb.Empty](s, ctx); err != nil || ok {
		return out, err
	}
	if err := s.checkSession(req.SessionId); err != nil {
		return nil, err
	}
	return &metapb.Empty{}, s.endSession(ctx, req.SessionId, "closed")
}

func (s *Service) checkSession(id uint64) error {
	s.sessMu.Lock()
	defer s.sessMu.Unlock()
	if _, ok := s.sessions[id]; !ok {
		return metaerr.New(syscall.ESTALE, "session %d expired or unknown", id)
	}
	return nil
}

func (s *Service) endSession(ctx context.Context, id uint64, why string) error {
	var purged int64
	var locked []uint64
	out := &metapb.Empty{}
	_, err := updateOnce(s, ctx, &out, func(t kv.Txn) error {
		purged = 0
		var err error
		if locked, err = dropSessionLocks(t, id); err != nil {
			return err
		}
		var inos []uint64
		prefix := keys.SessionOpenPrefix(id)
		if err := t.Scan(prefix, kv.PrefixEnd(prefix), 0, func(k, v []byte) error {
			_, ino, err := keys.ParseSessionOpen(k)
			if err != nil {
				return err
			}
			inos = append(inos, ino)
			return nil
		}); err != nil {
			return err
		}
		for _, ino := range inos {
			n, err := s.releaseAll(t, ino, id)
			if err != nil {
				return err
			}
			purged += n
		}
		return t.Delete(keys.Session(id))
	})
	if err != nil {
		return fmt.Errorf("end session %d: %w", id, err)
	}
	s.inodes.Add(-purged)
	s.sessMu.Lock()
	delete(s.sessions, id)
	delete(s.sessTTL, id)
	s.sessMu.Unlock()
	locked = append(locked, s.reserved.dropSession(id)...)
	for _, ino := range locked {
		s.lockChanged(ino)
	}
	s.log.Info("session ended", "session", id, "why", why, "purged_inodes", purged)
	return nil
}

// expireSessions ends the sessions whose keepalives stopped.
func (s *Service) expireSessions(ctx context.Context) error {
	now := s.now()
	var expired []uint64
	s.sessMu.Lock()
	for id, last := range s.sessions {
		if now.Sub(last) > s.sessTTL[id] {
			expired = append(expired, id)
		}
	}
	s.sessMu.Unlock()
	for _, id := range expired {
		if err := s.endSession(ctx, id, "expired"); err != nil {
			return err
		}
	}
	return nil
}

// Sessions returns the number of live sessions.
func (s *Service) Sessions() int {
	s.sessMu.Lock()
	defer s.sessMu.Unlock()
	return len(s.sessions)
}

// Open implements metapb.MetaServer.
func (s *Service) Open(ctx context.Context, req *metapb.OpenRequest) (*metapb.AttrReply, error) {
	c := caller(req.Caller)
	if err := s.checkSession(req.SessionId); err != nil {
		return nil, err
	}
	var out *metapb.AttrReply
	_, err := updateOnce(s, ctx, &out, func(t kv.Txn) error {
		rec, err := getInode(t, req.Ino)
		if err != nil {
			return err
		}
		if err := s.openInTxn(t, c, rec, req.SessionId, req.Flags); err != nil {
			return err
		}
		if req.Flags&syscall.O_TRUNC != 0 && isReg(rec.Attr) {
			if err := s.truncateOnOpen(t, rec); err != nil {
				return err
			}
		}
		out = &metapb.AttrReply{Attr: rec.Attr}
		return nil
	})
	return out, err
}

// truncateOnOpen truncates rec to 0 for an open with O_TRUNC, as
// truncate(2) would, in the open's transaction: its times change, and its
// capabilities go as a truncate drops them (the mount asks the kernel to
// pass O_TRUNC with the open instead of a truncate before it).
func (s *Service) truncateOnOpen(t kv.Txn, rec *metapb.InodeRecord) error {
	if err := truncateStripes(t, rec, 0, false); err != nil {
		return err
	}
	now := s.now().UnixNano()
	rec.Attr.Size, rec.Attr.MtimeNs, rec.Attr.CtimeNs = 0, now, max(now, rec.Attr.CtimeNs+1)
	caps := keys.Xattr(rec.Attr.Ino, capsXattr)
	if _, ok, err := t.Get(caps); err != nil {
		return err
	} else if ok {
		if err := t.Delete(caps); err != nil {
			return err
		}
	}
	return s.putInode(t, rec)
}

// openInTxn checks the access mode of flags and records the open.
func (s *Service) openInTxn(t kv.Txn, c *metapb.Caller, rec *metapb.InodeRecord, session uint64, flags uint32) error {
	if err := s.checkSession(session); err != nil {
		return err
	}
	var mask uint32
	switch flags & syscall.O_ACCMODE {
	case syscall.O_RDONLY:
		mask = mayRead
	case syscall.O_WRONLY:
		mask = mayWrite
	default:
		mask = mayRead | mayWrite
	}
	if flags&syscall.O_TRUNC != 0 {
		mask |= mayWrite
	}
	if isDir(rec.Attr) && mask&mayWrite != 0 {
		return metaerr.New(syscall.EISDIR, "inode %d is a directory", rec.Attr.Ino)
	}
	if err := checkAccess(caller(c), rec.Attr, mask); err != nil {
		return err
	}
	return addOpen(t, rec.Attr.Ino, session, mask&mayWrite != 0)
}

// openWriter marks, in an open record's count, that the session opened the
// inode for writing at least once while it holds it open: a mount token's
// data calls (grants, commits) need it.
const openWriter = 1 << 63

// addOpen records one more open of ino by session, for writing if write.
func addOpen(t kv.Txn, ino, session uint64, write bool) error {
	n := uint64(0)
	if v, ok, err := t.Get(keys.Open(ino, session)); err != nil {
		return err
	} else if ok {
		if n, err = keys.DecodeUint64(v); err != nil {
			return err
		}
	}
	n = (n&^openWriter + 1) | n&openWriter
	if write {
		n |= openWriter
	}
	if err := t.Put(keys.Open(ino, session), keys.EncodeUint64(n)); err != nil {
		return err
	}
	return t.Put(keys.SessionOpen(session, ino), nil)
}

// MaxReleasesPerCall bounds ReleaseRequest.more.
const MaxReleasesPerCall = 1024

// Release implements metapb.MetaServer: it drops one open of each listed
// inode by the session; the last release of an unlinked file deletes it.
func (s *Service) Release(ctx context.Context, req *metapb.ReleaseRequest) (*metapb.Empty, error) {
	if len(req.More) > MaxReleasesPerCall {
		return nil, metaerr.New(syscall.EINVAL, "%d releases in one call (at most %d)", len(req.More)+1, MaxReleasesPerCall+1)
	}
	var purged int64
	out := &metapb.Empty{}
	_, err := updateOnce(s, ctx, &out, func(t kv.Txn) error {
		purged = 0
		released := 0
		for _, ino := range append([]uint64{req.Ino}, req.More...) {
			v, ok, err := t.Get(keys.Open(ino, req.SessionId))
			if err != nil {
				return err
			}
			if !ok {
				continue
			}
			released++
			n, err := keys.DecodeUint64(v)
			if err != nil {
				return err
			}
			if n&^openWriter > 1 {
				if err := t.Put(keys.Open(ino, req.SessionId), keys.EncodeUint64(n-1)); err != nil {
					return err
				}
				continue
			}
			p, err := s.releaseAll(t, ino, req.SessionId)
			if err != nil {
				return err
			}
			purged += p
		}
		if released == 0 {
			return metaerr.New(syscall.EBADF, "inode %d is not open in session %d", req.Ino, req.SessionId)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	s.inodes.Add(-purged)
	return &metapb.Empty{}, nil
}

// releaseAll drops every open of ino by session and deletes the inode if it
// is an orphan nobody holds open any more.
func (s *Service) releaseAll(t kv.Txn, ino, session uint64) (int64, error) {
	if err := t.Delete(keys.Open(ino, session)); err != nil {
		return 0, err
	}
	if err := t.Delete(keys.SessionOpen(session, ino)); err != nil {
		return 0, err
	}
	if _, orphan, err := t.Get(keys.Orphan(ino)); err != nil || !orphan {
		return 0, err
	}
	if open, err := isOpen(t, ino); err != nil || open {
		return 0, err
	}
	rec, err := getInode(t, ino)
	if err != nil {
		return 0, err
	}
	return 1, s.purgeInode(t, rec)
}

func isOpen(r kv.Reader, ino uint64) (bool, error) {
	open := false
	prefix := keys.OpenPrefix(ino)
	err := r.Scan(prefix, kv.PrefixEnd(prefix), 1, func(k, v []byte) error {
		open = true
		return kv.ErrStop
	})
	return open, err
}

func openedBy(r kv.Reader, ino, session uint64) (bool, error) {
	_, ok, err := r.Get(keys.Open(ino, session))
	return ok, err
}

// opensOf calls fn with each session that has ino open and whether it
// opened it for writing.
func opensOf(r kv.Reader, ino uint64, fn func(session uint64, write bool) error) error {
	prefix := keys.OpenPrefix(ino)
	return r.Scan(prefix, kv.PrefixEnd(prefix), 0, func(k, v []byte) error {
		_, session, err := keys.ParseOpen(k)
		if err != nil {
			return err
		}
		n, err := keys.DecodeUint64(v)
		if err != nil {
			return err
		}
		return fn(session, n&openWriter != 0)
	})
}

// purgeInode deletes an inode with its xattrs, stripes and outstanding
// grants; the chunks of its stripes are queued for garbage collection.
func (s *Service) purgeInode(t kv.Txn, rec *metapb.InodeRecord) error {
	ino := rec.Attr.Ino
	if s.quotas.n.Load() > 0 {
		// What a deleted inode counted for (it may still have had a link
		// in the store: dropLink deletes without storing it first).
		old := &metapb.InodeRecord{}
		if ok, err := getMsg(t, keys.Inode(ino), old); err != nil {
			return err
		} else if ok {
			if err := s.account(t, old, nil); err != nil {
				return err
			}
		}
	}
	for _, prefix := range [][]byte{keys.XattrPrefix(ino)} {
		if err := deletePrefix(t, prefix); err != nil {
			return err
		}
	}
	if err := truncateStripes(t, rec, 0, true); err != nil {
		return err
	}
	if err := dropGrants(t, ino, func(stripe, version uint64) bool { return true }); err != nil {
		return err
	}
	if err := t.Delete(keys.Orphan(ino)); err != nil {
		return err
	}
	if isDir(rec.Attr) {
		if err := t.Delete(keys.Snapshot(ino)); err != nil { // a snapshot's record
			return err
		}
	}
	return t.Delete(keys.Inode(ino))
}

func deletePrefix(t kv.Txn, prefix []byte) error {
	var ks [][]byte
	if err := t.Scan(prefix, kv.PrefixEnd(prefix), 0, func(k, v []byte) error {
		ks = append(ks, append([]byte{}, k...))
		return nil
	}); err != nil {
		return err
	}
	for _, k := range ks {
		if err := t.Delete(k); err != nil {
			return err
		}
	}
	return nil
}
