package core

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"

	"google.golang.org/protobuf/proto"

	"github.com/rdmafs/rdmafs/meta/keys"
	"github.com/rdmafs/rdmafs/meta/kv"
	"github.com/rdmafs/rdmafs/meta/metaerr"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// Quotas. A directory quota limits the file data (bytes stored, what
// st_blocks shows) and the inodes below a directory; a user or group quota
// those owned by the user or group in the whole file system. Usage is kept
// in the quota's record and changed in the transaction of every change to
// an inode (putInode, purgeInode): an inode counts, once, while it has a
// link, under the directory it was created in or last renamed into (a hard
// link elsewhere adds nothing) and for its owner and group. A change that
// adds bytes or inodes to a quota already at its limit fails with EDQUOT;
// a write is refused when it asks for grants (GrantWrite), so a writer
// stores at most the grants it already held past the limit. A directory is
// not renamed from under one set of directory quotas to another (EXDEV, as
// XFS project quotas do: mv copies then). The service keeps the set of
// quotas in memory, so that with none every change costs nothing more.

// quotaSet is the set of quotas that exist, for the fast path.
type quotaSet struct {
	mu   sync.RWMutex
	dirs map[uint64]bool
	ids  map[string]bool // keys.IDQuota keys
	n    atomic.Int32
}

func (q *quotaSet) add(key []byte) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.dirs == nil {
		q.dirs, q.ids = map[uint64]bool{}, map[string]bool{}
	}
	if key[0] == keys.PrefixDirQuota {
		ino, _ := keys.ParseDirQuota(key)
		q.dirs[ino] = true
	} else {
		q.ids[string(key)] = true
	}
	q.n.Store(int32(len(q.dirs) + len(q.ids)))
}

func (q *quotaSet) remove(key []byte) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if key[0] == keys.PrefixDirQuota {
		ino, _ := keys.ParseDirQuota(key)
		delete(q.dirs, ino)
	} else {
		delete(q.ids, string(key))
	}
	q.n.Store(int32(len(q.dirs) + len(q.ids)))
}

func (q *quotaSet) has(key []byte) bool {
	if key[0] == keys.PrefixDirQuota {
		ino, _ := keys.ParseDirQuota(key)
		return q.hasDir(ino)
	}
	return q.hasID(key)
}

func (q *quotaSet) hasDir(ino uint64) bool {
	q.mu.RLock()
	defer q.mu.RUnlock()
	return q.dirs[ino]
}

func (q *quotaSet) hasDirs() bool {
	q.mu.RLock()
	defer q.mu.RUnlock()
	return len(q.dirs) > 0
}

func (q *quotaSet) hasID(key []byte) bool {
	q.mu.RLock()
	defer q.mu.RUnlock()
	return q.ids[string(key)]
}

// loadQuotas fills the set from the store.
func (s *Service) loadQuotas(r kv.Reader) error {
	for _, p := range []byte{keys.PrefixDirQuota, keys.PrefixIDQuota} {
		if err := r.Scan([]byte{p}, []byte{p + 1}, 0, func(k, _ []byte) error {
			s.quotas.add(append([]byte(nil), k...))
			return nil
		}); err != nil {
			return err
		}
	}
	return nil
}

// usage is what an inode counts for: nothing unless linked.
type usage struct {
	linked   bool
	parent   uint64
	uid, gid uint32
	bytes    int64
}

func usageOf(r *metapb.InodeRecord) usage {
	if r == nil || r.Attr == nil || r.Attr.Nlink == 0 {
		return usage{}
	}
	u := usage{linked: true, parent: r.Parent, uid: r.Attr.Uid, gid: r.Attr.Gid}
	if isReg(r.Attr) {
		u.bytes = int64(storedBytes(r.Attr))
	}
	return u
}

