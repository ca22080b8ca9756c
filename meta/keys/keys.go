// Package keys defines the key layout of the metadata service in its KV
// store: one prefix byte per record type followed by big-endian integers and
// names, so that related records sort together and range scans find them.
// Every backend (bbolt, etcd) shares this layout.
package keys

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Prefix bytes of the record types.
const (
	PrefixCluster     = 'C' // C -> ClusterRecord
	PrefixCounter     = 'k' // k name -> uint64
	PrefixInode       = 'i' // i ino -> InodeRecord
	PrefixDentry      = 'd' // d parent name -> DentryRecord
	PrefixCookie      = 'r' // r parent cookie -> CookieRecord
	PrefixXattr       = 'x' // x ino name -> value
	PrefixStripe      = 's' // s ino stripe -> StripeRecord
	PrefixGrant       = 'p' // p ino stripe version -> GrantRecord
	PrefixChunkserver = 'n' // n id -> ChunkserverRecord
	PrefixGC          = 'g' // g len(id) id chunk version -> empty
	PrefixSession     = 'S' // S session -> SessionRecord
	PrefixOpen        = 'o' // o ino session -> uint64 count
	PrefixOrphan      = 'u' // u ino -> empty (nlink 0, still open)
	PrefixSessionOpen = 'q' // q session ino -> empty (index of opens by session)
	PrefixLock        = 'l' // l ino -> LockRecord
	PrefixSessionLock = 'm' // m session ino -> empty (index of locks by session)
	PrefixRelayout    = 'y' // y ino -> empty (a file being converted to its layout)
	PrefixShared      = 'c' // c chunk version -> uint64 (references beyond the first)
	PrefixSnapshot    = 'j' // j dst -> SnapshotJob (a tree snapshot, in progress or done)
	PrefixSnapTask    = 'J' // J dst seq -> SnapshotTask (a directory still to copy)
	PrefixSnapLink    = 'h' // h dst src -> uint64 (the copy of a hard-linked file)
	PrefixTrash       = 'T' // T ino -> TrashRecord (a deleted file kept)
	PrefixTrashTime   = 'U' // U deleted_ns ino -> empty (the trash by time, for expiry)
	PrefixDirQuota    = 'Q' // Q ino -> QuotaRecord (a directory's quota)
	PrefixIDQuota     = 'W' // W kind id -> QuotaRecord (a user's or group's quota)
)

// ErrMalformed reports a key that does not have the expected shape.
var ErrMalformed = errors.New("keys: malformed key")

// Cluster is the key of the cluster record.
func Cluster() []byte { return []byte{PrefixCluster} }

// Counter is the key of a named counter.
func Counter(name string) []byte { return append([]byte{PrefixCounter}, name...) }

// Inode is the key of an inode.
func Inode(ino uint64) []byte { return u64s(PrefixInode, ino) }

// InodePrefix is the prefix of all inode keys.
func InodePrefix() []byte { return []byte{PrefixInode} }

// Dentry is the key of the entry name in directory parent.
func Dentry(parent uint64, name string) []byte { return append(u64s(PrefixDentry, parent), name...) }

// DentryPrefix is the prefix of all entries of directory parent.
func DentryPrefix(parent uint64) []byte { return u64s(PrefixDentry, parent) }

// Cookie is the readdir index key of the entry with cookie in parent.
func Cookie(parent, cookie uint64) []byte { return u64s(PrefixCookie, parent, cookie) }

// CookiePrefix is the prefix of the readdir index of parent.
func CookiePrefix(parent uint64) []byte { return u64s(PrefixCookie, parent) }

// Xattr is the key of extended attribute name of ino.
func Xattr(ino uint64, name string) []byte { return append(u64s(PrefixXattr, ino), name...) }

// XattrPrefix is the prefix of all extended attributes of ino.
func XattrPrefix(ino uint64) []byte { return u64s(PrefixXattr, ino) }

// Stripe is the key of stripe index of ino.
func Stripe(ino, stripe uint64) []byte { return u64s(PrefixStripe, ino, stripe) }

// StripePrefix is the prefix of all stripes of ino.
func StripePrefix(ino uint64) []byte { return u64s(PrefixStripe, ino) }

// Grant is the key of an outstanding write grant.
func Grant(ino, stripe, version uint64) []byte { return u64s(PrefixGrant, ino, stripe, version) }

