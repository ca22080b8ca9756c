package fs

import (
	"context"
	"syscall"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/rdmafs/rdmafs/meta/metapb"
)

// QuotaXattr is the virtual extended attribute of `rdmafs quota` on a
// directory. Reading it returns the directory's quota with its usage
// (metapb.QuotaReply as JSON; ENODATA without one); reading QuotaListXattr
// returns every quota. Writing it a metapb.QuotaRequest as JSON sets,
// deletes or checks the directory's quota (or, with by_uid or by_gid, a
// user's or group's) as the caller: changes need root.
const (
	QuotaXattr     = "rdmafs.quota"
	QuotaListXattr = "rdmafs.quota.list"
)

// quotaXattr answers a read of QuotaXattr or QuotaListXattr; ok is false
// for any other attribute.
func (n *Node) quotaXattr(ctx context.Context, attr string, dest []byte) (size uint32, e syscall.Errno, ok bool) {
	req := &metapb.QuotaRequest{Caller: n.fsys.callers.of(ctx), Op: metapb.QuotaRequest_GET, Ino: n.ino}
	switch attr {
	case QuotaXattr:
	case QuotaListXattr:
		req.Op = metapb.QuotaRequest_LIST
	default:
		return 0, 0, false
	}
	r, err := n.fsys.meta.Quota(ctx, req)
	if errno(err) == syscall.ENOENT {
		return 0, syscall.ENODATA, true // no quota here
	}
	size, e = jsonXattr(r, err, dest)
	return size, e, true
}

// setQuota changes a quota as a write of QuotaXattr asks.
func (n *Node) setQuota(ctx context.Context, value []byte) syscall.Errno {
	req := &metapb.QuotaRequest{}
	if err := protojson.Unmarshal(value, req); err != nil {
		n.fsys.log.Info("setxattr "+QuotaXattr, "value", string(value), "err", err)
		return syscall.EINVAL
	}
	req.Caller = n.fsys.callers.of(ctx)
	if !req.ByUid && !req.ByGid && (req.Op != metapb.QuotaRequest_CHECK || req.Ino != 0) {
		req.Ino = n.ino
	}
	_, err := n.fsys.meta.Quota(ctx, req)
	return errno(err)
}
