package fs

import (
	"context"
	"syscall"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/rdmafs/rdmafs/meta/metapb"
)

// TrashXattr is the virtual extended attribute of `rdmafs trash`, on every
// node of the mount. Reading it returns the first page of the files in the
// trash the caller may see (metapb.TrashReply as JSON; root sees all, others
// their own), reading TrashXattr + "." + N the page after inode N. Writing
// it a metapb.TrashRequest as JSON restores or purges files as the caller.
const TrashXattr = "rdmafs.trash"

// trashPage is how many entries one read of TrashXattr returns, so that the
// reply fits the kernel's 64 KiB limit of an attribute value.
const trashPage = 200

// trashXattr answers a read of TrashXattr or one of its pages; ok is false
// for any other attribute.
func (n *Node) trashXattr(ctx context.Context, attr string, dest []byte) (size uint32, e syscall.Errno, ok bool) {
	after, ok, bad := xattrPage(attr, TrashXattr)
	switch {
	case !ok:
		return 0, 0, false
	case bad:
		return 0, syscall.ENODATA, true
	}
	r, err := n.fsys.meta.Trash(ctx, &metapb.TrashRequest{Caller: n.fsys.callers.of(ctx), After: after, Limit: trashPage})
	size, e = jsonXattr(r, err, dest)
	return size, e, true
}

// setTrash restores or purges files of the trash as a write of TrashXattr asks.
func (n *Node) setTrash(ctx context.Context, value []byte) syscall.Errno {
	req := &metapb.TrashRequest{}
	if err := protojson.Unmarshal(value, req); err != nil || req.Op == metapb.TrashRequest_LIST {
		n.fsys.log.Info("setxattr "+TrashXattr, "value", string(value), "err", err)
		return syscall.EINVAL
	}
	req.Caller = n.fsys.callers.of(ctx)
	_, err := n.fsys.meta.Trash(ctx, req)
	return errno(err)
}
