package perftest

import (
	"context"
	"fmt"
	"time"

	"github.com/rdmafs/rdmafs/rdma"
)

// Memcpy is the baseline for same-host transports: a plain copy of the same sizes
// between two buffers of registered-kind memory (memfd mappings, like the shm
// transport's), one operation at a time.
type Memcpy struct {
	src, dst *rdma.Memory
}

// NewMemcpy allocates the baseline's buffers.
func NewMemcpy() (*Memcpy, error) {
	src, err := rdma.AllocMemory("memcpy-src", 2*MaxSize)
	if err != nil {
		return nil, err
	}
	dst, err := rdma.AllocMemory("memcpy-dst", 2*MaxSize)
	if err != nil {
		src.Free()
		return nil, err
	}
	return &Memcpy{src: src, dst: dst}, nil
}

// Close frees the buffers.
func (m *Memcpy) Close() error {
	m.src.Free()
	return m.dst.Free()
}

// Run copies cfg.Size bytes per operation, alternating between two halves of the
// buffers as the rdma client alternates remote ranges.
func (m *Memcpy) Run(ctx context.Context, cfg Config) (Result, error) {
	if cfg.Size <= 0 || cfg.Size > MaxSize {
		return Result{}, fmt.Errorf("perftest: size %d outside 1..%d", cfg.Size, MaxSize)
	}
	src, dst := m.src.Bytes(), m.dst.Bytes()
	if cfg.Op == OpWrite {
		src, dst = dst, src
	}
	lat := newLatencies()
	start := time.Now()
	deadline := start.Add(cfg.Duration)
	iters := 0
	for iters < cfg.MinIters || time.Now().Before(deadline) {
		if iters%1024 == 0 && ctx.Err() != nil {
			return Result{}, ctx.Err()
		}
		off := (iters % 2) * MaxSize
		t0 := time.Now()
		copy(dst[off:off+cfg.Size], src[off:off+cfg.Size])
		lat.add(time.Since(t0))
		iters++
	}
	res := Result{Config: cfg, Iters: iters, Elapsed: time.Since(start)}
	res.P50, res.P99 = lat.percentiles()
	return res, nil
}
