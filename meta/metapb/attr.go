package metapb

import "syscall"

// InGroup reports whether gid is the caller's group or one of its
// supplementary groups.
func (c *Caller) InGroup(gid uint32) bool {
	if c.GetGid() == gid {
		return true
	}
	for _, g := range c.GetGroups() {
		if g == gid {
			return true
		}
	}
	return false
}

// NewAttr returns the attributes of a new inode ino of mode (type and
// permission bits) that c makes in the directory with attributes parent at
// time now (ns): one link, owned by the caller — in a set-group-ID directory
// by the directory's group, a new directory inheriting the bit — and a
// group-executable non-directory keeps set-group-ID only for root or a
// member of its group. Meta and a client answering a create before meta
// (CreateRequest.ino) both build a new inode's attributes with it.
func NewAttr(c *Caller, parent *Attr, ino uint64, mode uint32, now int64) *Attr {
	a := &Attr{Ino: ino, Mode: mode, Uid: c.GetUid(), Gid: c.GetGid(), Nlink: 1,
		AtimeNs: now, MtimeNs: now, CtimeNs: now, Generation: 1, StoredKnown: true}
	isDir := mode&syscall.S_IFMT == syscall.S_IFDIR
	if parent.GetMode()&syscall.S_ISGID != 0 {
		a.Gid = parent.GetGid()
		if isDir {
			a.Mode |= syscall.S_ISGID
		}
	}
	if !isDir && a.Mode&syscall.S_ISGID != 0 && a.Mode&syscall.S_IXGRP != 0 && c.GetUid() != 0 && !c.InGroup(a.Gid) {
		a.Mode &^= syscall.S_ISGID
	}
	return a
}
