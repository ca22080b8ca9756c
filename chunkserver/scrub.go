package chunkserver

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/rdmafs/rdmafs/chunkserver/chunk"
	"github.com/rdmafs/rdmafs/chunkserver/store"
)

// Scrubbing reads every stored chunk version back from disk (past the page
// cache) and checks its CRC32C; one found damaged, or whose file is gone,
// is reported corrupt like one a read found, and the metadata service has
// it rebuilt from the other shards. A pass spreads its reads evenly over
// the interval the metadata service sets (a week by default); a request for
// a pass now (rdmafs admin scrub) starts one at once that reads as fast as
// ScrubRate allows. The progress goes to the metadata service with every
// heartbeat.

// ScrubProgress is what a chunkserver reports of its scrubbing.
type ScrubProgress struct {
	// Requested is the latest request a finished pass started after.
	Requested time.Time
	// PassStarted is when the pass in progress started (zero: none).
	PassStarted time.Time
	// PassBytes of PassTotal are verified in the pass in progress.
	PassBytes, PassTotal int64
	// LastPassDone is when the last full pass finished (zero: none yet).
	LastPassDone time.Time
	// BytesTotal and ErrorsTotal count the bytes verified and the versions
	// found corrupt or missing since the process started.
	BytesTotal, ErrorsTotal int64
	// CorruptPending counts the versions known corrupt (by scrubbing or a
	// read) and not deleted yet: their replacement is not committed.
	CorruptPending int
}

// scrubber runs the passes.
type scrubber struct {
	s     *Server
	limit *rateLimiter
	kick  chan struct{} // the schedule changed
	now   func() time.Time

	mu        sync.Mutex
	interval  time.Duration // 0: no scrubbing
	requested time.Time     // the latest request from meta
	progress  ScrubProgress
}

func newScrubber(s *Server, rate int64) *scrubber {
	return &scrubber{s: s, limit: newRateLimiter(rate), kick: make(chan struct{}, 1), now: time.Now}
}

// schedule takes the metadata service's interval and latest request.
func (sc *scrubber) schedule(interval time.Duration, requested time.Time) {
	sc.mu.Lock()
	changed := interval != sc.interval || requested.After(sc.requested)
	sc.interval = max(interval, 0)
	if requested.After(sc.requested) {
		sc.requested = requested
	}
	sc.mu.Unlock()
	if changed {
		select {
		case sc.kick <- struct{}{}:
		default:
		}
	}
}

// report returns the progress to send with the next heartbeat.
func (sc *scrubber) report() ScrubProgress {
	sc.mu.Lock()
	p := sc.progress
	sc.mu.Unlock()
	sc.s.mu.Lock()
	p.CorruptPending = len(sc.s.corrupt)
	sc.s.mu.Unlock()
	return p
}

// urgent reports whether a request is waiting that no pass covers, and
// returns it.
func (sc *scrubber) urgentLocked() (time.Time, bool) {
	return sc.requested, sc.requested.After(sc.progress.Requested)
}

// loop runs passes until ctx ends: one per interval while an interval is
// set (each spread over it), and one at once for each request.
func (sc *scrubber) loop(ctx context.Context) {
	defer sc.s.wg.Done()
	// base is when the last regular pass started, or when the last one run
	// for a request ended: the next regular one is due an interval later.
	var base time.Time
	for ctx.Err() == nil {
		sc.mu.Lock()
		interval := sc.interval
		_, urgent := sc.urgentLocked()
		sc.mu.Unlock()
		due := base.Add(interval)
		if !urgent && (interval == 0 || sc.now().Before(due)) {
			var t *time.Timer
			var wake <-chan time.Time
			if interval > 0 {
				t = time.NewTimer(due.Sub(sc.now()))
				wake = t.C
			}
			select {
			case <-ctx.Done():
			case <-sc.kick:
			case <-wake:
			}
			if t != nil {
				t.Stop()
			}
			continue
		}
		start := sc.now()
		if err := sc.pass(ctx); err != nil {
			return
		}
		base = start
		if urgent {
			base = sc.now()
		}
	}
}

