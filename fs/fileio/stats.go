package fileio

import chunkclient "github.com/rdmafs/rdmafs/chunkserver/client"

// Wire returns the counts of the work requests the engine's chunkserver
// connections posted.
func (e *Engine) Wire() *chunkclient.WireStats { return &e.wire }

// DirtyBytes returns the buffer memory held by written data not yet
// committed: the dirty and flushing stripes of every file.
func (e *Engine) DirtyBytes() int64 { return e.dirtyBytes.Load() }

// addBuf adds n to the buffer bytes f's dirty and flushing stripes hold,
// and to the engine's total. The caller holds f.mu.
func (e *Engine) addBuf(f *file, n int) {
	f.bufBytes += n
	e.dirtyBytes.Add(int64(n))
}
