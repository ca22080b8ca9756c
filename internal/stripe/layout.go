package stripe

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/rdmafs/rdmafs/internal/bytesize"
)

// DefaultInline is the size up to which files keep their data in metadata
// unless format is told otherwise, and MaxInline the largest allowed: an
// inline file's bytes travel in every commit and stripe lookup of it, and
// a 4 KiB file costs one metadata commit instead of k+m shard writes.
const (
	DefaultInline = 64 << 10
	MaxInline     = 256 << 10
)

// Layout is an erasure-coding layout: K data and M parity shards of at most
// Unit bytes each (K = 1: replication with M+1 copies). It is the one layout
// type of the project; its wire and stored form is metapb.Layout
// (metapb.LayoutOf and (*metapb.Layout).Stripe convert). A Layout is a
// comparable value; the zero Layout is no layout (one not known yet).
type Layout struct {
	K, M int
	Unit int64
	// MinWrite is how many of a stripe's K+M shards must be durable for a
	// write to commit (0: K+1, capped at K+M; see MinWriteShards).
	MinWrite int
	// Inline is the size up to which a file's data is kept in metadata
	// (0: never), at most MaxInline and one stripe.
	Inline int64
}

// Validate returns nil when the layout is usable and otherwise an error
// naming the first rule it breaks: K in 1..64; M at most 64 and K+M at most
// 128; Unit a multiple of 4096 between 4 KiB and 1 GiB; MinWrite 0 or in
// K..K+M; Inline not negative, at most MaxInline and at most one stripe.
func (l Layout) Validate() error {
	switch {
	case l.K < 1 || l.K > 64:
		return fmt.Errorf("layout: k=%d out of range 1..64", l.K)
	case l.M < 0 || l.M > 64 || l.K+l.M > 128:
		return fmt.Errorf("layout: m=%d out of range (k+m at most 128)", l.M)
	case l.Unit < 4096 || l.Unit > 1<<30 || l.Unit%4096 != 0:
		return fmt.Errorf("layout: unit %d must be a multiple of 4096 between 4 KiB and 1 GiB", l.Unit)
	case l.MinWrite != 0 && (l.MinWrite < l.K || l.MinWrite > l.K+l.M):
		return fmt.Errorf("layout: min-write-shards %d out of range %d..%d (k..k+m)", l.MinWrite, l.K, l.K+l.M)
	case l.Inline < 0:
		return fmt.Errorf("layout: inline size %d is negative", l.Inline)
	case l.Inline > MaxInline || l.Inline > l.StripeSize():
		return fmt.Errorf("layout: inline size %d above %d or one stripe (%d)", l.Inline, MaxInline, l.StripeSize())
	}
	return nil
}

// String formats the layout as "k+m/unit", followed by "/min-write=N" when
// MinWrite is set and "/inline=N" when Inline is (e.g. "4+2/1048576/inline=65536").
// Users and logs see it: keep it stable.
func (l Layout) String() string {
	s := fmt.Sprintf("%d+%d/%d", l.K, l.M, l.Unit)
	if l.MinWrite != 0 {
		s += fmt.Sprintf("/min-write=%d", l.MinWrite)
	}
	if l.Inline != 0 {
		s += fmt.Sprintf("/inline=%d", l.Inline)
	}
	return s
}

// ParseLayout parses what String formats, "k+m/unit[/min-write=N][/inline=N]"
// (unit and inline in bytes, or with a suffix such as KiB or MiB), and
// validates the result.
func ParseLayout(s string) (Layout, error) {
	parts := strings.Split(strings.TrimSpace(s), "/")
	var l Layout
	km := strings.SplitN(parts[0], "+", 2)
	if len(parts) < 2 || len(km) != 2 {
		return Layout{}, fmt.Errorf("layout %q: want k+m/unit[/min-write=N][/inline=SIZE], e.g. 4+2/1MiB", s)
	}
	var err error
	if l.K, err = strconv.Atoi(km[0]); err != nil {
		return Layout{}, fmt.Errorf("layout %q: k: %w", s, err)
	}
	if l.M, err = strconv.Atoi(km[1]); err != nil {
		return Layout{}, fmt.Errorf("layout %q: m: %w", s, err)
	}
	if l.Unit, err = bytesize.Parse(parts[1]); err != nil {
		return Layout{}, fmt.Errorf("layout %q: unit: %w", s, err)
	}
	for _, opt := range parts[2:] {
		name, val, ok := strings.Cut(opt, "=")
		switch {
		case !ok:
			err = fmt.Errorf("%q is not name=value", opt)
		case name == "min-write":
			l.MinWrite, err = strconv.Atoi(val)
		case name == "inline":
			l.Inline, err = bytesize.Parse(val)
		default:
			err = fmt.Errorf("unknown setting %q (min-write, inline)", name)
		}
		if err != nil {
			return Layout{}, fmt.Errorf("layout %q: %w", s, err)
		}
	}
	if err := l.Validate(); err != nil {
		return Layout{}, err
	}
	return l, nil
}

// StripeSize returns the bytes of file data a stripe holds: K×Unit.
func (l Layout) StripeSize() int64 { return int64(l.K) * l.Unit }

// CodedLen returns the length every shard of a stripe holding length bytes
// is coded at (data shards zero-padded to it): CodedLen(length, l.Unit).
func (l Layout) CodedLen(length int64) int64 { return CodedLen(length, l.Unit) }

// ShardLen returns the stored length of shard j (0..K+M-1) of a stripe
// holding length bytes: a data shard's own bytes, a parity shard's coded
// length (ShardLen(length, l.Unit, l.K, j)).
func (l Layout) ShardLen(length int64, j int) int64 { return ShardLen(length, l.Unit, l.K, j) }

// MinWriteShards returns how many of a stripe's K+M shards must be durable
// for a write to commit: MinWrite when set, else K+1 (Ceph's min_size rule:
// the stripe still survives one more failure), never more than K+M. Meta
// enforces it at commit and placement; writers use it to decide between
// committing degraded and waiting.
func (l Layout) MinWriteShards() int {
	if l.MinWrite != 0 {
		return min(l.MinWrite, l.K+l.M)
	}
	return min(l.K+1, l.K+l.M)
}
