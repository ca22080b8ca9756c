// Package fuseceiling mounts go-fuse's loopback file system over a directory
// with kernel passthrough turned off, so that every byte goes through the
// daemon: the ceiling a FUSE file system that moves data itself can reach on
// this machine, measured beside rdmafs by `rdmafs bench fs`.
package fuseceiling

import (
	"context"
	"fmt"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// fileOps are the loopback file's operations except PassthroughFd: a handle
// that hides it keeps the kernel from bypassing the daemon.
type fileOps interface {
	gofs.FileReader
	gofs.FileWriter
	gofs.FileFlusher
	gofs.FileFsyncer
	gofs.FileReleaser
	gofs.FileGetattrer
	gofs.FileSetattrer
	gofs.FileLseeker
	gofs.FileAllocater
}

type noPassthrough struct{ fileOps }

type node struct{ gofs.LoopbackNode }

func (n *node) wrap(fh gofs.FileHandle) gofs.FileHandle {
	if ops, ok := fh.(fileOps); ok {
		return noPassthrough{ops}
	}
	return fh
}

// Open opens the file without passthrough.
func (n *node) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	fh, ff, errno := n.LoopbackNode.Open(ctx, flags)
	return n.wrap(fh), ff, errno
}

// Create creates the file without passthrough.
func (n *node) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	ino, fh, ff, errno := n.LoopbackNode.Create(ctx, name, flags, mode, out)
	return ino, n.wrap(fh), ff, errno
}

// Mount mounts dir at mountpoint with the same kernel options as rdmafs
// (1 MiB writes and readahead, asynchronous direct I/O, pages kept when a
// file's mtime changes) and returns the server.
// With permissions the kernel checks permissions (default_permissions, as on
// rdmafs): it then asks for a directory's attributes again after every
// create or unlink in it, before the next lookup in it.
func Mount(dir, mountpoint string, permissions bool) (*fuse.Server, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(dir, &st); err != nil {
		return nil, fmt.Errorf("fuseceiling: %w", err)
	}
	root := &gofs.LoopbackRoot{Path: dir, Dev: uint64(st.Dev)}
	//lint:ignore SA1019 the ceiling keeps go-fuse's loopback node as it is, wrapped by value; WrapChild would need a pointer embedding
	root.NewNode = func(r *gofs.LoopbackRoot, _ *gofs.Inode, _ string, _ *syscall.Stat_t) gofs.InodeEmbedder {
		return &node{gofs.LoopbackNode{RootData: r}}
	}
	rootNode := root.NewNode(root, nil, "", &st) //lint:ignore SA1019 as above
	root.RootNode = rootNode
	sec := time.Second
	var opts []string
	if permissions {
		opts = []string{"default_permissions"}
	}
	srv, err := gofs.Mount(mountpoint, rootNode, &gofs.Options{
		MountOptions: fuse.MountOptions{FsName: "fuseceiling", Name: "fuseceiling", MaxWrite: 1 << 20, MaxReadAhead: 1 << 20,
			MaxBackground: 64, DirectMount: true, AllowOther: true, ExtraCapabilities: fuse.CAP_ASYNC_DIO, Options: opts,
			// As rdmafs: pages stay cached when a file's mtime changes
			// (nothing but this mount changes the files).
			ExplicitDataCacheControl: true},
		EntryTimeout: &sec, AttrTimeout: &sec,
	})
	if err != nil {
		return nil, fmt.Errorf("fuseceiling: mount %s: %w", mountpoint, err)
	}
	return srv, nil
}
