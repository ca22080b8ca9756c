// Package stripe is the one rule for how long each shard of an erasure-coded
// stripe is stored, shared by the client that writes and reads stripes and by
// chunkd's repair, which rebuilds them. Its Layout is the one erasure-coding
// layout type of the project, used by the metadata service, the client and
// the commands alike; its wire and stored form is metapb.Layout.
//
// A stripe of a layout with k data shards of unit bytes holds length bytes of
// file data (k×unit except in a file's last stripe). Data shard i holds the
// file bytes [i×unit, (i+1)×unit) of the stripe and is stored as those bytes
// only: short stripes, as HDFS stores them. Parity shards are as long as the
// longest data shard, shard 0; for coding, every data shard counts as
// zero-padded to that length. Lengths are rounded up to 4 KiB, chunkd's block,
// and every shard stores at least one block, so that a shard beyond the end
// of the file's data is still a chunk version like the others.
//
// Why short stripes: every data shard as long as shard 0 (the rule before)
// stores a 110 KB file six times over in a 4+2 layout with 1 MiB units,
// short stripes three times; over the files of /usr/lib, /usr/share and a Go
// tree that is 1.70-2.06 times their size instead of 2.20-3.44 (measured
// 2026-11-26, docs/performance.md). Reading a shard's bytes past its stored
// length, which only decoding does, gives zeros.
package stripe

// Block is the granularity of stored shard lengths.
const Block = 4096

// ShardLen returns the stored length of shard (0..k+m-1) of a stripe with k
// data shards of unit bytes holding length bytes: for data shard i its own
// bytes, for a parity shard (shard >= k) those of data shard 0, rounded up to
// Block and at least Block. A length of 0 (an empty stripe) gives Block.
func ShardLen(length, unit int64, k, shard int) int64 {
	i := shard
	if i >= k {
		i = 0
	}
	n := min(max(length-int64(i)*unit, 0), unit)
	return max((n+Block-1)/Block*Block, Block)
}

// CodedLen returns the length every shard of such a stripe is coded at: the
// stored length of data shard 0, which parity shards also have.
func CodedLen(length, unit int64) int64 { return ShardLen(length, unit, 1, 0) }
