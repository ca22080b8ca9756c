package core

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/rdmafs/rdmafs/meta/keys"
	"github.com/rdmafs/rdmafs/meta/kv"
	"github.com/rdmafs/rdmafs/meta/metaerr"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// The trash. With it on, a regular file that loses its last link (unlink,
// or replaced by a rename) is not deleted: its inode stays, with no links,
// recorded under keys.Trash with where it was and keys.TrashTime by the time
// it went, and its data stays until meta's background loop purges it after
// the retention (cluster setting trash-days), or someone purges or restores
// it earlier. The trash is seen through a directory TrashName at the root,
// which readdir of the root does not list: its entries are "INO|NAME", root
// sees every file, other users the files they owned; unlinking an entry
// purges it.

// The trash directory (see metapb.TrashName).
const (
	TrashName = metapb.TrashName
	TrashIno  = metapb.TrashIno
)

// DefaultTrashTime is how long deleted files are kept unless the cluster
// says otherwise.
const DefaultTrashTime = 24 * time.Hour

// trashBatch bounds the files purged per transaction.
const trashBatch = DefaultTreeBatch

// trashSweepEvery is how often the background loop purges expired files.
const trashSweepEvery = 30 * time.Second

// trashTime returns how long deleted files are kept (0: no trash).
func (s *Service) trashTime() time.Duration { return time.Duration(s.trashNs.Load()) }

// loadTrashTime sets the retention from the cluster record.
func (s *Service) loadTrashTime(cl *metapb.ClusterRecord) {
	d := DefaultTrashTime
	if cl.TrashSet {
		d = time.Duration(cl.TrashSeconds) * time.Second
	}
	s.trashNs.Store(int64(d))
}

// toTrash keeps child, a regular file that has lost its last link to the
// entry name in parent, in the trash.
func (s *Service) toTrash(t kv.Txn, child *metapb.InodeRecord, parent uint64, name string, now int64) error {
	ino := child.Attr.Ino
	rec := &metapb.TrashRecord{DeletedNs: now, Parent: parent, Name: name, Uid: child.Attr.Uid, Bytes: storedBytes(child.Attr)}
	if err := putMsg(t, keys.Trash(ino), rec); err != nil {
		return err
	}
	if err := t.Put(keys.TrashTime(now, ino), nil); err != nil {
		return err
	}
	return s.putInode(t, child)
}

// storedBytes returns the bytes of file data a file holds.
func storedBytes(a *metapb.Attr) uint64 {
	if a.StoredKnown {
		return a.Stored
	}
	return a.Size
}

// checkReserved refuses a new entry named like the trash directory at the
// root.
func checkReserved(parent uint64, name string) error {
	if parent == RootIno && name == TrashName {
		return metaerr.New(syscall.EEXIST, "%q at the root is the trash", name)
	}
	return nil
}

// trashEntryName is the name of a file's entry in the trash directory.
func trashEntryName(ino uint64, rec *metapb.TrashRecord) string {
	n := fmt.Sprintf("%d|%s", ino, rec.Name)
	if len(n) > NameMax {
		n = n[:NameMax]
	}
	return n
}

// parseTrashName returns the inode of a trash entry name.
func parseTrashName(name string) (uint64, bool) {
	num, _, _ := strings.Cut(name, "|")
	ino, err := strconv.ParseUint(num, 10, 64)
	return ino, err == nil
}

// trashDirAttr is the attributes of the trash directory: root's, read-only
// for everybody else (it cannot be written to).
func (s *Service) trashDirAttr() *metapb.Attr {
	return &metapb.Attr{Ino: TrashIno, Mode: syscall.S_IFDIR | 0o555, Nlink: 2, Generation: 1}
}

// mayTrash reports whether c sees rec in the trash.
func mayTrash(c *metapb.Caller, rec *metapb.TrashRecord) bool {
	return isRoot(c) || c.Uid == rec.Uid
}

