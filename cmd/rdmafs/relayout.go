package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/rdmafs/rdmafs/fs"
	"github.com/rdmafs/rdmafs/internal/bytesize"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// newRelayoutCommand is `rdmafs relayout PATH --ec K+M`: existing files
// converted to another layout in the background, through the
// rdmafs.relayout extended attribute of a mounted rdmafs.
func newRelayoutCommand() *cobra.Command {
	var ec, unit string
	var minWrite int
	var wait bool
	cmd := &cobra.Command{
		Use:   "relayout PATH --ec K+M [--unit SIZE] [--min-write-shards N] [--wait]",
		Short: "Convert existing files to another layout, online (replication to erasure coding and back)",
		Long: "Converts the file PATH, or every file below the directory PATH, to the layout K+M while\n" +
			"applications keep using them: the chunkservers re-encode one stripe at a time (bandwidth-capped\n" +
			"like repair), each stripe swapped in by a compare-and-set, the old layout's space freed as they\n" +
			"go; it survives restarts of meta and chunkservers. New writes take the new layout at once.\n" +
			"A file keeps its stripe size (k times unit): its new unit is that size over K, which must be a\n" +
			"multiple of 4 KiB. The directories below PATH give new files the layout too, with --unit or by\n" +
			"default their previous stripe size over K. `rdmafs status` shows progress; --wait draws it.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p := args[0]
			k, m, err := parseEC(ec)
			if err != nil {
				return err
			}
			v := fmt.Sprintf("%d+%d", k, m)
			if cmd.Flags().Changed("unit") {
				u, err := bytesize.Parse(unit)
				if err != nil {
					return fmt.Errorf("--unit: %w", err)
				}
				v += fmt.Sprintf("/%d", u)
			}
			if minWrite > 0 {
				v += fmt.Sprintf("/min-write=%d", minWrite)
			}
			if _, err := fs.ParseRelayout(v); err != nil {
				return err
			}
			if err := unix.Setxattr(p, fs.RelayoutXattr, []byte(v), 0); err != nil {
				switch {
				case errors.Is(err, syscall.ENOTSUP) || errors.Is(err, syscall.ENODATA):
					return fmt.Errorf("%s: not on an rdmafs mount", p)
				case errors.Is(err, syscall.EINVAL):
					return fmt.Errorf("%s: relayout to %s refused: %w: the cluster has fewer than %d chunkservers or too few zones, or a file below has a stripe size that %d data shards do not split into 4 KiB multiples (the mount's and meta's logs say which)",
						p, v, err, k+m, k)
				}
				return fmt.Errorf("%s: relayout to %s: %w", p, v, err)
			}
			r, err := relayoutProgress(p)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: converting to %s: %d stripes (%s) of %d files to convert\n",
				p, v, r.StripesLeft, humanBytes(r.BytesLeft), r.FilesLeft)
			if !wait {
				return nil
			}
			return waitRelayout(cmd.Context(), cmd.OutOrStdout(), p, r.BytesLeft, time.Second)
		},
	}
	cmd.Flags().StringVar(&ec, "ec", "", "erasure coding k+m to convert to (k=1: replication with m+1 copies)")
	cmd.Flags().StringVar(&unit, "unit", "", "shard unit of the directories' new files (default: their stripe size over k)")
	cmd.Flags().IntVar(&minWrite, "min-write-shards", 0, "shards that must be durable for a write to succeed (k..k+m; 0: k+1)")
	cmd.Flags().BoolVar(&wait, "wait", false, "wait until every stripe below PATH is converted, with a progress bar")
	_ = cmd.MarkFlagRequired("ec")
	return cmd
}

// relayoutProgress reads what is left to convert below p.
func relayoutProgress(p string) (*metapb.RelayoutReply, error) {
	b := make([]byte, 4096)
	n, err := unix.Getxattr(p, fs.RelayoutXattr, b)
	if err != nil {
		return nil, fmt.Errorf("%s: relayout progress: %w", p, err)
	}
	r := &metapb.RelayoutReply{}
	if err := protojson.Unmarshal(b[:n], r); err != nil {
		return nil, fmt.Errorf("%s: relayout progress: %w", p, err)
	}
	return r, nil
}

// waitRelayout draws the conversion below p until no stripe is left.
func waitRelayout(ctx context.Context, w io.Writer, p string, total uint64, every time.Duration) error {
	start := time.Now()
	for {
		r, err := relayoutProgress(p)
		if err != nil {
			return err
		}
		total = max(total, r.BytesLeft)
		done := total - r.BytesLeft
		frac := 1.0
		if total > 0 {
			frac = float64(done) / float64(total)
		}
		fmt.Fprintf(w, "\r%s  %s of %s  %d files left  %s/s ", progressBar(frac), humanBytes(done), humanBytes(total), r.FilesLeft,
			humanBytes(uint64(float64(done)/max(time.Since(start).Seconds(), 0.001))))
		if r.StripesLeft == 0 {
			fmt.Fprintf(w, "\n%s: every stripe converted (%d stripes, %s)\n", p, r.StripesTotal, humanBytes(r.BytesTotal))
			return nil
		}
		select {
		case <-ctx.Done():
			fmt.Fprintln(w)
			return ctx.Err()
		case <-time.After(every):
		}
	}
}
