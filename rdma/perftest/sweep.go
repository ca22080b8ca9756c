package perftest

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Runner performs measurements: a Client or a TCPClient.
type Runner interface {
	Run(ctx context.Context, cfg Config) (Result, error)
}

// Row is one line of a sweep: the transport's result and, when a baseline ran,
// the baseline's.
type Row struct {
	RDMA Result
	Base *Result
}

// Sweep measures every op at every size with each runner in turn, row by row, so
// that the transport and its baseline see the same machine conditions.
func Sweep(ctx context.Context, r, base Runner, ops []Op, sizes []int, depth, batch int, dur time.Duration) ([]Row, error) {
	var rows []Row
	for _, op := range ops {
		for _, size := range sizes {
			cfg := Config{Op: op, Size: size, Depth: depth, Batch: batch, Duration: dur, MinIters: max(20, min(1000, (256<<20)/size))}
			if size >= 1<<20 {
				cfg.MinIters = max(20, cfg.MinIters)
			}
			res, err := r.Run(ctx, cfg)
			if err != nil {
				return rows, err
			}
			row := Row{RDMA: res}
			if base != nil {
				b, err := base.Run(ctx, cfg)
				if err != nil {
					return rows, fmt.Errorf("baseline: %w", err)
				}
				row.Base = &b
			}
			rows = append(rows, row)
		}
	}
	return rows, nil
}

// Print writes rows as a table. With a baseline, the ratio columns give the
// transport's bandwidth and p50 latency relative to it.
func Print(w io.Writer, title, baseline string, rows []Row) {
	fmt.Fprintln(w, title)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	hasBase := len(rows) > 0 && rows[0].Base != nil
	fmt.Fprint(tw, "op\tbytes\titers\tMB/s\tMops/s\tp50\tp99\t")
	if hasBase {
		fmt.Fprintf(tw, "%s MB/s\t%s p50\tbw ratio\tp50 ratio\t", baseline, baseline)
	}
	fmt.Fprintln(tw)
	for _, row := range rows {
		r := row.RDMA
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.1f\t%.3f\t%s\t%s\t", r.Op, r.Size, r.Iters, r.MBps(), r.Mops(), fmtDur(r.P50), fmtDur(r.P99))
		if b := row.Base; b != nil {
			fmt.Fprintf(tw, "%.1f\t%s\t%.2f\t%.2f\t", b.MBps(), fmtDur(b.P50), r.MBps()/b.MBps(), float64(r.P50)/float64(b.P50))
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
}

func fmtDur(d time.Duration) string {
	switch {
	case d < time.Millisecond:
		return fmt.Sprintf("%.1fus", float64(d)/float64(time.Microsecond))
	default:
		return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond))
	}
}

// AllSizes returns the powers of two from 2 bytes to MaxSize, as perftest -a.
func AllSizes() []int {
	var s []int
	for n := 2; n <= MaxSize; n *= 2 {
		s = append(s, n)
	}
	return s
}

// ParseSizes parses "all" or a comma-separated list of sizes with optional K, M
// suffixes (powers of 1024).
func ParseSizes(s string) ([]int, error) {
	if s == "all" {
		return AllSizes(), nil
	}
	var sizes []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		mult := 1
		switch {
		case strings.HasSuffix(f, "K"), strings.HasSuffix(f, "k"):
			mult, f = 1<<10, f[:len(f)-1]
		case strings.HasSuffix(f, "M"), strings.HasSuffix(f, "m"):
			mult, f = 1<<20, f[:len(f)-1]
		}
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 || n*mult > MaxSize {
			return nil, fmt.Errorf("size %q: want 1..%d bytes, with an optional K or M suffix", f, MaxSize)
		}
		sizes = append(sizes, n*mult)
	}
	return sizes, nil
}

// ParseOps parses a comma-separated list of operations.
func ParseOps(s string) ([]Op, error) {
	var ops []Op
	for _, f := range strings.Split(s, ",") {
		switch op := Op(strings.TrimSpace(f)); op {
		case OpWrite, OpRead, OpSend:
			ops = append(ops, op)
		default:
			return nil, fmt.Errorf("op %q: want write, read or send", f)
		}
	}
	return ops, nil
}
