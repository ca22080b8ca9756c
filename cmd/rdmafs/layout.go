package main

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/rdmafs/rdmafs/fs"
	"github.com/rdmafs/rdmafs/internal/bytesize"
	"github.com/rdmafs/rdmafs/internal/stripe"
)

// newLayoutCommand is `rdmafs layout get|set`: the erasure-coding layout of
// files and directories on a mounted rdmafs, through the rdmafs.layout
// extended attribute.
func newLayoutCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "layout",
		Short: "Show or set layouts on a mounted rdmafs (the rdmafs.layout extended attribute)",
		Long: "A file's layout is fixed when it is created: that of its directory. A directory's layout\n" +
			"is what new files and subdirectories below it get. The same is available as the extended\n" +
			"attribute rdmafs.layout (getfattr -n rdmafs.layout DIR; setfattr -n rdmafs.layout -v 8+3/1MiB DIR).",
	}
	cmd.AddCommand(newLayoutGetCommand(), newLayoutSetCommand())
	return cmd
}

// getLayout reads path's layout through the mount.
func getLayout(path string) (stripe.Layout, error) {
	b := make([]byte, 256)
	n, err := unix.Getxattr(path, fs.LayoutXattr, b)
	if errors.Is(err, syscall.ENOTSUP) || errors.Is(err, syscall.ENODATA) {
		return stripe.Layout{}, fmt.Errorf("%s: not on an rdmafs mount (no %s attribute)", path, fs.LayoutXattr)
	}
	if err != nil {
		return stripe.Layout{}, fmt.Errorf("%s: %w", path, err)
	}
	return stripe.ParseLayout(string(b[:n]))
}

func newLayoutGetCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "get PATH...",
		Short: "Show the layout of files and directories",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, p := range args {
				l, err := getLayout(p)
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s: %s\n", p, describeLayout(l))
			}
			return nil
		},
	}
}

// describeLayout formats l for people: "ec 4+2, unit 1.0MiB, ...".
func describeLayout(l stripe.Layout) string {
	s := fmt.Sprintf("ec %d+%d, unit %s, writes need %d shards", l.K, l.M, humanBytes(uint64(l.Unit)), l.MinWriteShards())
	if l.Inline > 0 {
		s += fmt.Sprintf(", inline up to %s", humanBytes(uint64(l.Inline)))
	}
	return s + " (" + l.String() + ")"
}

func newLayoutSetCommand() *cobra.Command {
	var ec, unit, inline string
	var minWrite int
	cmd := &cobra.Command{
		Use:   "set DIR [--ec K+M] [--unit SIZE] [--min-write-shards N] [--inline-max SIZE]",
		Short: "Set the layout new files below a directory get (existing files keep theirs)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir := args[0]
			l, err := getLayout(dir)
			if err != nil {
				return err
			}
			f := cmd.Flags()
			if f.Changed("ec") {
				if l.K, l.M, err = parseEC(ec); err != nil {
					return err
				}
				l.MinWrite = 0 // the default for the new width, unless given
			}
			if f.Changed("unit") {
				if l.Unit, err = bytesize.Parse(unit); err != nil {
					return fmt.Errorf("--unit: %w", err)
				}
			}
			if f.Changed("min-write-shards") {
				l.MinWrite = minWrite
			}
			if f.Changed("inline-max") {
				if l.Inline, err = bytesize.Parse(inline); err != nil {
					return fmt.Errorf("--inline-max: %w", err)
				}
			}
			if !f.Changed("inline-max") && l.Inline > l.StripeSize() {
				// The inherited inline size does not fit the narrower stripe.
				l.Inline = l.StripeSize()
			}
			if err := l.Validate(); err != nil {
				return err
			}
			if err := unix.Setxattr(dir, fs.LayoutXattr, []byte(l.String()), 0); err != nil {
				if errors.Is(err, syscall.EINVAL) {
					// The layout itself was valid: the cluster refused it.
					return fmt.Errorf("%s: set layout %s: %w: the cluster has fewer than %d chunkservers, or so few zones that one would hold more than %d shards (the meta server's log says which)",
						dir, l, err, l.K+l.M, l.M)
				}
				return fmt.Errorf("%s: set layout %s: %w", dir, l, err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: %s\n", dir, describeLayout(l))
			return nil
		},
	}
	cmd.Flags().StringVar(&ec, "ec", "", "erasure coding k+m (k=1: replication with m+1 copies)")
	cmd.Flags().StringVar(&unit, "unit", "", "shard unit size, a multiple of 4KiB")
	cmd.Flags().IntVar(&minWrite, "min-write-shards", 0, "shards that must be durable for a write to succeed (k..k+m; 0: k+1)")
	cmd.Flags().StringVar(&inline, "inline-max", "", "files up to this size keep their data in metadata (0: never)")
	return cmd
}
