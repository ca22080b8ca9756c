package core

import (
	"context"
	"strings"
	"syscall"

	"github.com/rdmafs/rdmafs/meta/keys"
	"github.com/rdmafs/rdmafs/meta/kv"
	"github.com/rdmafs/rdmafs/meta/metaerr"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// xattrNamespace validates an attribute name and returns its namespace.
func xattrNamespace(name string) (string, error) {
	if name == "" || len(name) > XattrNameMax {
		return "", metaerr.New(syscall.ERANGE, "xattr name of %d bytes (1..%d allowed)", len(name), XattrNameMax)
	}
	for _, ns := range []string{"user.", "trusted.", "security."} {
		if strings.HasPrefix(name, ns) && len(name) > len(ns) {
			return ns, nil
		}
	}
	return "", metaerr.New(syscall.EOPNOTSUPP, "xattr namespace of %q is not supported", name)
}

// checkXattr applies the namespace rules of xattr(7) to an access.
func checkXattr(c *metapb.Caller, a *metapb.Attr, ns string, write bool) error {
	switch ns {
	case "trusted.":
		if !isRoot(c) {
			return metaerr.New(syscall.EPERM, "trusted xattrs need root")
		}
	case "security.":
		if write && !isRoot(c) {
			return metaerr.New(syscall.EPERM, "security xattrs are set by root only")
		}
	case "user.":
		if !isReg(a) && !isDir(a) {
			if write {
				return metaerr.New(syscall.EPERM, "user xattrs only on regular files and directories")
			}
			return metaerr.New(syscall.ENODATA, "no user xattrs on this file type")
		}
		if write {
			if isDir(a) && a.Mode&syscall.S_ISVTX != 0 && !isOwner(c, a) {
				return metaerr.New(syscall.EPERM, "user xattrs of a sticky directory are its owner's")
			}
			return checkAccess(c, a, mayWrite)
		}
		return checkAccess(c, a, mayRead)
	}
	return nil
}

// loadXattr loads inode ino, checks that c may read (or, with write,
// change) its attributes of namespace ns, and returns the inode with the
// value of name (found false when it has none).
func loadXattr(r kv.Reader, c *metapb.Caller, ino uint64, name, ns string, write bool) (*metapb.InodeRecord, []byte, bool, error) {
	rec, err := getInode(r, ino)
	if err != nil {
		return nil, nil, false, err
	}
	if err := checkXattr(c, rec.Attr, ns, write); err != nil {
		return nil, nil, false, err
	}
	v, ok, err := r.Get(keys.Xattr(ino, name))
	if err != nil {
		return nil, nil, false, err
	}
	return rec, v, ok, nil
}

// GetXattr implements metapb.MetaServer. The client compares the value's
// length with its buffer and reports ERANGE itself.
func (s *Service) GetXattr(ctx context.Context, req *metapb.GetXattrRequest) (*metapb.GetXattrReply, error) {
	ns, err := xattrNamespace(req.Name)
	if err != nil {
		return nil, err
	}
	c := caller(req.Caller)
	var out *metapb.GetXattrReply
	err = s.view(ctx, func(r kv.Reader) error {
		_, v, ok, err := loadXattr(r, c, req.Ino, req.Name, ns, false)
		if err != nil {
			return err
		}
		if !ok {
			return metaerr.New(syscall.ENODATA, "no xattr %q on inode %d", req.Name, req.Ino)
		}
		out = &metapb.GetXattrReply{Value: v}
		return nil
	})
	return out, err
}

// SetXattr implements metapb.MetaServer (XATTR_CREATE / XATTR_REPLACE).
func (s *Service) SetXattr(ctx context.Context, req *metapb.SetXattrRequest) (*metapb.Empty, error) {
	ns, err := xattrNamespace(req.Name)
	if err != nil {
		return nil, err
	}
	if len(req.Value) > XattrValueMax {
		return nil, metaerr.New(syscall.E2BIG, "xattr value of %d bytes exceeds %d", len(req.Value), XattrValueMax)
	}
	create := req.Flags&uint32(metapb.XattrFlag_XATTR_CREATE) != 0
	replace := req.Flags&uint32(metapb.XattrFlag_XATTR_REPLACE) != 0
	if req.Flags&^uint32(3) != 0 || (create && replace) {
		return nil, metaerr.New(syscall.EINVAL, "setxattr: invalid flags %#x", req.Flags)
	}
	return s.changeXattr(ctx, req.Caller, req.Ino, req.Name, ns, func(t kv.Txn, key []byte, exists bool) error {
		if exists && create {
			return metaerr.New(syscall.EEXIST, "xattr %q exists", req.Name)
		}
		if !exists && replace {
			return metaerr.New(syscall.ENODATA, "no xattr %q to replace", req.Name)
		}
		return t.Put(key, req.Value)
	})
}

// changeXattr runs change on the extended attribute name (of namespace ns)
// of inode ino, in one transaction that runs once per request (updateOnce):
// it loads the inode, checks that the caller may change the attribute
// (loadXattr), calls change with the attribute's key and whether it exists,
// and, unless change fails, sets the inode's ctime to now.
func (s *Service) changeXattr(ctx context.Context, pc *metapb.Caller, ino uint64, name, ns string,
	change func(t kv.Txn, key []byte, exists bool) error) (*metapb.Empty, error) {
	c := caller(pc)
	if err := s.awaitDir(ctx, c.Session, ino); err != nil { // ACLs: as SetAttr's mode
		return nil, err
	}
	return s.xattrTxn(ctx, func(t kv.Txn) (*metapb.InodeRecord, error) {
		rec, _, exists, err := loadXattr(t, c, ino, name, ns, true)
		if err != nil {
			return nil, err
		}
		return rec, change(t, keys.Xattr(ino, name), exists)
	})
}

// xattrTxn runs change, a change of an inode's extended attributes that
// returns its record, in a transaction that then sets the inode's ctime.
func (s *Service) xattrTxn(ctx context.Context, change func(t kv.Txn) (*metapb.InodeRecord, error)) (*metapb.Empty, error) {
	out := &metapb.Empty{}
	if _, err := updateOnce(s, ctx, &out, func(t kv.Txn) error {
		rec, err := change(t)
		if err != nil {
			return err
		}
		rec.Attr.CtimeNs = s.now().UnixNano()
		return s.putInode(t, rec)
	}); err != nil {
		return nil, err
	}
	return out, nil
}

// ListXattr implements metapb.MetaServer; trusted attributes are listed for
// root only.
func (s *Service) ListXattr(ctx context.Context, req *metapb.ListXattrRequest) (*metapb.ListXattrReply, error) {
	c := caller(req.Caller)
	out := &metapb.ListXattrReply{}
	err := s.view(ctx, func(r kv.Reader) error {
		out.Names = out.Names[:0]
		if _, err := getInode(r, req.Ino); err != nil {
			return err
		}
		prefix := keys.XattrPrefix(req.Ino)
		return r.Scan(prefix, kv.PrefixEnd(prefix), 0, func(k, v []byte) error {
			_, name, err := keys.ParseXattr(k)
			if err != nil {
				return err
			}
			if strings.HasPrefix(name, "trusted.") && !isRoot(c) {
				return nil
			}
			out.Names = append(out.Names, name)
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// RemoveXattr implements metapb.MetaServer.
func (s *Service) RemoveXattr(ctx context.Context, req *metapb.RemoveXattrRequest) (*metapb.Empty, error) {
	if req.KillPriv {
		return s.killCaps(ctx, req)
	}
	ns, err := xattrNamespace(req.Name)
	if err != nil {
		return nil, err
	}
	return s.changeXattr(ctx, req.Caller, req.Ino, req.Name, ns, func(t kv.Txn, key []byte, exists bool) error {
		if !exists {
			return metaerr.New(syscall.ENODATA, "no xattr %q on inode %d", req.Name, req.Ino)
		}
		return t.Delete(key)
	})
}

// capsXattr holds a file's capabilities (capabilities(7)).
const capsXattr = "security.capability"

// killCaps removes a file's capabilities for a writer (RemoveXattrRequest
// kill_priv): allowed to root, to a caller who may write the file and to
// a session that has it open, as the kernel drops them with its own
// privilege when a file is written or truncated. ENODATA when it has none.
func (s *Service) killCaps(ctx context.Context, req *metapb.RemoveXattrRequest) (*metapb.Empty, error) {
	if req.Name != capsXattr {
		return nil, metaerr.New(syscall.EINVAL, "kill_priv removes %s only, not %q", capsXattr, req.Name)
	}
	c := caller(req.Caller)
	return s.xattrTxn(ctx, func(t kv.Txn) (*metapb.InodeRecord, error) {
		rec, err := getInode(t, req.Ino)
		if err != nil {
			return nil, err
		}
		if !isRoot(c) && checkAccess(c, rec.Attr, mayWrite) != nil {
			open := false
			if c.Session != 0 {
				if open, err = openedBy(t, req.Ino, c.Session); err != nil {
					return nil, err
				}
			}
			if !open {
				return nil, metaerr.New(syscall.EPERM, "uid %d may not write inode %d: its capabilities stay", c.Uid, req.Ino)
			}
		}
		key := keys.Xattr(req.Ino, capsXattr)
		_, ok, err := t.Get(key)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, metaerr.New(syscall.ENODATA, "inode %d has no capabilities", req.Ino)
		}
		return rec, t.Delete(key)
	})
}
