package core

import (
	"context"
	"syscall"

	"github.com/rdmafs/rdmafs/meta/kv"
	"github.com/rdmafs/rdmafs/meta/metaerr"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// SetAttr implements metapb.MetaServer with the rules of chmod(2), chown(2),
// truncate(2) and utimensat(2).
func (s *Service) SetAttr(ctx context.Context, req *metapb.SetAttrRequest) (*metapb.AttrReply, error) {
	c := caller(req.Caller)
	if req.SetMode || req.SetUid || req.SetGid {
		// A directory's permissions must not change under a create that
		// another session has answered already.
		if err := s.awaitDir(ctx, c.Session, req.Ino); err != nil {
			return nil, err
		}
	}
	var out *metapb.AttrReply
	_, err := updateOnce(s, ctx, &out, func(t kv.Txn) error {
		now := s.now().UnixNano()
		rec, err := getInode(t, req.Ino)
		if err != nil {
			return err
		}
		a := rec.Attr
		changed := false
		if req.SetMode {
			// A write by someone who does not own a set-user-ID or
			// set-group-ID file clears those bits: the kernel asks for it
			// as a chmod on the writer's behalf, which a local file system
			// grants to anyone who may write the file.
			const priv = syscall.S_ISUID | syscall.S_ISGID
			newMode, oldMode := req.Mode&0o7777, a.Mode&0o7777
			killPriv := newMode != oldMode && newMode|priv == oldMode|priv && newMode&^oldMode == 0 &&
				checkAccess(c, a, mayWrite) == nil
			if !isOwner(c, a) && !killPriv {
				return metaerr.New(syscall.EPERM, "chmod: uid %d does not own inode %d", c.Uid, a.Ino)
			}
			mode := req.Mode & 0o7777
			if !isRoot(c) && !isDir(a) && !c.InGroup(a.Gid) {
				mode &^= syscall.S_ISGID
			}
			a.Mode = fileType(a.Mode) | mode
			changed = true
		}
		if req.SetUid || req.SetGid {
			if !isRoot(c) {
				if req.SetUid && req.Uid != a.Uid {
					return metaerr.New(syscall.EPERM, "chown: only root may change the owner")
				}
				if req.SetGid && req.Gid != a.Gid && (c.Uid != a.Uid || !c.InGroup(req.Gid)) {
					return metaerr.New(syscall.EPERM, "chown: uid %d may not give inode %d to group %d", c.Uid, a.Ino, req.Gid)
				}
				if c.Uid != a.Uid {
					return metaerr.New(syscall.EPERM, "chown: uid %d does not own inode %d", c.Uid, a.Ino)
				}
			}
			if req.SetUid {
				a.Uid = req.Uid
			}
			if req.SetGid {
				a.Gid = req.Gid
			}
			if !isDir(a) {
				// chown clears set-user-ID, and set-group-ID when the group
				// may execute, for every caller (Linux since 2.2.13).
				a.Mode &^= syscall.S_ISUID
				if a.Mode&syscall.S_IXGRP != 0 {
					a.Mode &^= syscall.S_ISGID
				}
			}
			changed = true
		}
		if req.SetSize {
			switch {
			case isDir(a):
				return metaerr.New(syscall.EISDIR, "truncate: inode %d is a directory", a.Ino)
			case !isReg(a):
				return metaerr.New(syscall.EINVAL, "truncate: inode %d is not a regular file", a.Ino)
			}
			ok := isRoot(c) || allowed(c, a, mayWrite)
			if !ok && req.SessionId != 0 {
				if ok, err = openedBy(t, a.Ino, req.SessionId); err != nil {
					return err
				}
			}
			if !ok {
				return metaerr.New(syscall.EACCES, "truncate: no write permission on inode %d", a.Ino)
			}
			if err := truncateStripes(t, rec, req.Size, false); err != nil {
				return err
			}
			a.Size = req.Size
			if !req.SetMtime {
				a.MtimeNs = now
			}
			changed = true
		}
		if req.SetAtime || req.SetMtime {
			explicit := (req.SetAtime && !req.AtimeNow) || (req.SetMtime && !req.MtimeNow)
			if explicit && !isOwner(c, a) {
				return metaerr.New(syscall.EPERM, "utimes: uid %d does not own inode %d", c.Uid, a.Ino)
			}
			if !explicit && !isOwner(c, a) && !allowed(c, a, mayWrite) {
				return metaerr.New(syscall.EACCES, "utimes: no write permission on inode %d", a.Ino)
			}
			if req.SetAtime {
				a.AtimeNs = req.AtimeNs
				if req.AtimeNow {
					a.AtimeNs = now
				}
			}
			if req.SetMtime {
				a.MtimeNs = req.MtimeNs
				if req.MtimeNow {
					a.MtimeNs = now
				}
			}
			changed = true
		}
		if req.SetCtime {
			if !isOwner(c, a) {
				return metaerr.New(syscall.EPERM, "setattr: uid %d does not own inode %d", c.Uid, a.Ino)
			}
			a.CtimeNs = req.CtimeNs
		} else if changed {
			a.CtimeNs = max(now, a.CtimeNs+1) // moves on, even when the clock did not
		}
		if err := s.putInode(t, rec); err != nil {
			return err
		}
		out = &metapb.AttrReply{Attr: a}
		return nil
	})
	return out, err
}
