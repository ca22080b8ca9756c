package fileio

// seqWindow is the prefetch policy of one open file. It watches the reads
// and says how much to prefetch after each: nothing for a random read; for a
// sequential run (each read starting where the previous one ended, or a
// first read at offset 0) a window that starts at min and doubles with every
// further sequential read up to max. A read elsewhere ends the run and
// resets the window. It keeps no history beyond the previous read, allocates
// nothing, and is not safe for concurrent use: the file's lock guards it.
type seqWindow struct {
	min, max int64 // bounds of the window, 0 < min <= max
	next     int64 // where a sequential read would start
	window   int64 // current window; 0 outside a sequential run
	seen     bool  // a read has been observed
}

// newSeqWindow returns the policy for a newly opened file, or nil when the
// bounds are not 0 < min <= max (no readahead).
func newSeqWindow(min, max int64) *seqWindow {
	if min <= 0 || max < min {
		return nil
	}
	return &seqWindow{min: min, max: max}
}

// observe records a read of [off, off+n) and returns how many bytes after
// the read, [off+n, off+n+ahead), to prefetch. The caller subtracts what it
// already has cached or in flight and clips at the end of file. A
// zero-length or out-of-range read changes nothing.
func (w *seqWindow) observe(off, n int64) (ahead int64) {
	if n <= 0 || off < 0 || off > maxFileSize-n {
		return 0
	}
	sequential := off == w.next && (w.seen || off == 0)
	switch {
	case !sequential:
		w.window = 0
	case w.window == 0:
		w.window = w.min
	default:
		w.window = min(w.window*2, w.max)
	}
	w.seen = true
	w.next = off + n
	return w.window
}

// reset forgets the history, as after a truncation.
func (w *seqWindow) reset() { w.next, w.window, w.seen = 0, 0, false }

// maxFileSize bounds the offsets the window takes for reads.
const maxFileSize = 1 << 62