// errRestartPass starts the pass again: a request arrived during a pass
// that started before it.
var errRestartPass = errors.New("chunkserver: scrub request: pass restarted")

// pass verifies every version stored when it starts. It returns an error
// only when ctx ends.
func (sc *scrubber) pass(ctx context.Context) error {
	var versions []chunk.Info
	var total int64
	longest := 0
	sc.s.store.All(func(info chunk.Info) bool {
		versions = append(versions, info)
		total += int64(info.Length)
		longest = max(longest, int(info.Length))
		return true
	})
	// In key order, so that a regular pass a restart interrupted resumes
	// where it was (scrubPosition).
	slices.SortFunc(versions, func(a, b chunk.Info) int { return keyCompare(a.Key, b.Key) })
	start := sc.now()
	sc.mu.Lock()
	req, urgent := sc.urgentLocked()
	interval := sc.interval
	sc.mu.Unlock()
	var done, bad int64
	skip := 0
	if pos, ok := sc.loadPosition(); ok && !urgent {
		start = pos.started
		for skip < len(versions) && keyCompare(versions[skip].Key, pos.after) <= 0 {
			done += int64(versions[skip].Length)
			skip++
		}
	}
	sc.mu.Lock()
	sc.progress.PassStarted, sc.progress.PassBytes, sc.progress.PassTotal = start, done, total
	sc.mu.Unlock()
	sc.s.log.Debug("chunkd: scrub pass started", "versions", len(versions), "resumed_after", skip, "bytes", total, "at_once", urgent, "over", interval)
	buf := make([]byte, longest)
	for n, info := range versions[skip:] {
		if !urgent && n%64 == 63 {
			sc.savePosition(scrubPosition{started: start, after: info.Key})
		}
		if !urgent {
			// Spread evenly: this version's bytes start at done/total of
			// the interval.
			at := start.Add(time.Duration(float64(interval) * float64(done) / float64(max(total, 1))))
			if err := sc.waitUntil(ctx, at); errors.Is(err, errRestartPass) {
				return nil
			} else if err != nil {
				return err
			}
		} else if r, _ := sc.latestRequest(); r.After(req) {
			return nil // a newer request: a new pass covers it
		}
		if err := sc.limit.wait(ctx, int(info.Length)); err != nil {
			return err
		}
		if err := sc.verify(info.Key, buf[:info.Length]); err != nil {
			bad++
		}
		done += int64(info.Length)
		sc.mu.Lock()
		sc.progress.PassBytes = done
		sc.progress.BytesTotal += int64(info.Length)
		sc.mu.Unlock()
		sc.s.metrics.ScrubBytes.Add(float64(info.Length))
	}
	// The list goes before the pass counts as done, so that a request's
	// end (admin scrub --wait) means meta has it.
	sc.sendInventory(ctx)
	sc.savePosition(scrubPosition{})
	end := sc.now()
	sc.mu.Lock()
	sc.progress.PassStarted, sc.progress.LastPassDone = time.Time{}, end
	if urgent && req.After(sc.progress.Requested) {
		sc.progress.Requested = req
	}
	sc.mu.Unlock()
	sc.s.metrics.ScrubLastPass.Set(float64(end.Unix()))
	log := sc.s.log.Debug
	if len(versions) > 0 {
		log = sc.s.log.Info
	}
	log("chunkd: scrub pass done", "versions", len(versions), "bytes", done, "corrupt", bad, "took", end.Sub(start).Round(time.Millisecond))
	return nil
}

// inventoryBatch is how many versions one Inventory call carries (meta's
// limit: core.MaxInventoryPerCall).
const inventoryBatch = 1 << 16

