// Package meta is the root of the rdmafs metadata service. The service itself
// lives in sub-packages, each with one purpose:
//
//   - metapb: the gRPC protocol and the stored record formats (protobuf)
//   - metaerr: errors that carry a POSIX errno across gRPC
//   - keys: the key layout shared by every KV backend
//   - kv, kv/bolt, kv/kvtest: the transactional KV interface, the embedded
//     bbolt backend with group commit, and the backend conformance suite
//   - placement: choosing chunkservers for the shards of a stripe
//   - core: the namespace, layouts, stripe table, sessions, membership and
//     garbage collection, as an implementation of metapb.MetaServer
//   - auth: the cluster secret
//   - server: the gRPC server with authentication and metrics
//   - client: the Go client used by the FUSE client and chunkd
//   - metatest: helpers that start meta servers for tests
package meta
