package main

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/rdmafs/rdmafs/meta/client"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// newAdminCheckCommand is `rdmafs admin check [META] [--repair]`: the
// metadata consistency check against a live cluster.
func newAdminCheckCommand() *cobra.Command {
	var mf metaFlags
	var repair bool
	cmd := &cobra.Command{
		Use:   "check [META-ADDR] [--repair]",
		Short: "Check the metadata's consistency; with --repair, apply the safe fixes",
		Long: "Verify, in one consistent snapshot of the live metadata, that entries point to existing\n" +
			"inodes, link counts match the entries, every directory has one parent, inodes without links\n" +
			"are open orphans, and stripes belong to existing files whose stored bytes they add up to.\n" +
			"Every violation is printed; the exit status is non-zero when any is found (after --repair:\n" +
			"when any remains). --repair sets link counts to the entries, links inodes no entry names into\n" +
			"/lost+found as #INODE, removes entries of missing inodes, deletes unopened inodes without\n" +
			"links and stripes of missing files (their chunks are collected), recomputes stored bytes, and\n" +
			"has the chunkservers delete chunk versions nothing references (compared with the lists they\n" +
			"send after each scrub pass; chunk data no file can reach).",
		RunE: mf.run(func(ctx context.Context, c *client.Client, cmd *cobra.Command, _ []string) error {
			w := cmd.OutOrStdout()
			r, err := c.Check(ctx, &metapb.CheckRequest{Repair: repair})
			if err != nil {
				return fmt.Errorf("check: %w", err)
			}
			for _, p := range r.Problems {
				fmt.Fprintln(w, "problem:", p)
			}
			if r.Truncated {
				fmt.Fprintln(w, "(more problems than listed)")
			}
			for _, n := range r.Notes {
				fmt.Fprintln(w, "note:", n)
			}
			if len(r.Problems) == 0 {
				if len(r.Notes) > 0 {
					fmt.Fprintln(w, "no problems found in what was checked (see the notes)")
					return nil
				}
				fmt.Fprintln(w, "metadata consistent: no problems found")
				return nil
			}
			if !repair {
				return fmt.Errorf("check: %d problems found (--repair applies the safe fixes)", len(r.Problems))
			}
			for _, d := range r.Repaired {
				fmt.Fprintln(w, "repaired:", d)
			}
			again, err := c.Check(ctx, &metapb.CheckRequest{})
			if err != nil {
				return fmt.Errorf("check after the repair: %w", err)
			}
			for _, p := range again.Problems {
				fmt.Fprintln(w, "remains:", p)
			}
			if len(again.Problems) > 0 {
				return fmt.Errorf("check: %d problems remain after the repair", len(again.Problems))
			}
			fmt.Fprintf(w, "metadata consistent after %d repairs\n", len(r.Repaired))
			return nil
		}),
	}
	mf.register(cmd, 0, 0)
	cmd.Flags().BoolVar(&repair, "repair", false, "apply the safe fixes of what is found")
	return cmd
}
