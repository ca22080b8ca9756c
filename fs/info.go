package fs

import (
	"context"
	"strconv"
	"strings"
	"syscall"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/rdmafs/rdmafs/meta/metapb"
)

// InfoXattr is the virtual extended attribute `rdmafs info` reads: meta's
// Info reply for the file or directory (metapb.InfoReply as JSON): a
// file's stripes with the place and state of each shard, a directory's
// layout and the totals of the tree below it. A file's stripes come in
// pages that fit an attribute's value: "rdmafs.info" holds the first, and
// "rdmafs.info.N" the one starting at stripe N, the reply's next. It is not
// listed by listxattr.
const InfoXattr = "rdmafs.info"

// maxInfoValue bounds an InfoXattr value (the kernel's limit is 64 KiB).
const maxInfoValue = 60 << 10

// infoPage is how many stripes an InfoXattr page asks meta for.
const infoPage = 64

// xattrPage parses the name of a paged virtual attribute: base itself (page
// 0) or base.N (page N). ok is false for another attribute; bad for base.
// followed by something else.
func xattrPage(attr, base string) (page uint64, ok, bad bool) {
	if attr == base {
		return 0, true, false
	}
	rest, found := strings.CutPrefix(attr, base+".")
	if !found {
		return 0, false, false
	}
	page, err := strconv.ParseUint(rest, 10, 64)
	return page, true, err != nil
}

// infoXattr answers a read of InfoXattr or one of its pages; ok is false
// for any other attribute.
func (n *Node) infoXattr(ctx context.Context, attr string, dest []byte) (size uint32, e syscall.Errno, ok bool) {
	first, ok, bad := xattrPage(attr, InfoXattr)
	switch {
	case !ok:
		return 0, 0, false
	case bad:
		return 0, syscall.ENODATA, true
	}
	r, err := n.fsys.meta.Info(ctx, &metapb.InfoRequest{Ino: n.ino, First: first, Count: infoPage, Totals: first == 0})
	if err != nil {
		return 0, errno(err), true
	}
	var v []byte
	for {
		if v, err = protojson.Marshal(r); err != nil {
			return 0, syscall.EIO, true
		}
		if len(v) <= maxInfoValue || len(r.Stripes) <= 1 {
			break
		}
		// Too big for one value: the rest goes to the next page.
		half := len(r.Stripes) / 2
		r.Next = r.Stripes[half].Stripe
		r.Stripes = r.Stripes[:half]
	}
	if len(dest) < len(v) {
		return uint32(len(v)), syscall.ERANGE, true
	}
	return uint32(copy(dest, v)), 0, true
}