// quotaKeys returns the keys of the quotas an inode of usage u counts for.
func (s *Service) quotaKeys(r kv.Reader, u usage) ([]string, error) {
	var out []string
	if s.quotas.hasDirs() {
		for cur, depth := u.parent, 0; cur != 0 && depth < maxDepth; depth++ {
			if s.quotas.hasDir(cur) {
				out = append(out, string(keys.DirQuota(cur)))
			}
			if cur == RootIno {
				break
			}
			rec, err := getInode(r, cur)
			if metaerr.Errno(err) == syscall.ENOENT {
				break
			}
			if err != nil {
				return nil, err
			}
			cur = rec.Parent
		}
	}
	for _, k := range [][]byte{keys.IDQuota(keys.QuotaUID, u.uid), keys.IDQuota(keys.QuotaGID, u.gid)} {
		if s.quotas.hasID(k) {
			out = append(out, string(k))
		}
	}
	return out, nil
}

// account applies the change of an inode from old (nil: new) to rec (nil:
// deleted) to the quotas it counts for.
func (s *Service) account(t kv.Txn, old, rec *metapb.InodeRecord) error {
	a, b := usageOf(old), usageOf(rec)
	if a == b {
		return nil
	}
	type delta struct{ inodes, bytes int64 }
	deltas := map[string]*delta{}
	var order []string
	for _, side := range []struct {
		u    usage
		sign int64
	}{{a, -1}, {b, 1}} {
		if !side.u.linked {
			continue
		}
		ks, err := s.quotaKeys(t, side.u)
		if err != nil {
			return err
		}
		for _, k := range ks {
			d := deltas[k]
			if d == nil {
				d = &delta{}
				deltas[k] = d
				order = append(order, k)
			}
			d.inodes += side.sign
			d.bytes += side.sign * side.u.bytes
		}
	}
	for _, k := range order {
		d := deltas[k]
		if d.inodes == 0 && d.bytes == 0 {
			continue
		}
		q := &metapb.QuotaRecord{}
		if ok, err := getMsg(t, []byte(k), q); err != nil || !ok {
			return err // not created yet (SetQuota counts it then)
		}
		if d.inodes > 0 && q.InodeLimit > 0 && q.InodesUsed+uint64(d.inodes) > q.InodeLimit {
			return metaerr.New(syscall.EDQUOT, "inode quota of %s reached (%d of %d)", quotaName(k), q.InodesUsed, q.InodeLimit)
		}
		if d.bytes > 0 && q.SpaceLimit > 0 && q.SpaceUsed >= q.SpaceLimit {
			return metaerr.New(syscall.EDQUOT, "space quota of %s reached (%d of %d bytes)", quotaName(k), q.SpaceUsed, q.SpaceLimit)
		}
		q.InodesUsed = addClamped(q.InodesUsed, d.inodes)
		q.SpaceUsed = addClamped(q.SpaceUsed, d.bytes)
		if err := putMsg(t, []byte(k), q); err != nil {
			return err
		}
	}
	return nil
}

func addClamped(v uint64, d int64) uint64 {
	if d < 0 && uint64(-d) > v {
		return 0
	}
	return uint64(int64(v) + d)
}

// quotaName describes the quota of key k.
func quotaName(k string) string {
	if k[0] == keys.PrefixDirQuota {
		ino, _ := keys.ParseDirQuota([]byte(k))
		return fmt.Sprintf("directory %d", ino)
	}
	kind, id, _ := keys.ParseIDQuota([]byte(k))
	if kind == keys.QuotaUID {
		return fmt.Sprintf("uid %d", id)
	}
	return fmt.Sprintf("gid %d", id)
}

// putInode stores rec, counting the change in the quotas it touches.
func (s *Service) putInode(t kv.Txn, rec *metapb.InodeRecord) error {
	if s.quotas.n.Load() > 0 {
		old := &metapb.InodeRecord{}
		ok, err := getMsg(t, keys.Inode(rec.Attr.Ino), old)
		if err != nil {
			return err
		}
		if !ok {
			old = nil
		}
		if err := s.account(t, old, rec); err != nil {
			return err
		}
	}
	return putInode(t, rec)
}

