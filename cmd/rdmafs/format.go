package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/rdmafs/rdmafs/internal/bytesize"
	"github.com/rdmafs/rdmafs/internal/stripe"
	"github.com/rdmafs/rdmafs/meta/server"
)

// newFormatCommand is `rdmafs format META`: initialize a metadata data directory.
func newFormatCommand() *cobra.Command {
	var ec, unit, inline, secretFile, kvURL string
	var minWrite uint32
	var trashDays float64
	cmd := &cobra.Command{
		Use:   "format [META-DATA-DIR]",
		Short: "Create a new file system in a metadata data directory",
		Long: "Create a new file system: initialize the metadata store in META-DATA-DIR with the default\n" +
			"erasure-coding layout (--ec k+m, --unit) and generate the cluster secret file that the\n" +
			"meta server, chunkservers and clients must present. Refuses an already formatted directory.\n" +
			"With --kv etcd://host:port/prefix the file system is created in etcd instead (then\n" +
			"--secret-file is required and META-DATA-DIR is not used).",
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if kvURL != "" {
				if len(args) != 0 {
					return fmt.Errorf("format: give either META-DATA-DIR or --kv, not both")
				}
				if secretFile == "" {
					return fmt.Errorf("format: --kv needs --secret-file")
				}
				l, err := parseLayout(ec, unit, inline, minWrite)
				if err != nil {
					return err
				}
				id, err := server.FormatStore(cmd.Context(), "", kvURL, secretFile, l)
				if err != nil {
					return err
				}
				if err := formatTrash(cmd, "", kvURL, trashDays); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "formatted %s: cluster %s, layout %d+%d, unit %d bytes, secret in %s\n",
					kvURL, id, l.K, l.M, l.Unit, secretFile)
				return nil
			}
			if len(args) != 1 {
				return fmt.Errorf("format: give META-DATA-DIR (bbolt) or --kv etcd://... (etcd)")
			}
			l, err := parseLayout(ec, unit, inline, minWrite)
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
			if err := formatTrash(cmd, args[0], "", trashDays); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "formatted %s: cluster %s, layout %d+%d, unit %d bytes, secret in %s\n",
				args[0], id, l.K, l.M, l.Unit, secretFile)
			return nil
		},
	}
	cmd.Flags().StringVar(&ec, "ec", "4+2", "erasure coding k+m (k=1: replication with m+1 copies)")
	cmd.Flags().StringVar(&unit, "unit", "1MiB", "shard unit size (multiple of 4KiB)")
	cmd.Flags().StringVar(&inline, "inline-max", "64KiB", "files up to this size keep their data in metadata, written with one commit and no chunkserver writes (0: never; at most 256KiB)")
	cmd.Flags().Uint32Var(&minWrite, "min-write-shards", 0, "shards of a stripe that must be durable for a write to succeed while chunkservers are down (k..k+m; default k+1); the others are rebuilt by repair")
	cmd.Flags().Float64Var(&trashDays, "trash-days", 1, "days deleted files are kept in the trash (.trash at the root) before they are purged (0: no trash; rdmafs config set trash-days changes it later)")
	cmd.Flags().StringVar(&kvURL, "kv", "", "create the file system in etcd: etcd://host:port[,host:port]/prefix")
	cmd.Flags().StringVar(&secretFile, "secret-file", "", "where to write the cluster secret (default META-DATA-DIR/secret)")
	return cmd
}

// formatTrash records --trash-days unless it is the default.
func formatTrash(cmd *cobra.Command, dataDir, kvURL string, days float64) error {
	if !cmd.Flags().Changed("trash-days") {
		return nil
	}
	if days < 0 || days > 36500 {
		return fmt.Errorf("format: --trash-days must be from 0 to 36500")
	}
	return server.SetTrash(cmd.Context(), dataDir, kvURL, time.Duration(days*24*float64(time.Hour)))
}

// parseEC parses the --ec flag's k+m.
func parseEC(ec string) (k, m int, err error) {
	ks, ms, ok := strings.Cut(ec, "+")
	k64, err1 := strconv.ParseUint(ks, 10, 32)
	m64, err2 := strconv.ParseUint(ms, 10, 32)
	if !ok || err1 != nil || err2 != nil {
		return 0, 0, fmt.Errorf("--ec %q: want k+m, e.g. 4+2", ec)
	}
	return int(k64), int(m64), nil
}

func parseLayout(ec, unit, inline string, minWrite uint32) (stripe.Layout, error) {
	k, m, err := parseEC(ec)
	if err != nil {
		return stripe.Layout{}, err
	}
	size, err := bytesize.Parse(unit)
	if err == nil && size <= 0 {
		err = fmt.Errorf("unit must be positive")
	}
	if err != nil {
		return stripe.Layout{}, fmt.Errorf("--unit: %w", err)
	}
	in, err := bytesize.Parse(inline)
	if err == nil && in < 0 {
		err = fmt.Errorf("must not be negative")
	}
	if err != nil {
		return stripe.Layout{}, fmt.Errorf("--inline-max: %w", err)
	}
	l := stripe.Layout{K: k, M: m, Unit: size, MinWrite: int(minWrite), Inline: in}
	return l, l.Validate()
}
