package core

import (
	"syscall"

	"github.com/rdmafs/rdmafs/meta/metaerr"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// Access bits, as access(2).
const (
	mayRead  = 4
	mayWrite = 2
	mayExec  = 1
)

// caller returns the effective caller; a request without one runs as root
// (requests are authenticated by the cluster secret; the client vouches for
// the uid, as NFS AUTH_SYS does).
func caller(c *metapb.Caller) *metapb.Caller {
	if c == nil {
		return &metapb.Caller{}
	}
	return c
}

func isRoot(c *metapb.Caller) bool { return c.Uid == 0 }

// allowed reports whether c may access a with the mask of may* bits, using
// the owner, group or other permission class as Linux does (no ACLs).
func allowed(c *metapb.Caller, a *metapb.Attr, mask uint32) bool {
	if isRoot(c) {
		// Root may read and write anything, and execute anything with an
		// execute bit set (directories are always searchable).
		if mask&mayExec != 0 && !isDir(a) && a.Mode&0o111 == 0 {
			return false
		}
		return true
	}
	var perm uint32
	switch {
	case c.Uid == a.Uid:
		perm = a.Mode >> 6
	case c.InGroup(a.Gid):
		perm = a.Mode >> 3
	default:
		perm = a.Mode
	}
	return perm&mask&7 == mask
}

func checkAccess(c *metapb.Caller, a *metapb.Attr, mask uint32) error {
	if !allowed(c, a, mask) {
		return metaerr.New(syscall.EACCES, "permission denied on inode %d (uid %d, mode %o)", a.Ino, c.Uid, a.Mode&0o7777)
	}
	return nil
}

// checkSticky enforces the sticky bit: in a sticky directory only the owner
// of the entry, the owner of the directory or root may remove or rename it.
func checkSticky(c *metapb.Caller, dir, target *metapb.Attr) error {
	if dir.Mode&syscall.S_ISVTX == 0 || isRoot(c) || c.Uid == dir.Uid || c.Uid == target.Uid {
		return nil
	}
	return metaerr.New(syscall.EPERM, "sticky directory %d: uid %d may not remove inode %d", dir.Ino, c.Uid, target.Ino)
}

func isOwner(c *metapb.Caller, a *metapb.Attr) bool { return isRoot(c) || c.Uid == a.Uid }