// getTrashed loads a file in the trash that c may see.
func getTrashed(r kv.Reader, c *metapb.Caller, ino uint64) (*metapb.TrashRecord, *metapb.InodeRecord, error) {
	rec := &metapb.TrashRecord{}
	ok, err := getMsg(r, keys.Trash(ino), rec)
	if err != nil {
		return nil, nil, err
	}
	if !ok || !mayTrash(c, rec) {
		return nil, nil, metaerr.New(syscall.ENOENT, "inode %d is not in the trash", ino)
	}
	in, err := getInode(r, ino)
	if err != nil {
		return nil, nil, err
	}
	return rec, in, nil
}

// lookupTrash answers a Lookup in the trash directory.
func (s *Service) lookupTrash(ctx context.Context, c *metapb.Caller, name string) (*metapb.EntryReply, error) {
	ino, ok := parseTrashName(name)
	if !ok {
		return nil, metaerr.New(syscall.ENOENT, "%q is not in the trash", name)
	}
	var out *metapb.EntryReply
	err := s.view(ctx, func(r kv.Reader) error {
		rec, in, err := getTrashed(r, c, ino)
		if err != nil {
			return err
		}
		if trashEntryName(ino, rec) != name {
			return metaerr.New(syscall.ENOENT, "%q is not in the trash", name)
		}
		out = &metapb.EntryReply{Attr: in.Attr}
		return nil
	})
	return out, err
}

// trashCookieBase is added to an inode number to make its readdir cookie in
// the trash directory, above the 1 and 2 of "." and "..".
const trashCookieBase = 2

// readTrash answers a ReadDir of the trash directory.
func (s *Service) readTrash(ctx context.Context, c *metapb.Caller, req *metapb.ReadDirRequest) (*metapb.ReadDirReply, error) {
	limit := int(req.Limit)
	if limit <= 0 {
		limit = 1000
	}
	out := &metapb.ReadDirReply{}
	err := s.view(ctx, func(r kv.Reader) error {
		out.Entries, out.Eof = nil, true
		after := uint64(0) // cookies 1 and 2 are "." and ".."
		if req.Cookie > trashCookieBase {
			after = req.Cookie - trashCookieBase
		}
		return scanTrash(r, c, after, func(ino uint64, rec *metapb.TrashRecord) error {
			if len(out.Entries) == limit {
				out.Eof = false
				return kv.ErrStop
			}
			e := &metapb.DirEntry{Name: trashEntryName(ino, rec), Ino: ino, Type: syscall.S_IFREG, Cookie: ino + trashCookieBase}
			if req.Plus {
				in, err := getInode(r, ino)
				if err != nil {
					return err
				}
				e.Attr = in.Attr
			}
			out.Entries = append(out.Entries, e)
			return nil
		})
	})
	return out, err
}

// scanTrash calls fn with each file of the trash c may see whose inode is
// above after, in inode order; fn may return kv.ErrStop.
func scanTrash(r kv.Reader, c *metapb.Caller, after uint64, fn func(ino uint64, rec *metapb.TrashRecord) error) error {
	return r.Scan(keys.Trash(after+1), []byte{keys.PrefixTrash + 1}, 0, func(k, v []byte) error {
		ino, err := keys.ParseTrash(k)
		if err != nil {
			return err
		}
		rec := &metapb.TrashRecord{}
		if err := proto.Unmarshal(v, rec); err != nil {
			return err
		}
		if !mayTrash(c, rec) {
			return nil
		}
		return fn(ino, rec)
	})
}

// Trash implements metapb.MetaServer (see metapb.TrashRequest).
func (s *Service) Trash(ctx context.Context, req *metapb.TrashRequest) (*metapb.TrashReply, error) {
	c := caller(req.Caller)
	switch req.Op {
	case metapb.TrashRequest_LIST:
		return s.listTrash(ctx, c, req)
	case metapb.TrashRequest_RESTORE:
		out := &metapb.TrashReply{}
		for _, ino := range req.Inos {
			if err := s.restore(ctx, c, ino); err != nil {
				return out, err
			}
			out.Done++
		}
		return out, nil
	case metapb.TrashRequest_PURGE:
		return s.purgeTrash(ctx, c, req)
	}
	return nil, metaerr.New(syscall.EINVAL, "trash: unknown operation %d", req.Op)
}