// GrantPrefix is the prefix of all outstanding grants of ino.
func GrantPrefix(ino uint64) []byte { return u64s(PrefixGrant, ino) }

// Chunkserver is the key of a chunkserver registration.
func Chunkserver(id string) []byte { return append([]byte{PrefixChunkserver}, id...) }

// GC is the key of a chunk version that chunkserver id must delete.
func GC(id string, chunk, version uint64) []byte {
	k := GCPrefix(id)
	k = binary.BigEndian.AppendUint64(k, chunk)
	return binary.BigEndian.AppendUint64(k, version)
}

// GCPrefix is the prefix of all chunks chunkserver id must delete. Server ids
// are at most 65535 bytes long.
func GCPrefix(id string) []byte {
	k := make([]byte, 0, 3+len(id)+16)
	k = append(k, PrefixGC)
	k = binary.BigEndian.AppendUint16(k, uint16(len(id)))
	return append(k, id...)
}

// Session is the key of a client session.
func Session(id uint64) []byte { return u64s(PrefixSession, id) }

// Open is the key counting the opens of ino by session.
func Open(ino, session uint64) []byte { return u64s(PrefixOpen, ino, session) }

// OpenPrefix is the prefix of all open records of ino.
func OpenPrefix(ino uint64) []byte { return u64s(PrefixOpen, ino) }

// SessionOpen is the key indexing an open of ino by session.
func SessionOpen(session, ino uint64) []byte { return u64s(PrefixSessionOpen, session, ino) }

// SessionOpenPrefix is the prefix of all opens of session.
func SessionOpenPrefix(session uint64) []byte { return u64s(PrefixSessionOpen, session) }

// ParseSessionOpen returns the session and inode of a session open key.
func ParseSessionOpen(key []byte) (session, ino uint64, err error) {
	v, err := fixed(key, PrefixSessionOpen, 2)
	if err != nil {
		return 0, 0, err
	}
	return v[0], v[1], nil
}

// Lock is the key of the locks of ino.
func Lock(ino uint64) []byte { return u64s(PrefixLock, ino) }

// SessionLock is the key of the index entry saying that session holds
// locks on ino.
func SessionLock(session, ino uint64) []byte { return u64s(PrefixSessionLock, session, ino) }

// SessionLockPrefix is the prefix of the lock index of session.
func SessionLockPrefix(session uint64) []byte { return u64s(PrefixSessionLock, session) }

// ParseSessionLock parses a SessionLock key.
func ParseSessionLock(key []byte) (session, ino uint64, err error) {
	v, err := fixed(key, PrefixSessionLock, 2)
	if err != nil {
		return 0, 0, err
	}
	return v[0], v[1], nil
}

// Orphan is the key marking ino as unlinked but still open.
func Orphan(ino uint64) []byte { return u64s(PrefixOrphan, ino) }

// Relayout is the key marking ino as having stripes still to convert to
// its layout.
func Relayout(ino uint64) []byte { return u64s(PrefixRelayout, ino) }

// ParseRelayout returns the inode number of a relayout key.
func ParseRelayout(key []byte) (uint64, error) {
	v, err := fixed(key, PrefixRelayout, 1)
	if err != nil {
		return 0, err
	}
	return v[0], nil
}

// Shared is the key counting the references to version of chunk beyond the
// first: stripes that share it since a snapshot. No key means one reference.
func Shared(chunk, version uint64) []byte { return u64s(PrefixShared, chunk, version) }

// ParseShared returns the chunk and version of a Shared key.
func ParseShared(key []byte) (chunk, version uint64, err error) {
	v, err := fixed(key, PrefixShared, 2)
	if err != nil {
		return 0, 0, err
	}
	return v[0], v[1], nil
}

// Snapshot is the key of the tree snapshot being made at directory dst.
func Snapshot(dst uint64) []byte { return u64s(PrefixSnapshot, dst) }

// SnapTask is the key of task seq of the tree snapshot at dst: a source
// directory whose entries are still to be copied.
func SnapTask(dst, seq uint64) []byte { return u64s(PrefixSnapTask, dst, seq) }

// SnapTaskPrefix is the prefix of all tasks of the tree snapshot at dst.
func SnapTaskPrefix(dst uint64) []byte { return u64s(PrefixSnapTask, dst) }

