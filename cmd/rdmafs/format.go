package main

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/rdmafs/rdmafs/meta/core"
	"github.com/rdmafs/rdmafs/meta/server"
)

// newFormatCommand is `rdmafs format META`: initialize a metadata data directory.
func newFormatCommand() *cobra.Command {
	var ec, unit, secretFile string
	cmd := &cobra.Command{
		Use:   "format META-DATA-DIR",
		Short: "Create a new file system in a metadata data directory",
		Long: "Create a new file system: initialize the metadata store in META-DATA-DIR with the default\n" +
			"erasure-coding layout (--ec k+m, --unit) and generate the cluster secret file that the\n" +
			"meta server, chunkservers and clients must present. Refuses an already formatted directory.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			l, err := parseLayout(ec, unit)
			if err != nil {
				return err
			}
			if secretFile == "" {
				secretFile = server.DefaultSecretFile(args[0])
			}
			id, err := server.Format(cmd.Context(), args[0], secretFile, l)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "formatted %s: cluster %s, layout %d+%d, unit %d bytes, secret in %s\n",
				args[0], id, l.K, l.M, l.Unit, secretFile)
			return nil
		},
	}
	cmd.Flags().StringVar(&ec, "ec", "4+2", "erasure coding k+m (k=1: replication with m+1 copies)")
	cmd.Flags().StringVar(&unit, "unit", "1MiB", "shard unit size (multiple of 4KiB)")
	cmd.Flags().StringVar(&secretFile, "secret-file", "", "where to write the cluster secret (default META-DATA-DIR/secret)")
	return cmd
}

func parseLayout(ec, unit string) (core.Layout, error) {
	ks, ms, ok := strings.Cut(ec, "+")
	if !ok {
		return core.Layout{}, fmt.Errorf("--ec %q: want k+m, e.g. 4+2", ec)
	}
	k, err1 := strconv.ParseUint(ks, 10, 32)
	m, err2 := strconv.ParseUint(ms, 10, 32)
	if err1 != nil || err2 != nil {
		return core.Layout{}, fmt.Errorf("--ec %q: want k+m, e.g. 4+2", ec)
	}
	u, err := parseSize(unit)
	if err != nil {
		return core.Layout{}, fmt.Errorf("--unit: %w", err)
	}
	l := core.Layout{K: uint32(k), M: uint32(m), Unit: u}
	return l, l.Validate()
}

// parseSize parses sizes such as 4096, 64KiB, 1MiB, 1M, 2GiB.
func parseSize(s string) (uint64, error) {
	t := strings.TrimSpace(s)
	mult := uint64(1)
	for _, suf := range []struct {
		s string
		m uint64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"B", 1}} {
		if strings.HasSuffix(t, suf.s) {
			t, mult = strings.TrimSuffix(t, suf.s), suf.m
			break
		}
	}
	n, err := strconv.ParseUint(strings.TrimSpace(t), 10, 64)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("invalid size %q", s)
	}
	return n * mult, nil
}
