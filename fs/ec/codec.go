package ec

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/klauspost/reedsolomon"
)

// ErrTooFewShards is wrapped by the errors of [Codec.Reconstruct] and
// [Codec.ReconstructData] when fewer than K shards of a stripe are available.
var ErrTooFewShards = errors.New("too few shards to reconstruct")

// ErrShardSize is wrapped by errors about shard slices whose lengths or
// capacities do not fit the stripe.
var ErrShardSize = errors.New("bad shard size")

// zeroBufLen bounds a Codec's zero buffer (the source of the zero padding of
// short data shards) where it cannot be a read-only mapping of the zero page;
// padding longer than the buffer is coded in pieces. verifyChunk is the piece
// size Verify recomputes parity in.
const (
	zeroBufLen  = 64 << 10
	verifyChunk = 64 << 10
)

// CodecOptions tunes a [Codec]. The zero value is the default.
type CodecOptions struct {
	// Goroutines is the most goroutines one Encode/Verify/Reconstruct call may
	// use. 0 or 1: the call runs on the caller's goroutine, which suits a file
	// I/O engine that already codes many stripes at once. Larger values let
	// reedsolomon split big shards across goroutines (with a few more small
	// allocations per call).
	Goroutines int
}

// Codec computes and checks parity and rebuilds lost shards for one [Layout].
// Make one per layout with [NewCodec] and share it: a Codec is immutable and
// safe for concurrent use. Its methods temporarily rewrite the entries of the
// shards slice they are given (restoring them before they return), so one
// shards slice must not be used by two calls at once.
//
// Shard slices follow the package's shard-length convention: in a stripe with
// shard length L, parity shards are L bytes and data shards at most L bytes,
// taken as zero-padded to L. Shards are used in place: nothing is copied
// (except for replication, where parity is a copy) and nothing shard-sized is
// ever allocated.
type Codec struct {
	l    Layout
	rs   reedsolomon.Encoder // nil when K=1 (replication) or M=0
	zero []byte              // read-only zeros
}

// NewCodec returns a Codec for layout l (see [CodecOptions] for opts; at most
// one is used).
func NewCodec(l Layout, opts ...CodecOptions) (*Codec, error) {
	if err := l.Validate(); err != nil {
		return nil, fmt.Errorf("ec: new codec: %w", err)
	}
	var o CodecOptions
	if len(opts) > 0 {
		o = opts[0]
	}
	c := &Codec{l: l}
	c.zero = newZero(c, int(l.Unit))
	if l.K > 1 && l.M > 0 {
		ro := []reedsolomon.Option{reedsolomon.WithMaxGoroutines(max(1, o.Goroutines))}
		if o.Goroutines > 1 {
			ro = append(ro, reedsolomon.WithAutoGoroutines(int(l.Unit)))
		}
		rs, err := reedsolomon.New(l.K, l.M, ro...)
		if err != nil {
			return nil, fmt.Errorf("ec: new codec %v: %w", l, err)
		}
		c.rs = rs
	}
	return c, nil
}

// Layout returns the codec's layout.
func (c *Codec) Layout() Layout { return c.l }

// Encode computes the parity shards of one stripe in place.
//
// shards has K+M entries: the data shards, then the parity shards. The shard
// length L is len(shards[0]), 0 < L <= Unit. Data shards 1..K-1 may be shorter
// than L, down to empty or nil (beyond the end of file): their missing bytes
// are taken as zeros, without being written. Every parity shard must be L bytes
// long and is overwritten. Encode never allocates (with default options).
func (c *Codec) Encode(shards [][]byte) error {
	L, err := c.checkCoded("encode", shards)
	if err != nil {
		return err
	}
	k := c.l.K
	if c.rs == nil { // replication, or no parity at all
		for _, p := range shards[k:] {
			if !sameStart(p, shards[0]) {
				copy(p, shards[0])
			}
		}
		return nil
	}
	dlen := codedLens(shards, k, L)
	if _, err := c.segments(opEncode, shards, L, &dlen, nil, nil); err != nil {
		return fmt.Errorf("ec: encode %v stripe (shard length %d): %w", c.l, L, err)
	}
	return nil
}

// Verify reports whether the parity shards of a stripe match its data shards.
// shards follows the rules of [Codec.Encode] and is not modified. Verify
// recomputes parity piecewise into one scratch buffer of M×64 KiB that it
// allocates per call: it is meant for tests and scrubbing, not the data path.
func (c *Codec) Verify(shards [][]byte) (bool, error) {
	L, err := c.checkCoded("verify", shards)
	if err != nil {
		return false, err
	}
	k := c.l.K
	if c.rs == nil {
		for _, p := range shards[k:] {
			if string(p) != string(shards[0]) { // no allocation: compiler-optimised comparison
				return false, nil
			}
		}
		return true, nil
	}
	dlen := codedLens(shards, k, L)
	ok, err := c.segments(opVerify, shards, L, &dlen, nil, make([]byte, c.l.M*min(L, verifyChunk)))
	if err != nil {
		return false, fmt.Errorf("ec: verify %v stripe (shard length %d): %w", c.l, L, err)
	}
	return ok, nil
}

