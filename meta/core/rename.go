package core

import (
	"context"
	"syscall"

	"github.com/rdmafs/rdmafs/meta/keys"
	"github.com/rdmafs/rdmafs/meta/kv"
	"github.com/rdmafs/rdmafs/meta/metaerr"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// Rename implements metapb.MetaServer with the semantics of renameat2(2).
func (s *Service) Rename(ctx context.Context, req *metapb.RenameRequest) (*metapb.Empty, error) {
	const known = uint32(metapb.RenameFlag_RENAME_NOREPLACE | metapb.RenameFlag_RENAME_EXCHANGE)
	noReplace := req.Flags&uint32(metapb.RenameFlag_RENAME_NOREPLACE) != 0
	exchange := req.Flags&uint32(metapb.RenameFlag_RENAME_EXCHANGE) != 0
	if req.Flags&^known != 0 || (noReplace && exchange) {
		return nil, metaerr.New(syscall.EINVAL, "rename: unsupported flags %#x", req.Flags)
	}
	if err := checkName(req.Name); err != nil {
		return nil, err
	}
	if err := checkName(req.NewName); err != nil {
		return nil, err
	}
	if err := checkReserved(req.NewParent, req.NewName); err != nil {
		return nil, err
	}
	c := caller(req.Caller)
	if err := s.awaitLease(ctx, c.Session, req.Parent); err != nil {
		return nil, err
	}
	// The new name may be reserved by another session, or be a directory
	// that the rename replaces and in which another session holds names.
	release, err := s.acquireName(ctx, c.Session, req.NewParent, req.NewName, false)
	if err != nil {
		return nil, err
	}
	defer release()
	if err := s.awaitChildDir(ctx, c, req.NewParent, req.NewName); err != nil {
		return nil, err
	}
	var purged int64
	out := &metapb.Empty{}
	_, err = updateOnce(s, ctx, &out, func(t kv.Txn) error {
		purged = 0
		r := &renameTx{req: req, c: c, noReplace: noReplace, exchange: exchange, now: s.now().UnixNano()}
		if same, err := r.load(t); err != nil || same {
			return err
		}
		if err := r.check(t); err != nil {
			return err
		}
		if (r.srcDir() || exchange && r.dstDir()) && r.crossDir() {
			if err := s.checkRenameQuotas(t, req.Parent, req.NewParent); err != nil {
				return err
			}
		}
		if exchange {
			if err := r.exchangeEntries(t, s); err != nil {
				return err
			}
		} else {
			n, err := r.moveEntry(t, s)
			if err != nil {
				return err
			}
			purged = n
		}
		return r.store(t, s)
	})
	if err != nil {
		return nil, err
	}
	s.inodes.Add(-purged)
	return &metapb.Empty{}, nil
}

// renameTx is one rename within its transaction: the records it reads
// (load), checked against the caller and the rules of rename(2) (check),
// then changed (exchangeEntries or moveEntry) and written (store).
type renameTx struct {
	req                 *metapb.RenameRequest
	c                   *metapb.Caller
	noReplace, exchange bool
	now                 int64

	sp, dp   *metapb.InodeRecord // source and destination directories (the same record when one)
	sd, dd   *metapb.DentryRecord
	src, dst *metapb.InodeRecord // dst nil: the new name is free
}

func (r *renameTx) srcDir() bool   { return isDir(r.src.Attr) }
func (r *renameTx) dstDir() bool   { return r.dst != nil && isDir(r.dst.Attr) }
func (r *renameTx) crossDir() bool { return r.req.Parent != r.req.NewParent }

// load reads both directories, both entries and their inodes, checking
// that they exist and that the caller may write both directories. same
// reports that both names link the same inode: rename then does nothing.
func (r *renameTx) load(t kv.Txn) (same bool, err error) {
	req := r.req
	if r.sp, err = getDir(t, req.Parent); err != nil {
		return false, err
	}
	r.dp = r.sp
	if r.crossDir() {
		if r.dp, err = getDir(t, req.NewParent); err != nil {
			return false, err
		}
	}
	if err := checkAccess(r.c, r.sp.Attr, mayWrite|mayExec); err != nil {
		return false, err
	}
	if err := checkAccess(r.c, r.dp.Attr, mayWrite|mayExec); err != nil {
		return false, err
	}
	if r.dp.Attr.Nlink == 0 {
		return false, metaerr.New(syscall.ENOENT, "directory %d has been removed", req.NewParent)
	}
	sd, ok, err := getDentry(t, req.Parent, req.Name)
	if err != nil {
		return false, err
	}
	if !ok {
		return false, metaerr.New(syscall.ENOENT, "%q not found in directory %d", req.Name, req.Parent)
	}
	r.sd = sd
	if r.src, err = getInode(t, sd.Ino); err != nil {
		return false, err
	}
	dd, exists, err := getDentry(t, req.NewParent, req.NewName)
	if err != nil {
		return false, err
	}
	r.dd = dd
	switch {
	case exists && r.noReplace:
		return false, metaerr.New(syscall.EEXIST, "%q exists in directory %d", req.NewName, req.NewParent)
	case exists && dd.Ino == sd.Ino:
		return true, nil
	case exists:
		if r.dst, err = getInode(t, dd.Ino); err != nil {
			return false, err
		}
	case r.exchange:
		return false, metaerr.New(syscall.ENOENT, "%q not found in directory %d", req.NewName, req.NewParent)
	}
	return false, nil
}

// check applies the rules that depend on what the names link: sticky
// directories, a directory replacing only an empty directory, and a
// directory that changes parent (it rewrites its "..": write permission on
// it, and not moving under itself).
func (r *renameTx) check(t kv.Txn) error {
	req := r.req
	if err := checkSticky(r.c, r.sp.Attr, r.src.Attr); err != nil {
		return err
	}
	if r.dst != nil {
		if err := checkSticky(r.c, r.dp.Attr, r.dst.Attr); err != nil {
			return err
		}
	}
	srcDir, dstDir := r.srcDir(), r.dstDir()
	if r.dst != nil && !r.exchange {
		switch {
		case srcDir && !dstDir:
			return metaerr.New(syscall.ENOTDIR, "cannot replace non-directory %q with a directory", req.NewName)
		case !srcDir && dstDir:
			return metaerr.New(syscall.EISDIR, "cannot replace directory %q with a non-directory", req.NewName)
		case dstDir:
			if empty, err := dirEmpty(t, r.dst.Attr.Ino); err != nil {
				return err
			} else if !empty {
				return metaerr.New(syscall.ENOTEMPTY, "directory %q is not empty", req.NewName)
			}
		}
	}
	if !r.crossDir() {
		return nil
	}
	if srcDir {
		if err := checkAccess(r.c, r.src.Attr, mayWrite); err != nil {
			return err
		}
		if err := checkNotUnder(t, req.NewParent, r.src.Attr.Ino); err != nil {
			return err
		}
	}
	if r.exchange && dstDir {
		if err := checkAccess(r.c, r.dst.Attr, mayWrite); err != nil {
			return err
		}
		if err := checkNotUnder(t, req.Parent, r.dst.Attr.Ino); err != nil {
			return err
		}
	}
	return nil
}

// exchangeEntries swaps what the two names link (RENAME_EXCHANGE); each
// entry keeps its readdir cookie.
func (r *renameTx) exchangeEntries(t kv.Txn, s *Service) error {
	req, src, dst, sd, dd := r.req, r.src, r.dst, r.sd, r.dd
	if err := putMsg(t, keys.Dentry(req.Parent, req.Name), &metapb.DentryRecord{Ino: dst.Attr.Ino, Type: dd.Type, Cookie: sd.Cookie}); err != nil {
		return err
	}
	if err := putMsg(t, keys.Cookie(req.Parent, sd.Cookie), &metapb.CookieRecord{Name: req.Name, Ino: dst.Attr.Ino, Type: dd.Type}); err != nil {
		return err
	}
	if err := putMsg(t, keys.Dentry(req.NewParent, req.NewName), &metapb.DentryRecord{Ino: src.Attr.Ino, Type: sd.Type, Cookie: dd.Cookie}); err != nil {
		return err
	}
	if err := putMsg(t, keys.Cookie(req.NewParent, dd.Cookie), &metapb.CookieRecord{Name: req.NewName, Ino: src.Attr.Ino, Type: sd.Type}); err != nil {
		return err
	}
	if r.crossDir() {
		// Every inode records a directory that holds a link to it.
		src.Parent, dst.Parent = req.NewParent, req.Parent
		if r.srcDir() {
			r.sp.Attr.Nlink--
			r.dp.Attr.Nlink++
		}
		if r.dstDir() {
			r.dp.Attr.Nlink--
			r.sp.Attr.Nlink++
		}
	}
	dst.Attr.CtimeNs = r.now
	return s.putInode(t, dst)
}

// moveEntry removes the old name and links the source under the new one
// with a new readdir cookie, dropping the link of what the new name
// replaced; it returns the inodes that purged.
func (r *renameTx) moveEntry(t kv.Txn, s *Service) (purged int64, err error) {
	req := r.req
	if err := removeEntry(t, req.Parent, req.Name, r.sd); err != nil {
		return 0, err
	}
	if r.dst != nil {
		if err := t.Delete(keys.Cookie(req.NewParent, r.dd.Cookie)); err != nil {
			return 0, err
		}
		if r.dstDir() {
			r.dp.Attr.Nlink--
		}
		if purged, err = s.dropLink(t, r.dst, req.NewParent, req.NewName, r.now); err != nil {
			return 0, err
		}
	}
	if _, err := addEntry(t, r.dp, req.NewName, r.src.Attr.Ino, r.sd.Type); err != nil {
		return 0, err
	}
	if r.crossDir() {
		r.src.Parent = req.NewParent // a directory holding a link to it
		if r.srcDir() {
			r.sp.Attr.Nlink--
			r.dp.Attr.Nlink++
		}
	}
	return purged, nil
}

// store sets the times a rename changes and writes the source inode and
// the directories.
func (r *renameTx) store(t kv.Txn, s *Service) error {
	r.src.Attr.CtimeNs = r.now
	r.sp.Attr.MtimeNs, r.sp.Attr.CtimeNs = r.now, r.now
	r.dp.Attr.MtimeNs, r.dp.Attr.CtimeNs = r.now, r.now
	if err := s.putInode(t, r.src); err != nil {
		return err
	}
	if err := s.putInode(t, r.sp); err != nil {
		return err
	}
	if r.crossDir() {
		return s.putInode(t, r.dp)
	}
	return nil
}
