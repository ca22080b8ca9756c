package client

import (
	"context"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rdmafs/rdmafs/meta/metapb"
)

// inoBatch is how many inode numbers a session asks for at a time.
const inoBatch = 1024

// inoPool holds the inode numbers meta gave a session (AllocInodes) for the
// creates it answers before sending them: the range in use and the next,
// fetched in the background when the first is half used.
type inoPool struct {
	mu       sync.Mutex
	cur      [2]uint64 // [first, end)
	next     [2]uint64
	fetching bool
	off      bool // the server does not give inode numbers (an older one)
}

// NextIno returns an inode number of the session's own for a create
// answered before meta applies it (CreateRequest.ino), or false when none
// is at hand: the create then goes the synchronous way while more are
// fetched in the background.
func (s *Session) NextIno() (uint64, bool) {
	p := &s.inos
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cur[0] == p.cur[1] {
		p.cur, p.next = p.next, [2]uint64{}
	}
	var ino uint64
	ok := p.cur[0] < p.cur[1]
	if ok {
		ino = p.cur[0]
		p.cur[0]++
	}
	if !p.fetching && !p.off && p.next[0] == p.next[1] && p.cur[1]-p.cur[0] < inoBatch/2 {
		p.fetching = true
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), DefaultFailoverTimeout)
			defer cancel()
			s.fetchInos(ctx)
		}()
	}
	return ino, ok
}

// fetchInos asks meta for the next range of inode numbers (one fetch at a
// time: the caller set p.fetching).
func (s *Session) fetchInos(ctx context.Context) {
	r, err := s.c.AllocInodes(ctx, &metapb.AllocInodesRequest{SessionId: s.id, Count: inoBatch})
	p := &s.inos
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fetching = false
	switch {
	case err == nil:
		p.next = [2]uint64{r.First, r.First + uint64(r.Count)}
	case status.Code(err) == codes.Unimplemented:
		p.off = true
	}
}
