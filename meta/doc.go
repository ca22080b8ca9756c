// Package meta is the root of the rdmafs metadata service. The service itself
// lives in sub-packages, each with one purpose:
//
//   - metapb: the gRPC protocol and the stored record formats (protobuf)
//   - metaerr: errors that carry a POSIX errno across gRPC
//   - keys: the key layout shared by every KV backend
//   - kv, kv/bolt, kv/kvtest: the transactional KV interface, the embedded
//     bbolt backend (write-ahead log, pipelined group commit), and the
//     backend conformance suite
//   - placement: choosing chunkservers for the shards of a stripe
//   - core: the namespace, layouts, stripe table, sessions, membership and
//     garbage collection, as an implementation of metapb.MetaServer
//   - auth: the cluster secret
//   - server: the gRPC server with authentication and metrics
//   - client: the Go client used by the FUSE client and chunkd
//   - metabench: the metadata benchmark (rdmafs bench meta)
//   - metatest: helpers that start meta servers for tests
//
// # Using the service
//
// Connect with client.Dial(addr, secret) or client.DialSecretFile; every
// metapb.MetaClient method is available on the returned *client.Client.
// Errors convert to syscall.Errno with client.Errno. Namespace requests carry
// a metapb.Caller (uid, gid, groups) for permission checks; a nil Caller is
// root.
//
// A FUSE client opens a session (Client.StartSession keeps it alive), passes
// its id to Create, Open, Release and SetAttr (ftruncate), and closes it on
// unmount. Files that are unlinked while open stay until their last Release
// or until the session expires.
//
// Writing stripe s of file ino: GrantWrite(ino, [s]) returns the version to
// write and the placement (k+m shards, data shards first, each a fresh chunk
// id on a distinct live chunkserver with its address). Write each shard as
// (chunk id, version) to its chunkserver, make it durable, then
// CommitStripes(ino, [{s, version, expected_version: grant.committed_version,
// length}], size, mtime). If another writer committed first the call fails
// with codes.Aborted and client.ConflictStripes lists the stripes to grant
// and write again. Many stripes can be granted and committed in one call.
// Too few live chunkservers for the layout fail GrantWrite with
// codes.FailedPrecondition (errno ENOSPC).
//
// Reading: GetStripes(ino, first, count) returns the committed version,
// length and placement of each written stripe; absent stripes and bytes past
// a stripe's length read as zeros; the file size bounds the data.
//
// A chunkserver calls Register(id, address, transports, zone, capacity) at
// start and Heartbeat every RegisterReply.heartbeat_interval_ms; each reply
// lists (chunk id, version) pairs to delete, which the next heartbeat reports
// back in HeartbeatRequest.deleted once deleted. A reply with reregister set
// asks it to Register again.
package meta
