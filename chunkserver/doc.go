// Package chunkserver is chunkd, the storage daemon of rdmafs, as a library: it
// keeps chunk versions durable in a store (package store), holds resident copies
// and write staging in one registered memory pool (package mempool) and serves the
// chunk protocol (package proto) to clients over rdma queue pairs, granting each
// client revocable remote access through memory windows bound on its own queue
// pair. The client side of the protocol is package client; package chunktest
// starts chunkservers (in-process or as chunkd processes) for tests.
//
// # The chunk protocol
//
// A client connects with an HMAC token of the cluster secret in the connect
// private data; chunkd rejects a bad or replayed token, or a connection it has no
// room for, with a text reason, and accepts with the connection's limits:
// credits (request messages the client may have outstanding, each one of
// chunkd's posted receive buffers), the batch and message sizes, the largest
// version and the lease time.
//
// Control messages are SEND/RECV: a request message carries a batch of requests,
// the reply message their results in order. Chunk bytes move one-sided:
//
//   - ReadLease(chunk, version) makes the version resident (loading it from disk,
//     checksum verified) and pins it, binds a memory window over it on the
//     client's queue pair with remote read access and answers {lease id, addr,
//     rkey, length, crc32c, ttl}. The client RDMA_READs from it into its own
//     buffers, as often as it likes, until the lease ends. RenewLease extends it,
//     ReleaseLease ends it; at the end chunkd invalidates the window and later
//     reads fail with REM_ACCESS_ERR. Leasing a version the connection already
//     holds renews the same lease.
//   - PrepareWrite(chunk, new version, length) first sets disk room aside for
//     the version (store.Claim): a chunkserver that cannot take it — the room
//     left would be under the reserve, deleted versions kept for reuse counted
//     as free — answers StatusNoSpace at once, which the client sees as an
//     error matching syscall.ENOSPC. Then it reserves a staging buffer and
//     binds a window with remote write access: {addr, rkey, ttl}. The client
//     RDMA_WRITEs the data and sends Commit(chunk, version, crc32c): chunkd
//     revokes the window, verifies the checksum over the staged bytes, writes the
//     version durably (into a slot file whose name is already durable, then
//     fdatasync) and only then answers; the staged buffer becomes the version's
//     resident copy. Abort drops a staging;
//     an unused one expires. A commit the disk refuses answers StatusNoSpace.
//     The commit answers the stored version's {length, crc32c}. A commit
//     retried after its ack was lost finds no staging and the version stored:
//     it answers OK when its crc32c is the version's and StatusExists
//     otherwise (a retried patch commit too: its crc32c is the patch's).
//   - PreparePatch(chunk, new version, length, base) and Clone(chunk, new
//     version, base) derive a new version from a stored base version of the
//     same chunk on this chunkd (0 < base < new version, else StatusInvalid; a
//     missing base answers its status, unknown chunk or wrong version; a new
//     version stored or being written StatusExists). The new version has
//     exactly the base's length and is stored like any other: complete,
//     checksummed, durable; the base is untouched. PreparePatch claims disk
//     room for the base's length and grants a staging of length bytes for a
//     patch (byte ranges to overwrite, see package proto); the client
//     RDMA_WRITEs it and sends Commit with the crc32c of the patch. The commit
//     verifies it, pins the base through the resident cache (loading it,
//     checksum verified, if needed), copies it into a new buffer, applies the
//     patch (a patch that does not fit the base answers StatusInvalid and
//     stores nothing), checksums and stores the result, which becomes resident,
//     and answers its {length, crc32c}. Clone stores a copy of the base
//     straight from its resident copy and answers {length, crc32c}; cloning a
//     version already stored with the base's length and crc32c answers OK.
//   - Slab and PatchSlab: a patch in one round trip. Slab grants the
//     connection, once and until it ends, a staging slab of SlabPerConn bytes
//     (offered in the accept data; all slabs together take at most an eighth
//     of the registered memory; refused to a read-only token). The
//     client RDMA_WRITEs a patch into a part of the slab it is not using for
//     another and sends PatchSlab(chunk, new version, length, base, offset)
//     and Commit in one message: PatchSlab checks what PreparePatch checks and
//     copies the patch out of the slab into a staging of its own, so the
//     commit verifies and applies bytes the client can no longer change.
//   - Delete, Stat and List work on stored versions.
//
// A version is never overwritten: a new version goes to a free slot, so a reader of
// version v (whose lease pins v's resident copy) always reads exactly v, even
// while v+1 is committed or v is deleted. Errors are per request, as a status
// (unknown chunk, wrong version, length over the limit, commit without prepare,
// checksum mismatch, no space, lease expired, not authorized, busy, ...). A
// message that does not decode closes the connection. When a connection ends,
// every lease and staging it held is revoked and freed.
//
// Memory is bounded: the pool is allocated and registered once; every
// connection's message buffers, every resident version and every staging buffer
// is an extent of it. Unleased resident versions are evicted in LRU order;
// leased ones never are; when nothing can be evicted the request gets "busy".
// Per connection, credits bound the requests in progress, a fixed set of memory
// windows (allocated at connect) bounds the leases and stagings, and a quota
// bounds the staging bytes.
package chunkserver
