package chunkserver

import (
	"context"
	"fmt"
	"sync"

	"github.com/rdmafs/rdmafs/internal/stripe"
)

// Relayout tasks: one shard of a stripe re-encoded in another layout of
// the same stripe size. The worker reads the stripe's data shards (or,
// when some cannot be read, enough of the others to decode them), lays the
// stripe's bytes out in the new layout's units, and stores the shard asked
// for: a slice of the bytes for a data shard, or the new layout's parity.

// RelayoutTarget is the layout a relayout task re-encodes its stripe in.
type RelayoutTarget struct {
	K, M int
	Unit int64
}

// relayout builds shard t.Shard of t.To from the stripe t.Sources hold and
// stores it as t.Key. It returns the bytes stored.
func (r *repairer) relayout(ctx context.Context, t RepairTask) (int, error) {
	to := *t.To
	n := t.K + t.M
	size := int64(t.K) * t.Unit
	if t.K < 1 || t.M < 0 || t.Unit <= 0 || len(t.Sources) != n || to.K < 1 || to.M < 0 || to.Unit*int64(to.K) != size ||
		t.Shard < 0 || t.Shard >= to.K+to.M || t.Length < 0 || t.Length > size {
		return 0, fmt.Errorf("relayout task %d: bad shape: %d+%d unit %d to %d+%d unit %d, shard %d, %d sources, length %d",
			t.ID, t.K, t.M, t.Unit, to.K, to.M, to.Unit, t.Shard, len(t.Sources), t.Length)
	}
	cl := stripe.CodedLen(t.Length, t.Unit)
	ncl := stripe.CodedLen(t.Length, to.Unit)
	parity := 0
	if to.K > 1 && t.Shard >= to.K {
		parity = to.M
	}
	// One buffer: the stripe's bytes (size), the source's parity shards for
	// a degraded read, and the new parity when a parity shard is asked for.
	total := size + int64(t.M)*cl + int64(parity)*ncl
	buf, ok := r.mem.Alloc(int(total))
	if !ok {
		return 0, fmt.Errorf("relayout task %d: %d bytes: %w", t.ID, total, errRepairMemory)
	}
	defer r.mem.Free(buf)
	b := r.mem.Bytes(buf)[:total]
	data := b[:size]
	// Source shard i is read into slot i: data shards where their bytes lie
	// in the stripe, parity shards after the stripe.
	slot := func(i int) int64 {
		if i < t.K {
			return int64(i) * t.Unit
		}
		return size + int64(i-t.K)*cl
	}
	have := make([]bool, n)
	readSome := func(idx []int) {
		var wg sync.WaitGroup
		for _, i := range idx {
			if src := t.Sources[i]; !src.Available || src.Addr == "" {
				continue
			}
			wg.Go(func() {
				if err := r.readInto(ctx, t.Sources[i], buf, int(slot(i)), int(cl)); err != nil {
					r.s.log.Info("chunkd: relayout: a source shard is unreadable", "task", t.ID, "shard", i, "err", err)
					return
				}
				have[i] = true
			})
		}
		wg.Wait()
	}
	var dataIdx, others []int
	for i := range n {
		if i < t.K {
			dataIdx = append(dataIdx, i)
		} else {
			others = append(others, i)
		}
	}
	if t.K == 1 {
		// Copies: the first one readable is the stripe.
		for i := range n {
			if t.Sources[i].Available && t.Sources[i].Addr != "" &&
				r.readInto(ctx, t.Sources[i], buf, 0, int(cl)) == nil {
				have[0] = true
				break
			}
		}
		if !have[0] {
			return 0, fmt.Errorf("relayout task %d: no copy of the stripe readable", t.ID)
		}
	} else {
		readSome(dataIdx)
		missing := 0
		for _, i := range dataIdx {
			if !have[i] {
				missing++
			}
		}
		if missing > 0 {
			// Degraded: read parity shards, as many as data shards are missing.
			for _, i := range others {
				if missing == 0 {
					break
				}
				readSome([]int{i})
				if have[i] {
					missing--
				}
			}
			if missing > 0 {
				return 0, fmt.Errorf("relayout task %d: fewer than %d shards of the stripe readable", t.ID, t.K)
			}
			enc, err := r.codecs.Get(t.K, t.M)
			if err != nil {
				return 0, err
			}
			shards := make([][]byte, n)
			for i := range n {
				at := slot(i)
				if have[i] {
					shards[i] = b[at : at+cl]
				} else if i < t.K {
					shards[i] = b[at : at : at+cl] // rebuilt in place
				}
			}
			if err := enc.ReconstructData(shards); err != nil {
				return 0, fmt.Errorf("relayout task %d: decode the stripe: %w", t.ID, err)
			}
			for i := range t.K {
				if at := slot(i); &shards[i][0] != &b[at] {
					copy(b[at:at+cl], shards[i])
				}
			}
		}
	}
	// Bytes of each unit past the coded length are zeros in the stripe.
	for i := range int64(t.K) {
		clear(data[i*t.Unit+cl : (i+1)*t.Unit])
	}
	j := t.Shard
	stored := stripe.ShardLen(t.Length, to.Unit, to.K, j)
	var out []byte
	switch {
	case j < to.K:
		out = data[int64(j)*to.Unit : int64(j)*to.Unit+stored]
	case to.K == 1:
		out = data[:stored] // a copy
	default:
		enc, err := r.codecs.Get(to.K, to.M)
		if err != nil {
			return 0, err
		}
		np := b[size+int64(t.M)*cl:]
		shards := make([][]byte, to.K+to.M)
		for i := range to.K {
			shards[i] = data[int64(i)*to.Unit : int64(i)*to.Unit+ncl]
		}
		for p := range to.M {
			shards[to.K+p] = np[int64(p)*ncl : int64(p+1)*ncl]
		}
		if err := enc.Encode(shards); err != nil {
			return 0, fmt.Errorf("relayout task %d: encode: %w", t.ID, err)
		}
		out = shards[j][:stored]
	}
	return len(out), r.store(t, out)
}
