package fs

import (
	"context"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/rdmafs/rdmafs/meta/metapb"
)

// readdirPage is how many entries one ReadDir call fetches.
const readdirPage = 512

// dirHandle lists a directory in pages, using the service's readdir cookies as
// directory offsets: a listing resumed at an offset neither repeats nor skips
// entries that survive concurrent changes. It keeps the attributes of the page
// so READDIRPLUS needs no lookup per entry.
type dirHandle struct {
	n      *Node
	caller *metapb.Caller
	cookie uint64 // the offset after the last entry handed out
	page   []*metapb.DirEntry
	eof    bool
	last   *metapb.DirEntry
}

var (
	_ gofs.FileReaddirenter = (*dirHandle)(nil)
	_ gofs.FileSeekdirer    = (*dirHandle)(nil)
	_ gofs.FileLookuper     = (*dirHandle)(nil)
)

// OpendirHandle implements gofs.NodeOpendirHandler.
func (n *Node) OpendirHandle(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	// Nothing is fetched until the first READDIR: programs open directories
	// to fsync them (sqlite does per transaction), and a page fetched here
	// would wait for the changes in the directory sent behind. The kernel
	// checked read permission (default_permissions); meta checks it again
	// on each page.
	return &dirHandle{n: n, caller: n.fsys.callers.of(ctx)}, 0, 0
}

func (d *dirHandle) fill(ctx context.Context) syscall.Errno {
	r, err := d.n.fsys.meta.ReadDir(ctx, &metapb.ReadDirRequest{Caller: d.caller, Ino: d.n.ino, Cookie: d.cookie, Limit: readdirPage, Plus: true})
	if err != nil {
		return errno(err)
	}
	d.page, d.eof = r.Entries, r.Eof
	return 0
}

// Readdirent implements gofs.FileReaddirenter: nil at the end.
func (d *dirHandle) Readdirent(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	ctx, done := killable(ctx)
	defer done()
	if len(d.page) == 0 {
		if d.eof {
			return nil, 0
		}
		if errno := d.fill(ctx); errno != 0 {
			return nil, errno
		}
		if len(d.page) == 0 {
			return nil, 0
		}
	}
	e := d.page[0]
	d.page = d.page[1:]
	d.cookie, d.last = e.Cookie, e
	return &fuse.DirEntry{Name: e.Name, Ino: e.Ino, Mode: e.Type, Off: e.Cookie}, 0
}

// Seekdir implements gofs.FileSeekdirer: off is a cookie handed out before.
func (d *dirHandle) Seekdir(_ context.Context, off uint64) syscall.Errno {
	if off == d.cookie {
		return 0
	}
	d.cookie, d.page, d.eof, d.last = off, nil, false, nil
	return 0
}

// Lookup implements gofs.FileLookuper for READDIRPLUS: the entry just listed.
func (d *dirHandle) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	ctx, done := killable(ctx)
	defer done()
	if d.last == nil || d.last.Name != name || d.last.Attr == nil {
		return d.n.Lookup(ctx, name, out)
	}
	return d.n.entry(ctx, name, d.last.Attr, out), 0
}

// Fsyncdir implements gofs.FileFsyncdirer: it returns once every operation
// this mount saw answered is durable in the metadata service (which may
// answer before its log's fdatasync), the directory's entries among them.
func (d *dirHandle) Fsyncdir(ctx context.Context, flags uint32) syscall.Errno {
	ctx, done := killable(ctx)
	defer done()
	return d.n.fsys.syncMeta(ctx)
}