// ParseSnapTask returns the snapshot and sequence number of a SnapTask key.
func ParseSnapTask(key []byte) (dst, seq uint64, err error) {
	v, err := fixed(key, PrefixSnapTask, 2)
	if err != nil {
		return 0, 0, err
	}
	return v[0], v[1], nil
}

// SnapLink is the key of the copy made of hard-linked file src by the tree
// snapshot at dst, so that its other links point at the same copy.
func SnapLink(dst, src uint64) []byte { return u64s(PrefixSnapLink, dst, src) }

// SnapLinkPrefix is the prefix of all hard-link copies of the snapshot at dst.
func SnapLinkPrefix(dst uint64) []byte { return u64s(PrefixSnapLink, dst) }

// Trash is the key of a file in the trash.
func Trash(ino uint64) []byte { return u64s(PrefixTrash, ino) }

// ParseTrash returns the inode of a Trash key.
func ParseTrash(key []byte) (uint64, error) {
	v, err := fixed(key, PrefixTrash, 1)
	if err != nil {
		return 0, err
	}
	return v[0], nil
}

// TrashTime is the key ordering the trash by deletion time (Unix ns).
func TrashTime(deletedNs int64, ino uint64) []byte {
	return u64s(PrefixTrashTime, uint64(deletedNs), ino)
}

// TrashBefore is the end of the range of TrashTime keys of files deleted
// before deletedNs.
func TrashBefore(deletedNs int64) []byte { return u64s(PrefixTrashTime, uint64(deletedNs)) }

// ParseTrashTime returns the deletion time and inode of a TrashTime key.
func ParseTrashTime(key []byte) (deletedNs int64, ino uint64, err error) {
	v, err := fixed(key, PrefixTrashTime, 2)
	if err != nil {
		return 0, 0, err
	}
	return int64(v[0]), v[1], nil
}

// DirQuota is the key of the quota of directory ino.
func DirQuota(ino uint64) []byte { return u64s(PrefixDirQuota, ino) }

// ParseDirQuota returns the directory of a DirQuota key.
func ParseDirQuota(key []byte) (uint64, error) {
	v, err := fixed(key, PrefixDirQuota, 1)
	if err != nil {
		return 0, err
	}
	return v[0], nil
}

// Kinds of IDQuota.
const (
	QuotaUID = 'u'
	QuotaGID = 'g'
)

// IDQuota is the key of the quota of user (kind QuotaUID) or group
// (QuotaGID) id.
func IDQuota(kind byte, id uint32) []byte {
	return binary.BigEndian.AppendUint32([]byte{PrefixIDQuota, kind}, id)
}

// ParseIDQuota returns the kind and id of an IDQuota key.
func ParseIDQuota(key []byte) (kind byte, id uint32, err error) {
	if len(key) != 6 || key[0] != PrefixIDQuota || (key[1] != QuotaUID && key[1] != QuotaGID) {
		return 0, 0, fmt.Errorf("%w: want a user or group quota key, got %x", ErrMalformed, key)
	}
	return key[1], binary.BigEndian.Uint32(key[2:]), nil
}

func u64s(prefix byte, vs ...uint64) []byte {
	k := make([]byte, 1, 1+8*len(vs))
	k[0] = prefix
	for _, v := range vs {
		k = binary.BigEndian.AppendUint64(k, v)
	}
	return k
}

// fixed parses a key made of prefix and n uint64s.
func fixed(key []byte, prefix byte, n int) ([]uint64, error) {
	if len(key) != 1+8*n || key[0] != prefix {
		return nil, fmt.Errorf("%w: want %q with %d integers, got %d bytes", ErrMalformed, prefix, n, len(key))
	}
	out := make([]uint64, n)
	for i := range out {
		out[i] = binary.BigEndian.Uint64(key[1+8*i:])
	}
	return out, nil
}

// named parses a key made of prefix, one uint64 and a name.
func named(key []byte, prefix byte) (uint64, string, error) {
	if len(key) < 9 || key[0] != prefix {
		return 0, "", fmt.Errorf("%w: want %q, integer and name, got %d bytes", ErrMalformed, prefix, len(key))
	}
	return binary.BigEndian.Uint64(key[1:]), string(key[9:]), nil
}

// ParseInode returns the inode number of an inode key.
func ParseInode(key []byte) (uint64, error) {
	v, err := fixed(key, PrefixInode, 1)
	if err != nil {
		return 0, err
	}
	return v[0], nil
}

