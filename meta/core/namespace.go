package core

import (
	"context"
	"syscall"

	"google.golang.org/protobuf/proto"

	"github.com/rdmafs/rdmafs/meta/keys"
	"github.com/rdmafs/rdmafs/meta/kv"
	"github.com/rdmafs/rdmafs/meta/metaerr"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// Lookup implements metapb.MetaServer: it needs search permission on parent.
// With reserve, a missing name the caller's session may create is held for
// it (reserve.go) and the reply says so instead of failing with ENOENT.
func (s *Service) Lookup(ctx context.Context, req *metapb.LookupRequest) (*metapb.EntryReply, error) {
	if err := checkName(req.Name); err != nil {
		return nil, err
	}
	c := caller(req.Caller)
	switch {
	case req.Parent == RootIno && req.Name == TrashName:
		return &metapb.EntryReply{Attr: s.trashDirAttr()}, nil
	case req.Parent == TrashIno:
		return s.lookupTrash(ctx, c, req.Name)
	}
	if err := s.awaitLease(ctx, c.Session, req.Parent); err != nil {
		return nil, err
	}
	// The name is held before it is looked up: a create of another session
	// that commits it after the lookup would otherwise go unseen. So is a
	// lease before the directory's names are listed.
	reserved := req.Reserve && c.Session != 0 && s.checkSession(c.Session) == nil &&
		!s.underQuota(ctx, c, req.Parent) &&
		s.reserved.reserve(c.Session, req.Parent, req.Name, s.now(), s.cfg.ReserveTTL)
	var lease *dirLease
	if reserved && req.Lease {
		lease = s.grantLease(c.Session, req.Parent)
	}
	var out *metapb.EntryReply
	err := s.view(ctx, func(r kv.Reader) error {
		p, err := getDir(r, req.Parent)
		if err != nil {
			return err
		}
		if err := checkAccess(c, p.Attr, mayExec); err != nil {
			return err
		}
		d, ok, err := getDentry(r, req.Parent, req.Name)
		if err != nil {
			return err
		}
		if !ok {
			if reserved && p.Attr.Nlink > 0 && checkAccess(c, p.Attr, mayWrite) == nil {
				l := metapb.LayoutOf(s.def)
				if p.DirLayout != nil {
					l = p.DirLayout
				}
				out = &metapb.EntryReply{Reserved: true, Parent: p.Attr, NewLayout: l,
					ReservedMs: uint32(s.cfg.ReserveTTL.Milliseconds())}
				if lease != nil {
					names, ok, err := listNames(r, req.Parent)
					if err != nil {
						return err
					}
					if ok {
						out.Lease = &metapb.DirLease{Id: lease.id, Epoch: s.reserved.leases.epoch, Names: names}
					}
				}
				return nil
			}
			return metaerr.New(syscall.ENOENT, "%q not found in directory %d", req.Name, req.Parent)
		}
		child, err := getInode(r, d.Ino)
		if err != nil {
			return err
		}
		out = &metapb.EntryReply{Attr: child.Attr, Cookie: d.Cookie}
		return nil
	})
	if reserved && (err != nil || !out.Reserved) {
		s.reserved.unreserve(c.Session, req.Parent, req.Name)
	}
	if lease != nil && (err != nil || out.Lease == nil) {
		s.releaseLease(lease)
	}
	return out, err
}

// GetAttr implements metapb.MetaServer.
func (s *Service) GetAttr(ctx context.Context, req *metapb.GetAttrRequest) (*metapb.AttrReply, error) {
	if req.Ino == TrashIno {
		return &metapb.AttrReply{Attr: s.trashDirAttr()}, nil
	}
	if err := s.awaitLease(ctx, req.LeaseSession, req.Ino); err != nil {
		return nil, err
	}
	var out *metapb.AttrReply
	err := s.view(ctx, func(r kv.Reader) error {
		rec, err := getInode(r, req.Ino)
		if err != nil {
			return err
		}
		out = &metapb.AttrReply{Attr: rec.Attr}
		return nil
	})
	return out, err
}

// Readlink implements metapb.MetaServer.
func (s *Service) Readlink(ctx context.Context, req *metapb.ReadlinkRequest) (*metapb.ReadlinkReply, error) {
	var out *metapb.ReadlinkReply
	err := s.view(ctx, func(r kv.Reader) error {
		rec, err := getInode(r, req.Ino)
		if err != nil {
			return err
		}
		if fileType(rec.Attr.Mode) != syscall.S_IFLNK {
			return metaerr.New(syscall.EINVAL, "inode %d is not a symbolic link", req.Ino)
		}
		out = &metapb.ReadlinkReply{Target: rec.Symlink}
		return nil
	})
	return out, err
}

// newNode describes an inode to create.
type newNode struct {
	mode      uint32 // type and permission bits
	rdev      uint32
	symlink   string
	exclusive bool   // regular files: fail if the name exists
	session   uint64 // regular files: open in this session
	openFlags uint32
	// ino and timeNs, when ino is set, are the inode number and times the
	// client chose: it answered the create before sending it.
	ino    uint64
	timeNs int64
	// inlineData, with ino set, is the new regular file's content,
	// committed inline as stripe 0's first version at inlineTimeNs.
	inlineData   []byte
	inlineTimeNs int64
}

// create makes a new entry name in parent. For a non-exclusive create of a
// regular file whose name exists, it opens and returns the existing file.
func (s *Service) create(ctx context.Context, c *metapb.Caller, parent uint64, name string, n newNode) (*metapb.EntryReply, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	if err := checkReserved(parent, name); err != nil {
		return nil, err
	}
	if n.ino != 0 {
		n.exclusive = true // the client gave the kernel a new file already
	}
	if len(n.inlineData) > 0 && (n.ino == 0 || fileType(n.mode) != syscall.S_IFREG) {
		return nil, metaerr.New(syscall.EINVAL, "create with inline data: only of a regular file whose inode number the client chose")
	}
	release, err := s.acquireName(ctx, c.Session, parent, name, n.ino != 0)
	if err != nil {
		return nil, err
	}
	defer release()
	var out *metapb.EntryReply
	created := false
	_, err = updateOnce(s, ctx, &out, func(t kv.Txn) error {
		created = false
		now := s.now().UnixNano()
		if n.timeNs != 0 {
			now = n.timeNs
		}
		p, err := getDir(t, parent)
		if err != nil {
			return err
		}
		if p.Attr.Nlink == 0 {
			return metaerr.New(syscall.ENOENT, "directory %d has been removed", parent)
		}
		if err := checkAccess(c, p.Attr, mayExec); err != nil {
			return err
		}
		if d, ok, err := getDentry(t, parent, name); err != nil {
			return err
		} else if ok {
			if n.exclusive || fileType(n.mode) != syscall.S_IFREG {
				return metaerr.New(syscall.EEXIST, "%q exists in directory %d", name, parent)
			}
			existing, err := getInode(t, d.Ino)
			if err != nil {
				return err
			}
			if isDir(existing.Attr) {
				return metaerr.New(syscall.EISDIR, "%q is a directory", name)
			}
			if n.session != 0 {
				if err := s.openInTxn(t, c, existing, n.session, n.openFlags); err != nil {
					return err
				}
			}
			out = &metapb.EntryReply{Attr: existing.Attr, Cookie: d.Cookie}
			return nil
		}
		if err := checkAccess(c, p.Attr, mayWrite); err != nil {
			return err
		}
		if n.session != 0 {
			if err := s.checkSession(n.session); err != nil {
				return err
			}
		}
		ino := n.ino
		if ino != 0 {
			if err := checkClientIno(t, c.Session, ino); err != nil {
				return err
			}
		} else if ino, err = nextID(t, counterIno, 1); err != nil {
			return err
		}
		a := metapb.NewAttr(c, p.Attr, ino, n.mode, now)
		a.Rdev = n.rdev
		rec := &metapb.InodeRecord{Attr: a, Symlink: n.symlink, Parent: parent}
		switch fileType(n.mode) {
		case syscall.S_IFDIR:
			a.Nlink = 2
			rec.NextCookie = FirstCookie
			rec.DirLayout = p.DirLayout
			if p.Attr.Nlink >= LinkMax {
				return metaerr.New(syscall.EMLINK, "directory %d has too many subdirectories", parent)
			}
			p.Attr.Nlink++
		case syscall.S_IFREG:
			l := metapb.LayoutOf(s.def)
			if p.DirLayout != nil {
				l = p.DirLayout
			}
			a.Layout = l
			if len(n.inlineData) > 0 {
				if err := putInlineStripe(t, rec, n.inlineData, n.inlineTimeNs); err != nil {
					return err
				}
			}
		case syscall.S_IFLNK:
			a.Size = uint64(len(n.symlink))
		}
		cookie, err := addEntry(t, p, name, ino, fileType(a.Mode))
		if err != nil {
			return err
		}
		p.Attr.MtimeNs, p.Attr.CtimeNs = now, now
		if err := s.putInode(t, p); err != nil {
			return err
		}
		if err := s.putInode(t, rec); err != nil {
			return err
		}
		if n.session != 0 {
			if err := addOpen(t, ino, n.session, n.openFlags&syscall.O_ACCMODE != syscall.O_RDONLY || n.openFlags&syscall.O_TRUNC != 0); err != nil {
				return err
			}
		}
		created = true
		out = &metapb.EntryReply{Attr: a, Cookie: cookie, Created: true, Parent: p.Attr}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if created {
		s.inodes.Add(1)
		if n.ino != 0 {
			s.reserved.noteCreated(c.Session, parent, out.Attr.Ino)
		}
	}
	return out, nil
}

// Create implements metapb.MetaServer.
func (s *Service) Create(ctx context.Context, req *metapb.CreateRequest) (*metapb.EntryReply, error) {
	return s.create(ctx, caller(req.Caller), req.Parent, req.Name, newNode{
		mode: syscall.S_IFREG | req.Mode&0o7777, exclusive: req.Exclusive,
		session: req.SessionId, openFlags: req.OpenFlags, ino: req.Ino, timeNs: req.TimeNs,
		inlineData: req.InlineData, inlineTimeNs: req.InlineTimeNs,
	})
}

// Mknod implements metapb.MetaServer.
func (s *Service) Mknod(ctx context.Context, req *metapb.MknodRequest) (*metapb.EntryReply, error) {
	c := caller(req.Caller)
	typ := fileType(req.Mode)
	switch typ {
	case 0:
		typ = syscall.S_IFREG
	case syscall.S_IFREG, syscall.S_IFIFO, syscall.S_IFSOCK:
	case syscall.S_IFCHR, syscall.S_IFBLK:
		if !isRoot(c) {
			return nil, metaerr.New(syscall.EPERM, "creating device nodes needs root")
		}
	default:
		return nil, metaerr.New(syscall.EINVAL, "mknod: invalid file type %o", typ)
	}
	rdev := uint32(0)
	if typ == syscall.S_IFCHR || typ == syscall.S_IFBLK {
		rdev = req.Rdev
	}
	return s.create(ctx, c, req.Parent, req.Name, newNode{mode: typ | req.Mode&0o7777, rdev: rdev, exclusive: true})
}

// Mkdir implements metapb.MetaServer.
func (s *Service) Mkdir(ctx context.Context, req *metapb.MkdirRequest) (*metapb.EntryReply, error) {
	return s.create(ctx, caller(req.Caller), req.Parent, req.Name, newNode{mode: syscall.S_IFDIR | req.Mode&0o7777, exclusive: true})
}

// Symlink implements metapb.MetaServer.
func (s *Service) Symlink(ctx context.Context, req *metapb.SymlinkRequest) (*metapb.EntryReply, error) {
	switch {
	case req.Target == "":
		return nil, metaerr.New(syscall.ENOENT, "symlink: empty target")
	case len(req.Target) > SymlinkMax:
		return nil, metaerr.New(syscall.ENAMETOOLONG, "symlink target of %d bytes exceeds %d", len(req.Target), SymlinkMax)
	}
	return s.create(ctx, caller(req.Caller), req.Parent, req.Name, newNode{mode: syscall.S_IFLNK | 0o777, symlink: req.Target, exclusive: true})
}

// Link implements metapb.MetaServer.
func (s *Service) Link(ctx context.Context, req *metapb.LinkRequest) (*metapb.EntryReply, error) {
	if err := checkName(req.NewName); err != nil {
		return nil, err
	}
	if err := checkReserved(req.NewParent, req.NewName); err != nil {
		return nil, err
	}
	c := caller(req.Caller)
	release, err := s.acquireName(ctx, c.Session, req.NewParent, req.NewName, false)
	if err != nil {
		return nil, err
	}
	defer release()
	var out *metapb.EntryReply
	_, err = updateOnce(s, ctx, &out, func(t kv.Txn) error {
		now := s.now().UnixNano()
		src, err := getInode(t, req.Ino)
		if err != nil {
			return err
		}
		if isDir(src.Attr) {
			return metaerr.New(syscall.EPERM, "hard links to directories are not allowed")
		}
		if src.Attr.Nlink == 0 {
			return metaerr.New(syscall.ENOENT, "inode %d has been unlinked", req.Ino)
		}
		if src.Attr.Nlink >= LinkMax {
			return metaerr.New(syscall.EMLINK, "inode %d has %d links", req.Ino, src.Attr.Nlink)
		}
		p, err := getDir(t, req.NewParent)
		if err != nil {
			return err
		}
		if p.Attr.Nlink == 0 {
			return metaerr.New(syscall.ENOENT, "directory %d has been removed", req.NewParent)
		}
		if err := checkAccess(c, p.Attr, mayWrite|mayExec); err != nil {
			return err
		}
		if _, ok, err := getDentry(t, req.NewParent, req.NewName); err != nil {
			return err
		} else if ok {
			return metaerr.New(syscall.EEXIST, "%q exists in directory %d", req.NewName, req.NewParent)
		}
		cookie, err := addEntry(t, p, req.NewName, req.Ino, fileType(src.Attr.Mode))
		if err != nil {
			return err
		}
		src.Attr.Nlink++
		src.Attr.CtimeNs = now
		p.Attr.MtimeNs, p.Attr.CtimeNs = now, now
		if err := s.putInode(t, src); err != nil {
			return err
		}
		if err := s.putInode(t, p); err != nil {
			return err
		}
		out = &metapb.EntryReply{Attr: src.Attr, Cookie: cookie}
		return nil
	})
	return out, err
}

// addEntry adds the entry name → ino of type typ to directory p, with its
// readdir index record under p's next cookie, which it returns; the caller
// stores p.
func addEntry(t kv.Txn, p *metapb.InodeRecord, name string, ino uint64, typ uint32) (uint64, error) {
	dir := p.Attr.Ino
	cookie := max(p.NextCookie, FirstCookie)
	p.NextCookie = cookie + 1
	if err := putMsg(t, keys.Dentry(dir, name), &metapb.DentryRecord{Ino: ino, Type: typ, Cookie: cookie}); err != nil {
		return 0, err
	}
	if err := putMsg(t, keys.Cookie(dir, cookie), &metapb.CookieRecord{Name: name, Ino: ino, Type: typ}); err != nil {
		return 0, err
	}
	return cookie, nil
}

// removeEntry deletes a dentry and its readdir index record.
func removeEntry(t kv.Txn, parent uint64, name string, d *metapb.DentryRecord) error {
	if err := t.Delete(keys.Dentry(parent, name)); err != nil {
		return err
	}
	return t.Delete(keys.Cookie(parent, d.Cookie))
}

// Unlink implements metapb.MetaServer.
func (s *Service) Unlink(ctx context.Context, req *metapb.UnlinkRequest) (*metapb.DirReply, error) {
	if req.Parent == TrashIno {
		return s.unlinkTrashed(ctx, caller(req.Caller), req.Name)
	}
	return s.remove(ctx, caller(req.Caller), req.Parent, req.Name, false, req.Ino, req.TimeNs)
}

// Rmdir implements metapb.MetaServer.
func (s *Service) Rmdir(ctx context.Context, req *metapb.RmdirRequest) (*metapb.DirReply, error) {
	return s.remove(ctx, caller(req.Caller), req.Parent, req.Name, true, 0, 0)
}

// remove removes name from parent: a directory (Rmdir) or another file
// (Unlink). With ino set, only if name refers to that inode (else ENOENT);
// with timeNs set, that is the time of the change.
func (s *Service) remove(ctx context.Context, c *metapb.Caller, parent uint64, name string, dir bool, ino uint64, timeNs int64) (*metapb.DirReply, error) {
	if dir && (name == "." || name == "..") {
		if name == "." {
			return nil, metaerr.New(syscall.EINVAL, "rmdir of '.'")
		}
		return nil, metaerr.New(syscall.ENOTEMPTY, "rmdir of '..'")
	}
	if err := checkName(name); err != nil {
		return nil, err
	}
	if err := s.awaitLease(ctx, c.Session, parent); err != nil {
		return nil, err
	}
	if dir {
		if err := s.awaitChildDir(ctx, c, parent, name); err != nil {
			return nil, err
		}
	}
	var purged int64
	out := &metapb.DirReply{}
	_, err := updateOnce(s, ctx, &out, func(t kv.Txn) error {
		now := s.now().UnixNano()
		if timeNs != 0 {
			now = timeNs
		}
		p, n, err := s.removeTxn(t, c, parent, name, dir, ino, now)
		purged = n
		if err != nil {
			return err
		}
		out = &metapb.DirReply{Parent: p.Attr}
		return nil
	})
	if err != nil {
		return nil, err
	}
	s.inodes.Add(-purged)
	return out, nil
}

// removeTxn removes name from parent in t as remove describes, at time now.
// It returns the parent's record and the number of inodes deleted.
func (s *Service) removeTxn(t kv.Txn, c *metapb.Caller, parent uint64, name string, dir bool, ino uint64, now int64) (*metapb.InodeRecord, int64, error) {
	p, err := getDir(t, parent)
	if err != nil {
		return nil, 0, err
	}
	if err := checkAccess(c, p.Attr, mayWrite|mayExec); err != nil {
		return nil, 0, err
	}
	d, ok, err := getDentry(t, parent, name)
	if err != nil {
		return nil, 0, err
	}
	if !ok || (ino != 0 && d.Ino != ino) {
		return nil, 0, metaerr.New(syscall.ENOENT, "%q not found in directory %d", name, parent)
	}
	child, err := getInode(t, d.Ino)
	if err != nil {
		return nil, 0, err
	}
	if dir {
		if !isDir(child.Attr) {
			return nil, 0, metaerr.New(syscall.ENOTDIR, "%q is not a directory", name)
		}
		if empty, err := dirEmpty(t, child.Attr.Ino); err != nil {
			return nil, 0, err
		} else if !empty {
			return nil, 0, metaerr.New(syscall.ENOTEMPTY, "directory %q is not empty", name)
		}
	} else if isDir(child.Attr) {
		return nil, 0, metaerr.New(syscall.EISDIR, "%q is a directory", name)
	}
	if err := checkSticky(c, p.Attr, child.Attr); err != nil {
		return nil, 0, err
	}
	if err := removeEntry(t, parent, name, d); err != nil {
		return nil, 0, err
	}
	if dir {
		p.Attr.Nlink--
	}
	p.Attr.MtimeNs, p.Attr.CtimeNs = now, now
	if err := s.putInode(t, p); err != nil {
		return nil, 0, err
	}
	purged, err := s.dropLink(t, child, parent, name, now)
	return p, purged, err
}

// dropLink removes one link of child, its entry name in parent (a directory
// loses all of them), and deletes the inode once no link and no open
// remains, or keeps a regular file in the trash. It returns the number of
// inodes deleted (0 or 1).
func (s *Service) dropLink(t kv.Txn, child *metapb.InodeRecord, parent uint64, name string, now int64) (int64, error) {
	if isDir(child.Attr) {
		child.Attr.Nlink = 0
	} else if child.Attr.Nlink > 0 {
		child.Attr.Nlink--
	}
	child.Attr.CtimeNs = now
	if child.Attr.Nlink > 0 {
		return 0, s.putInode(t, child)
	}
	if isReg(child.Attr) && s.trashTime() > 0 {
		return 0, s.toTrash(t, child, parent, name, now)
	}
	open, err := isOpen(t, child.Attr.Ino)
	if err != nil {
		return 0, err
	}
	if open {
		if err := s.putInode(t, child); err != nil {
			return 0, err
		}
		return 0, t.Put(keys.Orphan(child.Attr.Ino), nil)
	}
	return 1, s.purgeInode(t, child)
}

// awaitChildDir waits until no other session holds a name in the
// directory name of parent, before it is removed.
func (s *Service) awaitChildDir(ctx context.Context, c *metapb.Caller, parent uint64, name string) error {
	var child uint64
	if err := s.view(ctx, func(r kv.Reader) error {
		d, ok, err := getDentry(r, parent, name)
		if ok {
			child = d.Ino
		}
		return err
	}); err != nil || child == 0 {
		return err
	}
	return s.awaitDir(ctx, c.Session, child)
}

// checkClientIno fails unless ino lies in a range AllocInodes gave session
// and no inode has it.
func checkClientIno(t kv.Txn, session, ino uint64) error {
	rec := &metapb.SessionRecord{}
	ok, err := getMsg(t, keys.Session(session), rec)
	if err != nil {
		return err
	}
	if !ok {
		return metaerr.New(syscall.ESTALE, "session %d expired or unknown", session)
	}
	in := false
	for _, r := range rec.InoRanges {
		in = in || (ino >= r.First && ino < r.End)
	}
	if !in {
		return metaerr.New(syscall.EINVAL, "inode %d was not given to session %d", ino, session)
	}
	if _, found, err := t.Get(keys.Inode(ino)); err != nil {
		return err
	} else if found {
		return metaerr.New(syscall.EEXIST, "inode %d exists", ino)
	}
	return nil
}

func dirEmpty(r kv.Reader, ino uint64) (bool, error) {
	empty := true
	prefix := keys.DentryPrefix(ino)
	err := r.Scan(prefix, kv.PrefixEnd(prefix), 1, func(k, v []byte) error {
		empty = false
		return kv.ErrStop
	})
	return empty, err
}

// checkNotUnder fails with EINVAL if dir is ino or one of its descendants.
func checkNotUnder(r kv.Reader, dir, ino uint64) error {
	for cur, depth := dir, 0; ; depth++ {
		if cur == ino {
			return metaerr.New(syscall.EINVAL, "cannot move directory %d under itself", ino)
		}
		if cur == RootIno || depth > 1<<20 {
			return nil
		}
		rec, err := getInode(r, cur)
		if err != nil {
			return err
		}
		cur = rec.Parent
	}
}

// ReadDir implements metapb.MetaServer.
func (s *Service) ReadDir(ctx context.Context, req *metapb.ReadDirRequest) (*metapb.ReadDirReply, error) {
	c := caller(req.Caller)
	if req.Ino == TrashIno {
		return s.readTrash(ctx, c, req)
	}
	if err := s.awaitLease(ctx, c.Session, req.Ino); err != nil {
		return nil, err
	}
	limit := int(req.Limit)
	if limit <= 0 || limit > 4096 {
		limit = 4096
	}
	out := &metapb.ReadDirReply{}
	err := s.view(ctx, func(r kv.Reader) error {
		out.Entries = out.Entries[:0]
		d, err := getDir(r, req.Ino)
		if err != nil {
			return err
		}
		if err := checkAccess(c, d.Attr, mayRead); err != nil {
			return err
		}
		start := keys.Cookie(req.Ino, req.Cookie+1)
		if req.Cookie == ^uint64(0) {
			out.Eof = true
			return nil
		}
		n := 0
		err = r.Scan(start, kv.PrefixEnd(keys.CookiePrefix(req.Ino)), limit+1, func(k, v []byte) error {
			n++
			if n > limit {
				return kv.ErrStop
			}
			_, cookie, err := keys.ParseCookie(k)
			if err != nil {
				return err
			}
			cr := &metapb.CookieRecord{}
			if err := proto.Unmarshal(v, cr); err != nil {
				return err
			}
			out.Entries = append(out.Entries, &metapb.DirEntry{Name: cr.Name, Ino: cr.Ino, Type: cr.Type, Cookie: cookie})
			return nil
		})
		if err != nil {
			return err
		}
		out.Eof = n <= limit
		if req.Plus {
			for _, e := range out.Entries {
				rec, err := getInode(r, e.Ino)
				if err != nil {
					return err
				}
				e.Attr = rec.Attr
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
