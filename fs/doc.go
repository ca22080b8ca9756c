// Package fs is the FUSE client of rdmafs: go-fuse node and file-handle
// operations that translate kernel requests into metadata-service calls for the
// namespace and into the file I/O engine (the Data interface) for file bytes.
//
// The file system is mounted with default_permissions, so the kernel checks
// permissions against the attributes the metadata service returns; the service
// checks them again with the caller's uid, gid and supplementary groups (read
// from /proc/PID/status), so both agree. Inode numbers are the service's inode
// numbers; directory offsets are its stable readdir cookies.
package fs
