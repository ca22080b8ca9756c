package metapb

// SameShards reports whether two shard lists name the same chunks on the same
// chunkservers, in the same order (addresses aside).
func SameShards(a, b []*Shard) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].GetChunkId() != b[i].GetChunkId() || a[i].GetServerId() != b[i].GetServerId() {
			return false
		}
	}
	return true
}
