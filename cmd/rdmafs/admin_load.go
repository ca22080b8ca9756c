package main

import (
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/rdmafs/rdmafs/meta/dump"
)

// newAdminLoadCommand is `rdmafs admin load`: import a metadata dump.
func newAdminLoadCommand() *cobra.Command {
	var (
		sf    storeFlags
		input string
	)
	cmd := &cobra.Command{
		Use:   "load",
		Short: "Import a metadata dump into a new, empty store (docs/metadata-dump.md)",
		Long: "Import a dump written by `rdmafs admin dump` into an empty store: a new bbolt data\n" +
			"directory (--data DIR) or an unused etcd prefix (--kv etcd://...). No meta server may run\n" +
			"on the target. The dump is verified (order, count, SHA-256) while it is written and the\n" +
			"cluster record goes in last, so a failed load leaves an unformatted store that no server\n" +
			"serves: remove it and load again. Copy the cluster secret file alongside.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := sf.check("admin load"); err != nil {
				return err
			}
			ctx := cmd.Context()
			var r io.Reader = cmd.InOrStdin()
			if input != "-" {
				f, err := os.Open(input)
				if err != nil {
					return fmt.Errorf("admin load: %w", err)
				}
				defer f.Close()
				r = f
			}
			store, err := sf.open(ctx, "admin load")
			if err != nil {
				return err
			}
			defer store.Close()
			st, err := dump.Load(ctx, store, r, dump.LoadOptions{})
			if err != nil {
				return fmt.Errorf("admin load: %w", err)
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "loaded %d records (%d bytes of keys and values) of cluster %s into %s\n", st.Records, st.Bytes, st.ClusterID, sf.where())
			return nil
		},
	}
	f := cmd.Flags()
	sf.register(f, "new bbolt metadata data directory", "etcd store: etcd://host:port[,host:port]/prefix (an unused prefix)")
	f.StringVarP(&input, "input", "i", "-", "dump file to read (- for standard input)")
	return cmd
}