// ReconstructData rebuilds the missing data shards of a stripe that holds n
// bytes of file data (0 < n <= StripeSize; see [Layout.StripeDataLen]).
//
// shards has K+M entries. An entry with length 0 is missing, except a data
// shard that holds no file data (DataShardLen(n, i) == 0), which is always
// available as zeros. Available data shard i has between DataShardLen(n, i) and
// L = ShardLen(n) bytes (shorter ones are zero-padded); available parity shards
// have L bytes. A missing data shard i must have capacity for DataShardLen(n, i)
// bytes: it is rebuilt in that memory and its entry set to that length.
// Missing parity shards are left alone. Only the bytes the data shards need are
// computed. The error wraps [ErrTooFewShards] when fewer than K shards are
// available. Nothing shard-sized is allocated; reedsolomon allocates about
// 1.5 KiB of bookkeeping per coding pass.
func (c *Codec) ReconstructData(shards [][]byte, n int64) error {
	return c.reconstruct("reconstruct data", shards, n, true)
}

// Reconstruct is [Codec.ReconstructData] that also rebuilds missing parity
// shards, which must then have capacity for L = ShardLen(n) bytes and are set
// to that length.
func (c *Codec) Reconstruct(shards [][]byte, n int64) error {
	return c.reconstruct("reconstruct", shards, n, false)
}

func (c *Codec) reconstruct(what string, shards [][]byte, n int64, dataOnly bool) error {
	k, m := c.l.K, c.l.M
	if len(shards) != k+m {
		return fmt.Errorf("ec: %s %v stripe: %d shards given, want %d: %w", what, c.l, len(shards), k+m, ErrShardSize)
	}
	if n <= 0 || n > c.l.StripeSize() {
		return fmt.Errorf("ec: %s %v stripe: %d bytes of data, want 1..%d: %w", what, c.l, n, c.l.StripeSize(), ErrShardSize)
	}
	L := c.l.ShardLen(n)
	// need[i]: bytes shard i must end up with if it is missing (0: not wanted).
	// dlen[i]: bytes an available data shard has (the rest is zero padding).
	var need, dlen [MaxShards]int
	var missing [MaxShards]bool
	avail, wanted := 0, 0
	for i, s := range shards {
		want := L
		if i < k {
			want = c.l.DataShardLen(n, i)
		}
		switch {
		case i < k && want == 0 && len(s) <= L:
			avail++ // beyond the end of file: zeros, whatever was passed
			dlen[i] = len(s)
		case len(s) == 0:
			missing[i] = true
			if i < k || !dataOnly {
				if cap(s) < want {
					return fmt.Errorf("ec: %s %v stripe: missing shard %d has capacity %d, need %d: %w", what, c.l, i, cap(s), want, ErrShardSize)
				}
				need[i] = want
				wanted++
			}
		case i < k && (len(s) < want || len(s) > L):
			return fmt.Errorf("ec: %s %v stripe: data shard %d has %d bytes, want %d..%d: %w", what, c.l, i, len(s), want, L, ErrShardSize)
		case i >= k && len(s) != L:
			return fmt.Errorf("ec: %s %v stripe: parity shard %d has %d bytes, want %d: %w", what, c.l, i, len(s), L, ErrShardSize)
		default:
			avail++
			dlen[i] = len(s)
		}
	}
	if wanted == 0 {
		return nil
	}
	if avail < k {
		return fmt.Errorf("ec: %s %v stripe: %d of %d shards available, need %d: %w", what, c.l, avail, k+m, k, ErrTooFewShards)
	}
	if c.rs == nil { // replication (K=1): copy any survivor
		src := -1
		for i := range shards {
			if !missing[i] {
				src = i
				break
			}
		}
		for i := range shards {
			if missing[i] && need[i] > 0 {
				shards[i] = shards[i][:need[i]]
				copy(shards[i], shards[src])
			}
		}
		return nil
	}
	for i := range shards {
		if missing[i] {
			dlen[i] = -1 // marks the slot for segments
		}
	}
	if _, err := c.segments(opReconstruct, shards, L, &dlen, &need, nil); err != nil {
		return fmt.Errorf("ec: %s %v stripe (%d bytes): %w", what, c.l, n, err)
	}
	return nil
}