// checkSpaceQuota refuses with EDQUOT a write of want more bytes to file
// rec that would take a space quota it counts for past its limit by more
// than one stripe (the grant that crosses it is allowed, so that a file can
// fill its quota to the byte).
func (s *Service) checkSpaceQuota(r kv.Reader, rec *metapb.InodeRecord, want uint64) error {
	if s.quotas.n.Load() == 0 {
		return nil
	}
	u := usageOf(rec)
	if !u.linked {
		return nil
	}
	ks, err := s.quotaKeys(r, u)
	if err != nil {
		return err
	}
	for _, k := range ks {
		q := &metapb.QuotaRecord{}
		if ok, err := getMsg(r, []byte(k), q); err != nil {
			return err
		} else if ok && q.SpaceLimit > 0 && q.SpaceUsed+want >= q.SpaceLimit+stripeBytes(rec.Attr.Layout) {
			return metaerr.New(syscall.EDQUOT, "space quota of %s reached (%d of %d bytes)", quotaName(k), q.SpaceUsed, q.SpaceLimit)
		}
	}
	return nil
}

// checkRenameQuotas refuses (EXDEV) to move a directory from under one set
// of directory quotas to another: its tree's usage would have to move.
func (s *Service) checkRenameQuotas(r kv.Reader, from, to uint64) error {
	if !s.quotas.hasDirs() || from == to {
		return nil
	}
	a, err := s.quotaKeys(r, usage{parent: from})
	if err != nil {
		return err
	}
	b, err := s.quotaKeys(r, usage{parent: to})
	if err != nil {
		return err
	}
	if fmt.Sprint(a) != fmt.Sprint(b) {
		return metaerr.New(syscall.EXDEV, "rename of a directory across directory quotas (directory %d to %d)", from, to)
	}
	return nil
}

// quotaStatFS returns the nearest directory quota covering ino, if any.
func (s *Service) quotaStatFS(r kv.Reader, ino uint64) (*metapb.QuotaRecord, error) {
	if !s.quotas.hasDirs() {
		return nil, nil
	}
	for cur, depth := ino, 0; cur != 0 && depth < maxDepth; depth++ {
		if s.quotas.hasDir(cur) {
			q := &metapb.QuotaRecord{}
			if ok, err := getMsg(r, keys.DirQuota(cur), q); err != nil || ok {
				return q, err
			}
		}
		if cur == RootIno {
			break
		}
		rec, err := getInode(r, cur)
		if err != nil {
			return nil, nil
		}
		cur = rec.Parent
	}
	return nil, nil
}

// underQuota reports whether a file c creates in dir would count for a
// quota. Creates there are not answered early by a mount (no name is
// reserved, no lease granted): meta must be able to refuse them.
func (s *Service) underQuota(ctx context.Context, c *metapb.Caller, dir uint64) bool {
	if s.quotas.n.Load() == 0 {
		return false
	}
	under := true // when unsure, creates go to meta
	_ = s.view(ctx, func(r kv.Reader) error {
		ks, err := s.quotaKeys(r, usage{linked: true, parent: dir, uid: c.Uid, gid: c.Gid})
		under = err != nil || len(ks) > 0
		return nil
	})
	return under
}

// recallLeases takes back every directory lease, waiting for the creates
// answered under them to reach meta: a new quota sees them, and no mount
// answers creates early where it now applies (underQuota).
func (s *Service) recallLeases(ctx context.Context) error {
	r := &s.reserved
	r.mu.Lock()
	dirs := make([]uint64, 0, len(r.leases.byDir))
	for dir := range r.leases.byDir {
		dirs = append(dirs, dir)
	}
	r.mu.Unlock()
	for _, dir := range dirs {
		if err := s.awaitDir(ctx, 0, dir); err != nil {
			return err
		}
	}
	return nil
}

// quotaKey returns the key of the quota req names.
func quotaKey(req *metapb.QuotaRequest) ([]byte, error) {
	switch {
	case req.ByUid && req.ByGid:
		return nil, metaerr.New(syscall.EINVAL, "quota: a user or a group, not both")
	case req.ByUid:
		return keys.IDQuota(keys.QuotaUID, req.Id), nil
	case req.ByGid:
		return keys.IDQuota(keys.QuotaGID, req.Id), nil
	case req.Ino == 0:
		return nil, metaerr.New(syscall.EINVAL, "quota: no directory, user or group named")
	}
	return keys.DirQuota(req.Ino), nil
}

