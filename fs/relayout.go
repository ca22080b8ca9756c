package fs

import (
	"context"
	"strings"
	"syscall"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/rdmafs/rdmafs/internal/stripe"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// RelayoutXattr is the virtual extended attribute of online relayout:
// setting it on a file or a directory to a layout ("1+2", "4+2/262144")
// converts the file, or every file below the directory, to that layout in
// the background (meta's Relayout; the directories below then give new
// files the layout too); reading it returns what is left to convert below
// the path (metapb.RelayoutReply as JSON). It is not listed by listxattr.
const RelayoutXattr = "rdmafs.relayout"

// relayoutXattr answers a read of RelayoutXattr; ok is false for any other
// attribute.
func (n *Node) relayoutXattr(ctx context.Context, attr string, dest []byte) (size uint32, e syscall.Errno, ok bool) {
	if attr != RelayoutXattr {
		return 0, 0, false
	}
	r, err := n.fsys.meta.Relayout(ctx, &metapb.RelayoutRequest{Caller: n.fsys.callers.of(ctx), Ino: n.ino, Progress: true})
	size, e = jsonXattr(r, err, dest)
	return size, e, true
}

// jsonXattr answers a read of a virtual attribute whose value is the reply
// m of a meta call (or its error err) as JSON.
func jsonXattr(m proto.Message, err error, dest []byte) (uint32, syscall.Errno) {
	if err != nil {
		return 0, errno(err)
	}
	v, err := protojson.Marshal(m)
	if err != nil {
		return 0, syscall.EIO
	}
	if len(dest) < len(v) {
		return uint32(len(v)), syscall.ERANGE
	}
	return uint32(copy(dest, v)), 0
}

// ParseRelayout parses a RelayoutXattr value: a layout as stripe.Layout
// formats it, whose unit may be left out ("4+2", "4+2/min-write=5"): each
// file then keeps its stripe size, and each directory's new files get the
// stripe size it gave before (Unit 0).
func ParseRelayout(v string) (stripe.Layout, error) {
	km, rest, _ := strings.Cut(strings.TrimSpace(v), "/")
	if rest != "" && rest[0] >= '0' && rest[0] <= '9' {
		return stripe.ParseLayout(v)
	}
	full := km + "/4KiB"
	if rest != "" {
		full += "/" + rest
	}
	l, err := stripe.ParseLayout(full)
	l.Unit = 0
	return l, err
}

// setRelayout starts the relayout a write of RelayoutXattr asks for.
func (n *Node) setRelayout(ctx context.Context, value []byte) syscall.Errno {
	l, err := ParseRelayout(string(value))
	if err != nil {
		n.fsys.log.Info("setxattr "+RelayoutXattr, "ino", n.ino, "err", err)
		return syscall.EINVAL
	}
	_, err = n.fsys.meta.Relayout(ctx, &metapb.RelayoutRequest{Caller: n.fsys.callers.of(ctx), Ino: n.ino, Layout: metapb.LayoutOf(l)})
	if err != nil {
		n.fsys.log.Warn("relayout refused", "ino", n.ino, "layout", string(value), "err", err)
	}
	return errno(err)
}
