package fs

import (
	"testing"

	"github.com/rdmafs/rdmafs/meta/metapb"
)

// TestCacheStamps: a stamp moves on only with a commit made on top of the
// state it shows; a commit on top of another state (another mount's
// change came first), a failed commit or a reset leaves it unknown.
func TestCacheStamps(t *testing.T) {
	var c cacheStamps
	at := func(ctime, mtime int64, size uint64) *metapb.Attr {
		return &metapb.Attr{CtimeNs: ctime, MtimeNs: mtime, Size: size}
	}
	if c.shows(1, at(10, 10, 5)) {
		t.Fatal("an unknown file's caches show a state")
	}
	c.set(1, at(10, 10, 5))
	if !c.shows(1, at(10, 10, 5)) || c.shows(1, at(10, 10, 6)) || c.shows(1, at(11, 10, 5)) || c.shows(1, nil) {
		t.Fatal("a stamp matches another state")
	}
	c.committed(1, 10, at(20, 20, 8)) // on top of the stamp
	if !c.shows(1, at(20, 20, 8)) {
		t.Fatal("a commit on top of the stamp did not move it on")
	}
	c.committed(1, 25, at(30, 30, 8)) // on top of a state the caches never showed
	if c.shows(1, at(30, 30, 8)) || c.shows(1, at(20, 20, 8)) {
		t.Fatal("a commit on top of another state left a stamp")
	}
	c.committed(1, 30, at(40, 40, 8)) // unknown stays unknown
	if c.shows(1, at(40, 40, 8)) {
		t.Fatal("a commit made an unknown stamp known")
	}
	c.set(1, at(50, 50, 8))
	c.committed(1, 50, nil) // failed
	if c.shows(1, at(50, 50, 8)) {
		t.Fatal("a failed commit left the stamp")
	}
	c.set(2, at(1, 1, 1))
	c.set(2, nil)
	if c.shows(2, at(1, 1, 1)) {
		t.Fatal("a reset stamp still shows")
	}
}
