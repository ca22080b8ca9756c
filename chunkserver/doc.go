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
