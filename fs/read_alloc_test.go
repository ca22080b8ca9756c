package fs

import (
	"context"
	"testing"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/rdmafs/rdmafs/meta/metapb"
)

// bytesData is a Data whose every file holds byte(offset) at each offset.
type bytesData struct{ Data }

func (bytesData) ObserveCommits(func(uint64), func(uint64, *metapb.CommitStripesReply)) {}

func (bytesData) Read(_ context.Context, _ uint64, p []byte, off int64) (int, error) {
	for i := range p {
		p[i] = byte(off + int64(i))
	}
	return len(p), nil
}

// releaseCounter counts releases of bytes served in place.
type releaseCounter struct{ n int }

func (r *releaseCounter) Release() { r.n++ }

// inPlaceData is bytesData that serves reads at odd offsets from memory of
// its own, with a release.
type inPlaceData struct {
	bytesData
	own []byte
	rel *releaseCounter
}

func (d inPlaceData) ReadInPlace(ctx context.Context, ino uint64, p []byte, off int64) ([]byte, interface{ Release() }, error) {
	if off%2 == 0 {
		n, err := d.Read(ctx, ino, p, off)
		return p[:n], nil, err
	}
	n, err := d.Read(ctx, ino, d.own[:len(p)], off)
	return d.own[:n], d.rel, err
}

// TestReadReplyAllocs checks that a read allocates nothing (its reply comes
// from a pool), whether its bytes are in go-fuse's buffer or served in place,
// and that go-fuse's single Done releases bytes served in place exactly once.
func TestReadReplyAllocs(t *testing.T) {
	rel := &releaseCounter{}
	for _, tc := range []struct {
		name string
		data Data
		off  int64
	}{
		{"plain Data", bytesData{}, 8},
		{"in place, caller's buffer", inPlaceData{own: make([]byte, 4096), rel: rel}, 8},
		{"in place, own memory", inPlaceData{own: make([]byte, 4096), rel: rel}, 9},
	} {
		fsys, _ := New(Options{Data: tc.data})
		fh := &fileHandle{fsys: fsys, ino: 1}
		dest := make([]byte, 4096)
		// A request's context as go-fuse passes it: the read's own context
		// comes from a pool.
		ctx := &fuse.Context{Caller: fuse.Caller{Pid: 1}, Cancel: make(chan struct{})}
		before := rel.n
		read := func() {
			r, e := fh.Read(ctx, dest, tc.off)
			if e != 0 {
				t.Fatalf("%s: read: %v", tc.name, e)
			}
			b, _ := r.Bytes(nil)
			if len(b) != len(dest) || b[0] != byte(tc.off) || b[len(b)-1] != byte(tc.off+int64(len(b))-1) {
				t.Fatalf("%s: read returned other bytes", tc.name)
			}
			r.Done()
		}
		read()
		allocs := testing.AllocsPerRun(100, read)
		if allocs != 0 {
			t.Errorf("%s: %.1f allocations per read, want 0", tc.name, allocs)
		}
		if tc.off%2 == 1 {
			if got := rel.n - before; got != 101+1 {
				t.Errorf("%s: %d releases for %d reads", tc.name, got, 101+1)
			}
		}
	}
}
