package main

import (
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/rdmafs/rdmafs/meta/dump"
)

// newAdminDumpCommand is `rdmafs admin dump`: export all metadata.
func newAdminDumpCommand() *cobra.Command {
	var (
		sf     storeFlags
		output string
	)
	cmd := &cobra.Command{
		Use:   "dump",
		Short: "Export all metadata of a file system to a file (docs/metadata-dump.md)",
		Long: "Export every metadata record, read in one consistent snapshot, to a dump file that\n" +
			"`rdmafs admin load` imports into another store: this moves a file system from bbolt\n" +
			"(--data DIR) to etcd (--kv etcd://...) and back. It opens the store directly: with bbolt\n" +
			"the meta server must be stopped (the database is locked while it runs); an etcd store\n" +
			"may be dumped while servers run.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			store, err := sf.open(ctx, "admin dump")
			if err != nil {
				return fmt.Errorf("%w (with bbolt, is the meta server still running?)", err)
			}
			defer store.Close()
			var w io.Writer = cmd.OutOrStdout()
			var f *os.File
			if output != "-" {
				if f, err = os.OpenFile(output, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600); err != nil {
					return fmt.Errorf("admin dump: %w", err)
				}
				w = f
			}
			st, err := dump.Write(ctx, store, w, sf.where())
			if f != nil {
				if serr := f.Sync(); err == nil && serr != nil {
					err = serr
				}
				if cerr := f.Close(); err == nil && cerr != nil {
					err = cerr
				}
				if err != nil {
					os.Remove(output)
				}
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "dumped %d records (%d bytes of keys and values) of cluster %s from %s\n", st.Records, st.Bytes, st.ClusterID, sf.where())
			return nil
		},
	}
	f := cmd.Flags()
	sf.register(f, "bbolt metadata data directory", "etcd store: etcd://host:port[,host:port]/prefix")
	f.StringVarP(&output, "output", "o", "-", "dump file to create (- for standard output)")
	return cmd
}