// listTrash returns a page of the files in the trash c may see.
func (s *Service) listTrash(ctx context.Context, c *metapb.Caller, req *metapb.TrashRequest) (*metapb.TrashReply, error) {
	limit := int(req.Limit)
	if limit <= 0 {
		limit = 1000
	}
	keep := s.trashTime()
	out := &metapb.TrashReply{}
	err := s.view(ctx, func(r kv.Reader) error {
		out.Entries, out.Next = nil, 0
		known := map[uint64]string{}
		return scanTrash(r, c, req.After, func(ino uint64, rec *metapb.TrashRecord) error {
			if len(out.Entries) == limit {
				out.Next = out.Entries[limit-1].Ino
				return kv.ErrStop
			}
			out.Entries = append(out.Entries, &metapb.TrashEntry{Ino: ino, Name: trashEntryName(ino, rec),
				Path: dirPath(r, known, rec.Parent) + "/" + rec.Name, DeletedNs: rec.DeletedNs,
				ExpiresNs: rec.DeletedNs + int64(keep), Bytes: rec.Bytes, Uid: rec.Uid})
			return nil
		})
	})
	return out, err
}

// dirPath returns the path of directory dir, "?" for one that is gone;
// known caches the answers of one listing.
func dirPath(r kv.Reader, known map[uint64]string, dir uint64) string {
	if dir == RootIno {
		return ""
	}
	if p, ok := known[dir]; ok {
		return p
	}
	p := "?"
	if rec, err := getInode(r, dir); err == nil && isDir(rec.Attr) && rec.Attr.Nlink > 0 {
		// The directory's name is its parent's entry for it.
		prefix := keys.DentryPrefix(rec.Parent)
		_ = r.Scan(prefix, kv.PrefixEnd(prefix), 0, func(k, v []byte) error {
			d := &metapb.DentryRecord{}
			if proto.Unmarshal(v, d) != nil || d.Ino != dir {
				return nil
			}
			_, name, _ := keys.ParseDentry(k)
			known[dir] = "?" // a loop in a damaged tree ends here
			p = dirPath(r, known, rec.Parent) + "/" + name
			return kv.ErrStop
		})
	}
	known[dir] = p
	return p
}

// restore puts a file of the trash back at the name it was deleted from.
func (s *Service) restore(ctx context.Context, c *metapb.Caller, ino uint64) error {
	var parent uint64
	if err := s.view(ctx, func(r kv.Reader) error {
		rec, _, err := getTrashed(r, c, ino)
		if err == nil {
			parent = rec.Parent
		}
		return err
	}); err != nil {
		return err
	}
	if err := s.awaitDir(ctx, 0, parent); err != nil {
		return err
	}
	_, err := updateOnce(s, ctx, new(*metapb.Empty), func(t kv.Txn) error {
		rec, in, err := getTrashed(t, c, ino)
		if err != nil {
			return err
		}
		p, err := getDir(t, rec.Parent)
		if err != nil || p.Attr.Nlink == 0 {
			return metaerr.New(syscall.ENOENT, "restore of inode %d: directory %d it was deleted from is gone", ino, rec.Parent)
		}
		if err := checkAccess(c, p.Attr, mayWrite|mayExec); err != nil {
			return err
		}
		if _, ok, err := getDentry(t, rec.Parent, rec.Name); err != nil {
			return err
		} else if ok {
			return metaerr.New(syscall.EEXIST, "restore of inode %d: %q exists in directory %d", ino, rec.Name, rec.Parent)
		}
		if _, err := addEntry(t, p, rec.Name, ino, syscall.S_IFREG); err != nil {
			return err
		}
		now := s.now().UnixNano()
		p.Attr.MtimeNs, p.Attr.CtimeNs = now, now
		in.Attr.Nlink, in.Attr.CtimeNs = 1, now
		in.Parent = rec.Parent
		if err := s.putInode(t, p); err != nil {
			return err
		}
		if err := s.putInode(t, in); err != nil {
			return err
		}
		return untrash(t, ino, rec)
	})
	return err
}