// ParseDentry returns the parent and name of a dentry key.
func ParseDentry(key []byte) (parent uint64, name string, err error) {
	return named(key, PrefixDentry)
}

// ParseXattr returns the inode and attribute name of an xattr key.
func ParseXattr(key []byte) (ino uint64, name string, err error) {
	return named(key, PrefixXattr)
}

// ParseCookie returns the parent and cookie of a readdir index key.
func ParseCookie(key []byte) (parent, cookie uint64, err error) {
	v, err := fixed(key, PrefixCookie, 2)
	if err != nil {
		return 0, 0, err
	}
	return v[0], v[1], nil
}

// ParseStripe returns the inode and stripe index of a stripe key.
func ParseStripe(key []byte) (ino, stripe uint64, err error) {
	v, err := fixed(key, PrefixStripe, 2)
	if err != nil {
		return 0, 0, err
	}
	return v[0], v[1], nil
}

// ParseGrant returns the inode, stripe and version of a grant key.
func ParseGrant(key []byte) (ino, stripe, version uint64, err error) {
	v, err := fixed(key, PrefixGrant, 3)
	if err != nil {
		return 0, 0, 0, err
	}
	return v[0], v[1], v[2], nil
}

// ParseSession returns the session id of a session key.
func ParseSession(key []byte) (uint64, error) {
	v, err := fixed(key, PrefixSession, 1)
	if err != nil {
		return 0, err
	}
	return v[0], nil
}

// ParseOpen returns the inode and session of an open key.
func ParseOpen(key []byte) (ino, session uint64, err error) {
	v, err := fixed(key, PrefixOpen, 2)
	if err != nil {
		return 0, 0, err
	}
	return v[0], v[1], nil
}

// ParseOrphan returns the inode of an orphan key.
func ParseOrphan(key []byte) (uint64, error) {
	v, err := fixed(key, PrefixOrphan, 1)
	if err != nil {
		return 0, err
	}
	return v[0], nil
}

// ParseChunkserver returns the id of a chunkserver key.
func ParseChunkserver(key []byte) (string, error) {
	if len(key) < 2 || key[0] != PrefixChunkserver {
		return "", fmt.Errorf("%w: not a chunkserver key", ErrMalformed)
	}
	return string(key[1:]), nil
}

// ParseGC returns the chunkserver, chunk and version of a GC key.
func ParseGC(key []byte) (id string, chunk, version uint64, err error) {
	if len(key) < 3 || key[0] != PrefixGC {
		return "", 0, 0, fmt.Errorf("%w: not a gc key", ErrMalformed)
	}
	n := int(binary.BigEndian.Uint16(key[1:]))
	if len(key) != 3+n+16 {
		return "", 0, 0, fmt.Errorf("%w: gc key of %d bytes with a %d-byte id", ErrMalformed, len(key), n)
	}
	id = string(key[3 : 3+n])
	chunk = binary.BigEndian.Uint64(key[3+n:])
	version = binary.BigEndian.Uint64(key[3+n+8:])
	return id, chunk, version, nil
}

// EncodeUint64 encodes a counter value.
func EncodeUint64(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

// DecodeUint64 decodes a counter value.
func DecodeUint64(b []byte) (uint64, error) {
	if len(b) != 8 {
		return 0, fmt.Errorf("%w: counter value of %d bytes", ErrMalformed, len(b))
	}
	return binary.BigEndian.Uint64(b), nil
}

// PrefixRequest is the prefix of exactly-once request records:
// E millis client seq -> RequestRecord, ordered by the time (Unix
// milliseconds) of the request's first attempt. Concurrent requests thus get
// adjacent keys after all older ones, so the records of a group commit fill
// one or two pages at the end of the range instead of dirtying a page per
// client, and expiry reads only expired records.
const PrefixRequest = 'E'

// Request is the key of the outcome of request seq of client, first sent at
// the given Unix time in milliseconds.
func Request(millis, client, seq uint64) []byte { return u64s(PrefixRequest, millis, client, seq) }

// RequestPrefix is the prefix of all request records.
func RequestPrefix() []byte { return []byte{PrefixRequest} }

// RequestsBefore is the end of the range of request records first sent
// before the given Unix time in milliseconds.
func RequestsBefore(millis uint64) []byte { return u64s(PrefixRequest, millis) }
