package ec

import "fmt"

// ReadaheadConfig bounds a [Readahead] window.
type ReadaheadConfig struct {
	Min int64 // the first window of a sequential run; > 0
	Max int64 // the largest window; >= Min
}

// DefaultReadahead returns the readahead bounds for files in layout l: from one
// stripe up to 8 stripes (so 4 MiB to 32 MiB for the default 4+2/1MiB).
func DefaultReadahead(l Layout) ReadaheadConfig {
	return ReadaheadConfig{Min: l.StripeSize(), Max: 8 * l.StripeSize()}
}

// Validate reports whether c is usable.
func (c ReadaheadConfig) Validate() error {
	if c.Min <= 0 || c.Max < c.Min {
		return fmt.Errorf("ec: readahead config min %d max %d: want 0 < min <= max", c.Min, c.Max)
	}
	return nil
}

// Readahead is the prefetch policy of one open file. It watches the reads and
// says how much to prefetch after each: nothing for a random read; for a
// sequential run (each read starting where the previous one ended, or a first
// read at offset 0) a window that starts at Min and doubles with every further
// sequential read up to Max. A read elsewhere ends the run and resets the
// window. It keeps no history beyond the previous read, allocates nothing, and
// is not safe for concurrent use: the file handle's lock guards it.
type Readahead struct {
	cfg    ReadaheadConfig
	next   int64 // where a sequential read would start
	window int64 // current window; 0 outside a sequential run
	seen   bool  // a read has been observed
}

// NewReadahead returns the policy for a newly opened file.
func NewReadahead(cfg ReadaheadConfig) (*Readahead, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Readahead{cfg: cfg}, nil
}

// Observe records a read of [off, off+n) and returns how many bytes after the
// read, [off+n, off+n+ahead), to prefetch. The caller subtracts what it
// already has cached or in flight and clips at the end of file. A zero-length
// or out-of-bounds read changes nothing.
func (r *Readahead) Observe(off, n int64) (ahead int64) {
	if n <= 0 || checkRange(off, n) != nil {
		return 0
	}
	sequential := off == r.next && (r.seen || off == 0)
	switch {
	case !sequential:
		r.window = 0
	case r.window == 0:
		r.window = r.cfg.Min
	default:
		r.window = min(r.window*2, r.cfg.Max)
	}
	r.seen = true
	r.next = off + n
	return r.window
}

// Window returns the current window: 0 outside a sequential run.
func (r *Readahead) Window() int64 { return r.window }

// Reset forgets the history, as after a seek the file system learns of, or a
// truncation.
func (r *Readahead) Reset() { *r = Readahead{cfg: r.cfg} }