// untrash drops the trash records of ino.
func untrash(t kv.Txn, ino uint64, rec *metapb.TrashRecord) error {
	if err := t.Delete(keys.Trash(ino)); err != nil {
		return err
	}
	return t.Delete(keys.TrashTime(rec.DeletedNs, ino))
}

// purgeTrashed deletes a file of the trash now (once closed, if open).
func (s *Service) purgeTrashed(t kv.Txn, ino uint64, rec *metapb.TrashRecord) (int64, error) {
	if err := untrash(t, ino, rec); err != nil {
		return 0, err
	}
	in, err := getInode(t, ino)
	if metaerr.Errno(err) == syscall.ENOENT {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	if open, err := isOpen(t, ino); err != nil {
		return 0, err
	} else if open {
		return 0, t.Put(keys.Orphan(ino), nil)
	}
	return 1, s.purgeInode(t, in)
}

// purgeTrash purges the listed files, or with all every file c may see, in
// batches of transactions.
func (s *Service) purgeTrash(ctx context.Context, c *metapb.Caller, req *metapb.TrashRequest) (*metapb.TrashReply, error) {
	out := &metapb.TrashReply{}
	if !req.All {
		for _, ino := range req.Inos {
			var purged int64
			_, err := updateOnce(s, ctx, new(*metapb.Empty), func(t kv.Txn) error {
				rec, _, err := getTrashed(t, c, ino)
				if err != nil {
					return err
				}
				purged, err = s.purgeTrashed(t, ino, rec)
				return err
			})
			if err != nil {
				return out, err
			}
			s.inodes.Add(-purged)
			out.Done++
		}
		return out, nil
	}
	for {
		n, err := s.purgeTrashBatch(ctx, c)
		out.Done += uint64(n)
		if err != nil || n == 0 {
			return out, err
		}
	}
}

// purgeTrashBatch purges up to trashBatch files of the trash that c may
// purge, in inode order, in one transaction, and returns how many.
func (s *Service) purgeTrashBatch(ctx context.Context, c *metapb.Caller) (int, error) {
	var n int
	var purged int64
	err := s.update(ctx, func(t kv.Txn) error {
		n, purged = 0, 0
		type item struct {
			ino uint64
			rec *metapb.TrashRecord
		}
		var items []item
		if err := scanTrash(t, c, 0, func(ino uint64, rec *metapb.TrashRecord) error {
			items = append(items, item{ino, rec})
			if len(items) == trashBatch {
				return kv.ErrStop
			}
			return nil
		}); err != nil {
			return err
		}
		for _, it := range items {
			p, err := s.purgeTrashed(t, it.ino, it.rec)
			if err != nil {
				return err
			}
			purged += p
		}
		n = len(items)
		return nil
	})
	if err != nil {
		return 0, err
	}
	s.inodes.Add(-purged)
	return n, nil
}

// expireTrash purges the files kept past the retention, a batch per
// transaction, oldest first.
func (s *Service) expireTrash(ctx context.Context) error {
	keep := s.trashTime()
	cutoff := s.now().Add(-keep).UnixNano()
	for {
		var purged int64
		var n int
		err := s.update(ctx, func(t kv.Txn) error {
			purged, n = 0, 0
			var inos []uint64
			var times []int64
			if err := t.Scan([]byte{keys.PrefixTrashTime}, keys.TrashBefore(cutoff), trashBatch, func(k, _ []byte) error {
				at, ino, err := keys.ParseTrashTime(k)
				inos, times = append(inos, ino), append(times, at)
				return err
			}); err != nil {
				return err
			}
			for i, ino := range inos {
				rec := &metapb.TrashRecord{}
				if ok, err := getMsg(t, keys.Trash(ino), rec); err != nil {
					return err
				} else if !ok || rec.DeletedNs != times[i] {
					// A stale index entry: the file was restored or purged.
					if err := t.Delete(keys.TrashTime(times[i], ino)); err != nil {
						return err
					}
					continue
				}
				p, err := s.purgeTrashed(t, ino, rec)
				if err != nil {
					return err
				}
				purged += p
			}
			n = len(inos)
			return nil
		})
		if err != nil {
			return err
		}
		s.inodes.Add(-purged)
		if n < trashBatch {
			return nil
		}
	}
}

// unlinkTrashed answers an Unlink in the trash directory: the file is purged.
func (s *Service) unlinkTrashed(ctx context.Context, c *metapb.Caller, name string) (*metapb.DirReply, error) {
	ino, ok := parseTrashName(name)
	if !ok {
		return nil, metaerr.New(syscall.ENOENT, "%q is not in the trash", name)
	}
	_, err := s.purgeTrash(ctx, c, &metapb.TrashRequest{Inos: []uint64{ino}})
	if err != nil {
		return nil, err
	}
	return &metapb.DirReply{Parent: s.trashDirAttr()}, nil
}

// trashUsage counts the files in the trash and their bytes.
func trashUsage(r kv.Reader) (files, bytes uint64, err error) {
	err = r.Scan([]byte{keys.PrefixTrash}, []byte{keys.PrefixTrash + 1}, 0, func(_, v []byte) error {
		rec := &metapb.TrashRecord{}
		if err := proto.Unmarshal(v, rec); err != nil {
			return err
		}
		files++
		bytes += rec.Bytes
		return nil
	})
	return files, bytes, err
}

// SetTrashTime records in a formatted store, while no server runs on it, how
// long deleted files are kept in the trash (0: no trash).
func SetTrashTime(ctx context.Context, store kv.Store, d time.Duration) error {
	return store.Update(ctx, func(t kv.Txn) error {
		cl := &metapb.ClusterRecord{}
		if ok, err := getMsg(t, keys.Cluster(), cl); err != nil {
			return err
		} else if !ok {
			return ErrNotFormatted
		}
		cl.TrashSeconds, cl.TrashSet = int64(d/time.Second), true
		return putMsg(t, keys.Cluster(), cl)
	})
}

// Config implements metapb.MetaServer (see metapb.ConfigRequest).
func (s *Service) Config(ctx context.Context, req *metapb.ConfigRequest) (*metapb.ConfigReply, error) {
	const trashDays = "trash-days"
	items := func() *metapb.ConfigReply {
		days := strconv.FormatFloat(s.trashTime().Hours()/24, 'f', -1, 64)
		return &metapb.ConfigReply{Items: []*metapb.ConfigItem{{Name: trashDays, Value: days,
			About: "days deleted files are kept in the trash (.trash at the root) before they are purged; 0 turns the trash off"}}}
	}
	switch {
	case !req.Set && (req.Name == "" || req.Name == trashDays):
		return items(), nil
	case req.Name != trashDays:
		return nil, metaerr.New(syscall.EINVAL, "config: no setting %q (settings: %s)", req.Name, trashDays)
	}
	days, err := strconv.ParseFloat(strings.TrimSpace(req.Value), 64)
	if err != nil || days < 0 || days > 36500 {
		return nil, metaerr.New(syscall.EINVAL, "config: %s must be a number of days from 0 to 36500, not %q", trashDays, req.Value)
	}
	secs := int64(days * 86400)
	if err := s.update(ctx, func(t kv.Txn) error {
		cl := &metapb.ClusterRecord{}
		if _, err := getMsg(t, keys.Cluster(), cl); err != nil {
			return err
		}
		cl.TrashSeconds, cl.TrashSet = secs, true
		return putMsg(t, keys.Cluster(), cl)
	}); err != nil {
		return nil, err
	}
	s.trashNs.Store(secs * int64(time.Second))
	s.log.Info("config changed", "name", trashDays, "value", days)
	return items(), nil
}
