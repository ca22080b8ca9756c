package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/rdmafs/rdmafs/meta/kv/bolt"
)

// newAdminWALRecoverCommand is `rdmafs admin wal-recover`: cut the bbolt
// store's log at damage in its middle (bolt.RecoverLog).
func newAdminWALRecoverCommand() *cobra.Command {
	var dataDir string
	var dryRun bool
	cmd := &cobra.Command{
		Use:   "wal-recover",
		Short: "Cut the metadata log of a bbolt store at damage in its middle (docs/operations.md)",
		Long: "`rdmafs meta` refuses to start when the write-ahead log of its bbolt store (--data DIR) is\n" +
			"damaged in the middle: a record that is not intact followed by intact later ones. This\n" +
			"command, run with the meta server stopped, replays every record before the damage into\n" +
			"the database and cuts the log there, dropping the records from the damaged one on that\n" +
			"the database lacks. It reports the damage and what it replayed and dropped; --dry-run\n" +
			"reports without writing. A torn tail (the record being written when the server died)\n" +
			"needs nothing: the meta server drops it by itself.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if dataDir == "" {
				return fmt.Errorf("admin wal-recover: give --data DIR")
			}
			rep, err := bolt.RecoverLog(dataDir, bolt.RecoverOptions{DryRun: dryRun})
			if err != nil {
				return fmt.Errorf("admin wal-recover: %w", err)
			}
			printLogRecovery(cmd, dataDir, rep, dryRun)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dataDir, "data", "", "bbolt metadata data directory")
	f.BoolVar(&dryRun, "dry-run", false, "report the damage and what would be replayed and dropped; write nothing")
	return cmd
}

// printLogRecovery writes RecoverLog's report to the command's output.
func printLogRecovery(cmd *cobra.Command, dir string, rep *bolt.LogRecovery, dryRun bool) {
	out := cmd.OutOrStdout()
	if len(rep.Damage) == 0 {
		fmt.Fprintf(out, "no damage in the middle of the log in %s\n", dir)
	}
	for _, d := range rep.Damage {
		fmt.Fprintf(out, "damaged: %s\n", d)
	}
	replayed, dropped := "replayed", "dropped"
	if dryRun {
		replayed, dropped = "would replay", "would drop"
	}
	fmt.Fprintf(out, "%s %s after LSN %d, the last one in the database\n", replayed, rep.Replayed, rep.Applied)
	fmt.Fprintf(out, "%s %s\n", dropped, rep.Dropped)
}
