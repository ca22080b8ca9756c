package core

import (
	"context"

	"github.com/rdmafs/rdmafs/meta/metapb"
)

// Scrubbing is the chunkservers' work (chunkserver/scrub.go): each reads
// every chunk version it stores back from disk and checks its CRC32C, a
// pass spread over Config.ScrubInterval, and reports a damaged or missing
// one as corrupt, which repair rebuilds from the other shards. Meta tells
// them the interval and the time of the last request for a pass now (in
// heartbeat replies), and keeps what each reported (in heartbeats) for
// Status.

// scrubState is meta's side of scrubbing (under members.mu).
type scrubState struct {
	requested int64                          // the last Scrub call (0: none since start)
	reports   map[string]*metapb.ScrubReport // by chunkserver, from heartbeats
}

// Scrub implements metapb.MetaServer: every chunkserver starts a pass now
// (at its rate cap) unless one started after the request already.
func (s *Service) Scrub(ctx context.Context, req *metapb.ScrubRequest) (*metapb.ScrubReply, error) {
	now := s.now().UnixNano()
	s.members.mu.Lock()
	defer s.members.mu.Unlock()
	s.scrub.requested = max(now, s.scrub.requested+1)
	s.log.Info("scrub requested: every chunkserver verifies its chunks now")
	return &metapb.ScrubReply{RequestedNs: s.scrub.requested}, nil
}

// noteScrubLocked keeps a chunkserver's report and returns what its
// heartbeat's reply tells it (the caller holds members.mu).
func (s *Service) noteScrubLocked(id string, r *metapb.ScrubReport, out *metapb.HeartbeatReply) {
	if r != nil {
		if s.scrub.reports == nil {
			s.scrub.reports = map[string]*metapb.ScrubReport{}
		}
		s.scrub.reports[id] = r
	}
	out.ScrubIntervalNs = s.cfg.ScrubInterval.Nanoseconds()
	out.ScrubRequestedNs = s.scrub.requested
}

// scrubStatusLocked sums the reports of the chunkservers in cs, filling in
// each one's (the caller holds members.mu).
func (s *Service) scrubStatusLocked(cs []*metapb.ChunkserverStatus) *metapb.ScrubStatus {
	st := &metapb.ScrubStatus{IntervalNs: s.cfg.ScrubInterval.Nanoseconds(), RequestedNs: s.scrub.requested}
	oldest, all := int64(0), true
	for _, c := range cs {
		r := s.scrub.reports[c.Id]
		c.Scrub = r
		if r == nil {
			if c.Up {
				all = false
			}
			continue
		}
		st.BytesTotal += r.BytesTotal
		st.ErrorsTotal += r.ErrorsTotal
		if !c.Up {
			continue
		}
		if r.LastPassDoneNs == 0 {
			all = false
		} else if oldest == 0 || r.LastPassDoneNs < oldest {
			oldest = r.LastPassDoneNs
		}
	}
	if all {
		st.LastFullPassNs = oldest
	}
	return st
}
