package fs

import (
	"fmt"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/prometheus/client_golang/prometheus"
)

// MountOptions tune the kernel side of the mount.
type MountOptions struct {
	// MaxReadAhead is the kernel's readahead window (default 1 MiB).
	MaxReadAhead int
	// MaxBackground bounds requests the kernel has in flight (default 64).
	MaxBackground int
	// Debug logs every FUSE request.
	Debug bool
	// Metrics, when set, receives the mount's request metrics: latency and
	// failures per FUSE operation, bytes read and written (opMetrics).
	Metrics prometheus.Registerer
}

// Mount mounts the file system at mountpoint and returns the server, which
// serves until unmounted (Server.Unmount, or umount). Options chosen for
// throughput: 1 MiB writes and readahead, many background requests, parallel
// reads; default_permissions so the kernel checks permissions; mode 0000 kept.
func Mount(mountpoint string, root *Node, opts MountOptions) (*fuse.Server, error) {
	if opts.MaxReadAhead == 0 {
		opts.MaxReadAhead = 1 << 20
	}
	if opts.MaxBackground == 0 {
		opts.MaxBackground = 64
	}
	timeout := root.fsys.opts.EntryTimeout
	attrTimeout := root.fsys.opts.AttrTimeout
	negative := time.Duration(0)
	gopts := &gofs.Options{
		MountOptions: fuse.MountOptions{
			FsName:        "rdmafs",
			Name:          "rdmafs",
			MaxWrite:      1 << 20,
			MaxReadAhead:  opts.MaxReadAhead,
			MaxBackground: opts.MaxBackground,
			AllowOther:    true,
			DirectMount:   true,
			EnableLocks:   true,
			DisableXAttrs: false,
			Options:       []string{"default_permissions"},
			Debug:         opts.Debug,
			// The kernel keeps a file's pages when its mtime or size
			// changes (FUSE_EXPLICIT_INVAL_DATA): writes through this
			// mount go through them, so its own commits leave them
			// valid, where FUSE_AUTO_INVAL_DATA dropped them after each
			// and a database read its pages again every transaction.
			// Other mounts' changes reach the kernel as the engine's
			// reads do: at the next open (close-to-open, no KEEP_CACHE)
			// or lock (locks.go).
			ExplicitDataCacheControl: true,
			// Read replies are bytes in memory, for which go-fuse's splice
			// path only adds system calls on a pipe before the same writev
			// (what that cost: docs/performance.md).
			DisableSplice: true,
			// Asynchronous direct I/O: an application's O_DIRECT reads and
			// writes through libaio or io_uring reach us concurrently
			// instead of one at a time.
			// HANDLE_KILLPRIV_V2: the file system drops privileges on
			// write (killpriv.go), sparing a GETXATTR round trip per write.
			// ATOMIC_O_TRUNC: an open with O_TRUNC is one request, which
			// meta answers in one transaction, not a SETATTR before it.
			// DIRECT_IO_ALLOW_MMAP: O_DIRECT opens are direct-I/O files
			// (directOpenFlags), which may still be mapped.
			ExtraCapabilities: fuse.CAP_ASYNC_DIO | fuse.CAP_HANDLE_KILLPRIV_V2 | fuse.CAP_ATOMIC_O_TRUNC | fuse.CAP_DIRECT_IO_ALLOW_MMAP,
		},
		EntryTimeout:    &timeout,
		AttrTimeout:     &attrTimeout,
		NegativeTimeout: &negative,
		NullPermissions: true,
	}
	// gofs.Mount, with the lock owner of FLUSH passed through (rawFS).
	var raw fuse.RawFileSystem = &rawFS{RawFileSystem: gofs.NewNodeFS(root, gopts), locks: &root.fsys.locks, kill: &root.fsys.kill}
	if opts.Metrics != nil {
		raw = &meteredFS{RawFileSystem: raw, m: newOpMetrics(opts.Metrics)}
	}
	server, err := fuse.NewServer(raw, mountpoint, &gopts.MountOptions)
	if err != nil {
		return nil, fmt.Errorf("mount %s: %w", mountpoint, err)
	}
	go server.Serve()
	if err := server.WaitMount(); err != nil {
		return nil, fmt.Errorf("mount %s: %w", mountpoint, err)
	}
	return server, nil
}
