package main

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/rdmafs/rdmafs/internal/bytesize"
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
	size, err := bytesize.Parse(unit)
	if err == nil && size <= 0 {
		err = fmt.Errorf("unit must be positive")
	}
	u := uint64(size)
	if err != nil {
		return core.Layout{}, fmt.Errorf("--unit: %w", err)
	}
	l := core.Layout{K: uint32(k), M: uint32(m), Unit: u}
	return l, l.Validate()
}