// Quota implements metapb.MetaServer (see metapb.QuotaRequest).
func (s *Service) Quota(ctx context.Context, req *metapb.QuotaRequest) (*metapb.QuotaReply, error) {
	c := caller(req.Caller)
	if req.Op != metapb.QuotaRequest_GET && req.Op != metapb.QuotaRequest_LIST && !isRoot(c) {
		return nil, metaerr.New(syscall.EPERM, "quota: changes need root")
	}
	switch req.Op {
	case metapb.QuotaRequest_LIST:
		return s.listQuotas(ctx, nil)
	case metapb.QuotaRequest_CHECK:
		return s.checkQuotas(ctx, req)
	}
	key, err := quotaKey(req)
	if err != nil {
		return nil, err
	}
	switch req.Op {
	case metapb.QuotaRequest_GET:
		return s.listQuotas(ctx, key)
	case metapb.QuotaRequest_SET:
		existed := s.quotas.has(key)
		s.quotas.add(key) // changes from now on are counted once the record exists
		if err := s.recallLeases(ctx); err != nil {
			return nil, err
		}
		err := s.update(ctx, func(t kv.Txn) error {
			q := &metapb.QuotaRecord{}
			found, err := getMsg(t, key, q)
			if err != nil {
				return err
			}
			if !found {
				if q.InodesUsed, q.SpaceUsed, err = s.countQuota(t, key); err != nil {
					return err
				}
			}
			q.SpaceLimit, q.InodeLimit = req.SpaceLimit, req.InodeLimit
			return putMsg(t, key, q)
		})
		if err != nil {
			if !existed {
				s.quotas.remove(key)
			}
			return nil, err
		}
		return s.listQuotas(ctx, key)
	case metapb.QuotaRequest_DELETE:
		var found bool
		if err := s.update(ctx, func(t kv.Txn) error {
			var err error
			if _, found, err = t.Get(key); err != nil || !found {
				return err
			}
			return t.Delete(key)
		}); err != nil {
			return nil, err
		}
		if !found {
			return nil, metaerr.New(syscall.ENOENT, "quota: %s has no quota", quotaName(string(key)))
		}
		s.quotas.remove(key)
		return &metapb.QuotaReply{}, nil
	}
	return nil, metaerr.New(syscall.EINVAL, "quota: unknown operation %d", req.Op)
}

// countQuota counts the usage of the quota of key from the namespace.
func (s *Service) countQuota(r kv.Reader, key []byte) (inodes, bytes uint64, err error) {
	count := func(rec *metapb.InodeRecord) {
		u := usageOf(rec)
		if u.linked {
			inodes++
			bytes += uint64(u.bytes)
		}
	}
	if key[0] == keys.PrefixIDQuota {
		kind, id, err := keys.ParseIDQuota(key)
		if err != nil {
			return 0, 0, err
		}
		err = r.Scan(keys.InodePrefix(), []byte{keys.PrefixInode + 1}, 0, func(_, v []byte) error {
			rec := &metapb.InodeRecord{}
			if err := proto.Unmarshal(v, rec); err != nil {
				return err
			}
			if kind == keys.QuotaUID && rec.Attr.Uid == id || kind == keys.QuotaGID && rec.Attr.Gid == id {
				count(rec)
			}
			return nil
		})
		return inodes, bytes, err
	}
	dir, err := keys.ParseDirQuota(key)
	if err != nil {
		return 0, 0, err
	}
	if _, err := getDir(r, dir); err != nil {
		return 0, 0, err
	}
	// Depth first over the tree: an inode counts where its parent says.
	stack := []uint64{dir}
	for len(stack) > 0 {
		d := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		var children []uint64
		prefix := keys.DentryPrefix(d)
		if err := r.Scan(prefix, kv.PrefixEnd(prefix), 0, func(_, v []byte) error {
			e := &metapb.DentryRecord{}
			if err := proto.Unmarshal(v, e); err != nil {
				return err
			}
			children = append(children, e.Ino)
			return nil
		}); err != nil {
			return 0, 0, err
		}
		for _, ino := range children {
			rec, err := getInode(r, ino)
			if metaerr.Errno(err) == syscall.ENOENT {
				continue
			}
			if err != nil {
				return 0, 0, err
			}
			if rec.Parent != d {
				continue // a hard link: counted where its inode lives
			}
			count(rec)
			if isDir(rec.Attr) {
				stack = append(stack, ino)
			}
		}
	}
	return inodes, bytes, nil
}

