package fs

import (
	"context"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// Privileges a write drops. The mount negotiates FUSE_HANDLE_KILLPRIV_V2:
// the kernel then marks an inode it found without capabilities (S_NOSEC)
// instead of asking for security.capability before every write (a FUSE
// round trip each), and leaves set-user-ID to the file system: a write, an
// open with O_TRUNC or a truncate by a caller without CAP_FSETID clears
// set-user-ID, and set-group-ID when the group may execute. The kernel
// flags those requests (WRITE_KILL_SUIDGID, OPEN_KILL_SUIDGID,
// FATTR_KILL_SUIDGID) and the mount asks meta for the chmod a writer may
// make (killSuidgid). Capabilities the kernel still drops itself, with a
// REMOVEXATTR on the writer's behalf (Removexattr).

// Writev notes the kernel's request to clear set-user-ID with the write.
func (r *rawFS) Writev(cancel <-chan struct{}, in *fuse.WriteIn, data [][]byte) (uint32, fuse.Status) {
	if in.WriteFlags&fuse.WRITE_KILL_SUIDGID != 0 {
		defer r.kill.note(cancel, true)()
	}
	return r.RawFileSystem.Writev(cancel, in, data)
}

// Write is Writev for go-fuse's fallback.
func (r *rawFS) Write(cancel <-chan struct{}, in *fuse.WriteIn, data []byte) (uint32, fuse.Status) {
	if in.WriteFlags&fuse.WRITE_KILL_SUIDGID != 0 {
		defer r.kill.note(cancel, true)()
	}
	return r.RawFileSystem.Write(cancel, in, data)
}

// Open notes the kernel's request to clear set-user-ID with an O_TRUNC
// open.
func (r *rawFS) Open(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	if in.Mode&fuse.OPEN_KILL_SUIDGID != 0 {
		defer r.kill.note(cancel, true)()
	}
	return r.RawFileSystem.Open(cancel, in, out)
}

// dropPrivs does for a write through h what the kernel leaves to the
// file system: clear set-user-ID if the request asked (killSuid).
func (h *fileHandle) dropPrivs(ctx context.Context, killSuid bool) syscall.Errno {
	if killSuid {
		return h.node.killSuidgid(ctx, h)
	}
	return 0
}

// killSuidgid clears the file's set-user-ID bit, and set-group-ID if the
// group may execute, as a chmod on the caller's behalf (meta grants it to
// anyone who may write the file), and drops the kernel's cached
// attributes, which still show the bits.
func (n *Node) killSuidgid(ctx context.Context, fh gofs.FileHandle) syscall.Errno {
	var cur fuse.AttrOut
	if e := n.Getattr(ctx, fh, &cur); e != 0 {
		return e
	}
	mode := killedMode(cur.Mode)
	if mode == cur.Mode {
		return 0
	}
	in := &fuse.SetAttrIn{SetAttrInCommon: fuse.SetAttrInCommon{Valid: fuse.FATTR_MODE, Mode: mode & 0o7777}}
	var out fuse.AttrOut
	if e := n.Setattr(ctx, fh, in, &out); e != 0 {
		return e
	}
	n.NotifyContent(-1, 0) // attributes only: takes no page locks
	return 0
}

// killedMode is mode without set-user-ID, and without set-group-ID if
// the group may execute.
func killedMode(mode uint32) uint32 {
	mode &^= syscall.S_ISUID
	if mode&syscall.S_IXGRP != 0 {
		mode &^= syscall.S_ISGID
	}
	return mode
}