// sendInventory sends the list of versions stored now to the metadata
// service, which checks it against what it references (admin check).
func (sc *scrubber) sendInventory(ctx context.Context) {
	m := sc.s.cfg.Membership
	if m == nil {
		return
	}
	var keys []chunk.Key
	sc.s.store.All(func(info chunk.Info) bool {
		keys = append(keys, info.Key)
		return true
	})
	taken := sc.now()
	for first := true; first || len(keys) > 0; first = false {
		n := min(len(keys), inventoryBatch)
		if err := m.Inventory(ctx, sc.s.ID(), taken, keys[:n], n == len(keys)); err != nil {
			sc.s.log.Warn("chunkd: sending the list of stored versions", "err", err)
			return
		}
		keys = keys[n:]
	}
}

// scrubPosition is how far a regular pass got: it started at started and
// verified every version up to after, in key order. It is kept in a file
// of the data directory so that a pass survives restarts (a chunkd
// restarted more often than the interval would otherwise never finish
// one).
type scrubPosition struct {
	started time.Time
	after   chunk.Key
}

const positionFile = "scrub-position"

// savePosition writes p, or removes the file for the zero p. A failure
// only costs a resumed pass.
func (sc *scrubber) savePosition(p scrubPosition) {
	path := filepath.Join(sc.s.store.Dir(), positionFile)
	if p.started.IsZero() {
		_ = os.Remove(path)
		return
	}
	b := fmt.Appendf(nil, "%d %d %d\n", p.started.UnixNano(), p.after.Chunk, p.after.Version)
	if err := os.WriteFile(path+".tmp", b, 0o600); err == nil {
		_ = os.Rename(path+".tmp", path)
	}
}

// loadPosition reads the saved position, if any (and sane).
func (sc *scrubber) loadPosition() (scrubPosition, bool) {
	b, err := os.ReadFile(filepath.Join(sc.s.store.Dir(), positionFile))
	if err != nil {
		return scrubPosition{}, false
	}
	var ns int64
	var p scrubPosition
	if _, err := fmt.Sscanf(string(b), "%d %d %d", &ns, &p.after.Chunk, &p.after.Version); err != nil || ns <= 0 || time.Unix(0, ns).After(sc.now()) {
		return scrubPosition{}, false
	}
	p.started = time.Unix(0, ns)
	return p, true
}

// keyCompare orders chunk versions by chunk, then version.
func keyCompare(a, b chunk.Key) int {
	if c := cmp.Compare(a.Chunk, b.Chunk); c != 0 {
		return c
	}
	return cmp.Compare(a.Version, b.Version)
}

// latestRequest returns the latest request from meta.
func (sc *scrubber) latestRequest() (time.Time, bool) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.urgentLocked()
}

// waitUntil waits for at; a request meanwhile ends the wait with
// errRestartPass: the pass starts over at once, so that all of it comes
// after the request.
func (sc *scrubber) waitUntil(ctx context.Context, at time.Time) error {
	for {
		d := at.Sub(sc.now())
		if d <= 0 {
			return nil
		}
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
			return nil
		case <-sc.kick:
			t.Stop()
			if _, u := sc.latestRequest(); u {
				return errRestartPass
			}
		}
	}
}

// verify reads one version back from disk; a damaged or missing one is
// reported corrupt (and counted).
func (sc *scrubber) verify(key chunk.Key, buf []byte) error {
	_, err := sc.s.store.Verify(key, buf)
	switch {
	case err == nil, errors.Is(err, store.ErrNotFound):
		return nil // deleted since the pass started
	case errors.Is(err, store.ErrCorrupt):
		if sc.s.noteCorrupt(key) { // counted once, until it is replaced
			sc.mu.Lock()
			sc.progress.ErrorsTotal++
			sc.mu.Unlock()
			sc.s.metrics.ScrubErrors.Inc()
		}
		return err
	default:
		sc.s.log.Warn("chunkd: scrub: read failed", "chunk", key, "err", err)
		return err
	}
}
