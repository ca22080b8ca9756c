// Package ec is the striping and erasure-coding engine of the rdmafs client's
// file I/O: pure computation, no I/O, no network, no package-level state.
//
// # Layout
//
// A file is a sequence of stripes. A stripe has K data shards and M parity shards,
// each at most Unit bytes, so a stripe holds K×Unit bytes of file data (see
// [Layout]). File byte x lives in stripe x/(K×Unit), data shard (x/Unit)%K, at
// offset x%Unit within that shard: data shards are filled one after the other,
// which keeps sequential file ranges sequential within each shard's chunk.
// [Layout.Extents] and [ExtentIter] map a file range to per-shard extents.
//
// # Shard lengths: the convention
//
// A stripe that holds n bytes of file data (n = K×Unit except in the file's last
// stripe) has the shard length L = min(Unit, n): the length of data shard 0, which
// is always the longest, because data fills shard 0 first. Then:
//
//   - data shard i holds its own bytes only, DataShardLen(n, i) =
//     clamp(n - i×Unit, 0, Unit) bytes; it is stored trimmed to that length, and a
//     data shard with no bytes at all (beyond the end of file) is not stored;
//   - for coding, every data shard is taken as zero-padded to L;
//   - every parity shard is exactly L bytes.
//
// This is the HDFS erasure-coding convention for a short last stripe. The reasons:
// a small file costs its size plus M×L of parity, not (K+M)×Unit (a 4 KiB file in
// a 4+2 layout with 1 MiB units stores 4 KiB of data and 8 KiB of parity, not
// 6 MiB); a stripe's parity length follows from the file size alone, so a reader
// or a repairer needs nothing else; and the padding is never materialised: the
// [Codec] feeds it from a read-only zero buffer, so the caller's (registered,
// off-heap) buffers are used as they are, with no copy and no scratch stripe.
// Data shards of full stripes are Unit bytes, so the convention only matters for
// the last stripe of a file. A data shard's stored length is always
// DataShardLen of the stripe's current n: when a write makes the stripe grow,
// the shards before the new end grow too (with zeros, over a hole), and
// [WritePlan.Rewrite] lists them.
//
// # Replication
//
// K=1 is replication: the M "parity" shards are copies of the data shard. The
// [Codec] handles it without Reed-Solomon: Encode copies, Reconstruct copies a
// survivor. An engine may skip Encode entirely and write the one data buffer to
// all M+1 chunkservers.
//
// # Other pieces
//
// [Layout.PlanWrite] says which old bytes a partial-stripe write must read before
// parity can be recomputed, and [Readahead] decides how far to prefetch for one
// open file.
package ec