// checkCoded checks the shards given to Encode or Verify and returns L.
func (c *Codec) checkCoded(what string, shards [][]byte) (int, error) {
	k, m := c.l.K, c.l.M
	if len(shards) != k+m {
		return 0, fmt.Errorf("ec: %s %v stripe: %d shards given, want %d: %w", what, c.l, len(shards), k+m, ErrShardSize)
	}
	L := len(shards[0])
	if L == 0 || int64(L) > c.l.Unit {
		return 0, fmt.Errorf("ec: %s %v stripe: data shard 0 has %d bytes, want 1..%d: %w", what, c.l, L, c.l.Unit, ErrShardSize)
	}
	for i, s := range shards {
		if i < k && len(s) > L {
			return 0, fmt.Errorf("ec: %s %v stripe: data shard %d has %d bytes, more than shard 0 (%d): %w", what, c.l, i, len(s), L, ErrShardSize)
		}
		if i >= k && len(s) != L {
			return 0, fmt.Errorf("ec: %s %v stripe: parity shard %d has %d bytes, want %d: %w", what, c.l, i, len(s), L, ErrShardSize)
		}
	}
	return L, nil
}

// codedLens returns the lengths segments needs for Encode and Verify: the data
// shards' own, L for the parity shards.
func codedLens(shards [][]byte, k, L int) (dlen [MaxShards]int) {
	for i, s := range shards {
		dlen[i] = L
		if i < k {
			dlen[i] = len(s)
		}
	}
	return dlen
}

type segOp int

const (
	opEncode segOp = iota
	opVerify
	opReconstruct
)

// segments runs op over [0, L) in segments within which every shard is uniform:
// an available data shard i is either all real bytes (dlen[i] >= end) or all
// padding (dlen[i] <= start, fed from c.zero), and a missing shard (dlen[i] < 0)
// is either wanted throughout (need[i] >= end) or not at all. Segments with
// padding are at most len(c.zero) long. The entries of shards are rewritten per
// segment and restored at the end; for opReconstruct the rebuilt shards are then
// set to their need[i] bytes. For opVerify parity is recomputed into scratch
// (M×min(L, verifyChunk) bytes) and compared; the result says whether all of it matched.
func (c *Codec) segments(op segOp, shards [][]byte, L int, dlen, need *[MaxShards]int, scratch []byte) (bool, error) {
	k, t := c.l.K, c.l.K+c.l.M
	var saved [MaxShards][]byte
	copy(saved[:t], shards)
	var required []bool // allocated only for reconstruction: it escapes into reedsolomon
	if op == opReconstruct {
		required = make([]bool, t)
	}
	ok := true
	var err error
	for a := 0; a < L && err == nil; {
		b, pad := L, false
		for i := range t {
			d := dlen[i]
			if d < 0 {
				d = need[i]
			} else if i >= k {
				continue // available parity: always L
			}
			if d > a && d < b {
				b = d
			}
			if d <= a && dlen[i] >= 0 {
				pad = true
			}
		}
		if pad && b-a > len(c.zero) {
			b = a + len(c.zero)
		}
		if op == opVerify && b-a > verifyChunk {
			b = a + verifyChunk
		}
		work := false
		for i := range t {
			switch {
			case op == opReconstruct && dlen[i] < 0 && need[i] > a: // missing and wanted here
				shards[i] = saved[i][a:a:cap(saved[i])]
				required[i] = true
				work = true
			case op == opVerify && i >= k: // recompute into scratch
				stride := len(scratch) / c.l.M
				shards[i] = scratch[(i-k)*stride:][:b-a]
			case dlen[i] < 0: // missing, not wanted here
				shards[i] = nil
				if required != nil {
					required[i] = false
				}
			case dlen[i] <= a: // padding
				shards[i] = c.zero[:b-a]
			default:
				shards[i] = saved[i][a:b]
			}
		}
		switch op {
		case opEncode:
			err = c.rs.Encode(shards)
		case opVerify:
			err = c.rs.Encode(shards)
			for i := k; i < t && err == nil; i++ {
				ok = ok && string(shards[i]) == string(saved[i][a:b])
			}
		case opReconstruct:
			if work {
				err = c.rs.ReconstructSome(shards, required[:t])
			}
		}
		if !ok {
			break
		}
		a = b
	}
	copy(shards, saved[:t])
	if op == opReconstruct && err == nil {
		for i := range t {
			if dlen[i] < 0 && need[i] > 0 {
				shards[i] = saved[i][:need[i]]
			}
		}
	}
	return ok && err == nil, err
}

// sameStart reports whether a and b start at the same address (so copying one
// to the other is a no-op).
func sameStart(a, b []byte) bool {
	return len(a) > 0 && len(b) > 0 && unsafe.SliceData(a) == unsafe.SliceData(b)
}