// listQuotas returns the quota of key, or every quota when key is nil.
func (s *Service) listQuotas(ctx context.Context, key []byte) (*metapb.QuotaReply, error) {
	out := &metapb.QuotaReply{}
	err := s.view(ctx, func(r kv.Reader) error {
		out.Quotas = nil
		known := map[uint64]string{}
		add := func(k, v []byte) error {
			q := &metapb.QuotaRecord{}
			if err := proto.Unmarshal(v, q); err != nil {
				return err
			}
			info := &metapb.QuotaInfo{SpaceLimit: q.SpaceLimit, InodeLimit: q.InodeLimit, SpaceUsed: q.SpaceUsed, InodesUsed: q.InodesUsed}
			if k[0] == keys.PrefixDirQuota {
				ino, err := keys.ParseDirQuota(k)
				if err != nil {
					return err
				}
				info.Ino, info.Path = ino, dirPath(r, known, ino)
				if info.Path == "" {
					info.Path = "/"
				}
			} else {
				kind, id, err := keys.ParseIDQuota(k)
				if err != nil {
					return err
				}
				info.ByUid, info.ByGid, info.Id = kind == keys.QuotaUID, kind == keys.QuotaGID, id
			}
			out.Quotas = append(out.Quotas, info)
			return nil
		}
		if key != nil {
			v, ok, err := r.Get(key)
			if err != nil {
				return err
			}
			if !ok {
				return metaerr.New(syscall.ENOENT, "quota: %s has no quota", quotaName(string(key)))
			}
			return add(key, v)
		}
		for _, p := range []byte{keys.PrefixDirQuota, keys.PrefixIDQuota} {
			if err := r.Scan([]byte{p}, []byte{p + 1}, 0, add); err != nil {
				return err
			}
		}
		return nil
	})
	return out, err
}

// checkQuotas recounts the usage of the quota req names, or of every quota,
// and corrects what drifted.
func (s *Service) checkQuotas(ctx context.Context, req *metapb.QuotaRequest) (*metapb.QuotaReply, error) {
	var ks [][]byte
	if req.Ino != 0 || req.ByUid || req.ByGid {
		k, err := quotaKey(req)
		if err != nil {
			return nil, err
		}
		ks = append(ks, k)
	} else if err := s.view(ctx, func(r kv.Reader) error {
		ks = ks[:0]
		for _, p := range []byte{keys.PrefixDirQuota, keys.PrefixIDQuota} {
			if err := r.Scan([]byte{p}, []byte{p + 1}, 0, func(k, _ []byte) error {
				ks = append(ks, append([]byte(nil), k...))
				return nil
			}); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return nil, err
	}
	out := &metapb.QuotaReply{}
	for _, k := range ks {
		var fixed string
		if err := s.update(ctx, func(t kv.Txn) error {
			fixed = ""
			q := &metapb.QuotaRecord{}
			if ok, err := getMsg(t, k, q); err != nil || !ok {
				return err
			}
			inodes, bytes, err := s.countQuota(t, k)
			if err != nil {
				return err
			}
			if inodes == q.InodesUsed && bytes == q.SpaceUsed {
				return nil
			}
			fixed = fmt.Sprintf("%s: usage %d inodes, %d bytes recorded; %d inodes, %d bytes counted: corrected",
				quotaName(string(k)), q.InodesUsed, q.SpaceUsed, inodes, bytes)
			q.InodesUsed, q.SpaceUsed = inodes, bytes
			return putMsg(t, k, q)
		}); err != nil {
			return nil, err
		}
		if fixed != "" {
			out.Fixed = append(out.Fixed, fixed)
		}
	}
	list, err := s.listQuotas(ctx, nil)
	if err != nil {
		return nil, err
	}
	out.Quotas = list.Quotas
	return out, nil
}
