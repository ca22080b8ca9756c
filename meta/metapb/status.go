package metapb

// ChunkserversUp returns how many of the chunkservers in the status are up
// (heartbeating); 0 for a nil status.
func (x *StatusReply) ChunkserversUp() int {
	n := 0
	for _, cs := range x.GetChunkservers() {
		if cs.GetUp() {
			n++
		}
	}
	return n
}
