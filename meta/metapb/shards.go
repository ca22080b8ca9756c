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

// DurableShardsNeeded returns how many of a stripe's k+m shards must be
// durable for a write of layout l to commit: l.MinWriteShards when set, else
// k+1 (Ceph's min_size rule: the stripe still survives one more failure),
// never more than k+m. Meta enforces it at commit; writers use it to decide
// between committing degraded and waiting.
func (l *Layout) DurableShardsNeeded() int {
	if l.GetMinWriteShards() != 0 {
		return int(min(l.GetMinWriteShards(), l.GetK()+l.GetM()))
	}
	return int(min(l.GetK()+1, l.GetK()+l.GetM()))
}
