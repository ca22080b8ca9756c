package fs

import "sync/atomic"

// Stats count how the mount answered lookups and getattrs: from what it
// keeps (a directory's lease, the attributes of files it owns or of its
// own changes to a directory) or by asking the metadata service.
type Stats struct {
	// KeptAnswers counts lookups and getattrs answered from what the mount
	// keeps, without a call to meta.
	KeptAnswers atomic.Int64
	// MetaAnswers counts those that asked meta.
	MetaAnswers atomic.Int64
}

// Stats returns the mount's counters.
func (fsys *FS) Stats() *Stats { return &fsys.stats }
