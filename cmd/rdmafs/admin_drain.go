package main

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/rdmafs/rdmafs/meta/client"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// newAdminDrainCommand is `rdmafs admin drain META CHUNKSERVER`: move every
// shard off a chunkserver before it is decommissioned.
func newAdminDrainCommand() *cobra.Command {
	var mf metaFlags
	var wf waitFlags
	var undo bool
	cmd := &cobra.Command{
		Use:   "drain [META-ADDR] CHUNKSERVER-ID",
		Short: "Move every shard off a chunkserver (for decommissioning)",
		Long: "Mark a chunkserver retiring: it receives no new chunks, every shard it holds is moved to\n" +
			"other chunkservers by the repair machinery, and it stays readable until then. With --wait,\n" +
			"wait until it holds no shard and no chunk. --undo makes it a normal member again.",
		RunE: mf.run(func(ctx context.Context, c *client.Client, cmd *cobra.Command, args []string) error {
			id := args[0]
			if _, err := c.Drain(ctx, &metapb.DrainRequest{Id: id, Undo: undo}); err != nil {
				return fmt.Errorf("drain %s: %w", id, err)
			}
			w := cmd.OutOrStdout()
			if undo {
				fmt.Fprintf(w, "chunkserver %s is no longer retiring\n", id)
				return nil
			}
			fmt.Fprintf(w, "chunkserver %s is retiring: its shards are being moved\n", id)
			if !wf.wait {
				return nil
			}
			err := waitRepair(ctx, w, c, true, wf.every, func(st *metapb.StatusReply) bool {
				for _, cs := range st.Chunkservers {
					if cs.Id == id {
						return cs.Shards == 0 && cs.ChunkCount == 0 && cs.PendingDeletes == 0
					}
				}
				return false
			})
			if err != nil {
				return err
			}
			fmt.Fprintf(w, "chunkserver %s holds no data: it can be stopped\n", id)
			return nil
		}),
	}
	mf.register(cmd, 0, 1)
	wf.register(cmd, "wait until the chunkserver holds nothing")
	cmd.Flags().BoolVar(&undo, "undo", false, "stop draining: make the chunkserver a normal member again")
	return cmd
}

// newAdminRebalanceCommand is `rdmafs admin rebalance META`: even out shards
// over the chunkservers, e.g. after new ones joined.
func newAdminRebalanceCommand() *cobra.Command {
	var mf metaFlags
	var wf waitFlags
	cmd := &cobra.Command{
		Use:   "rebalance [META-ADDR]",
		Short: "Move shards from the fullest chunkservers to the emptiest",
		RunE: mf.run(func(ctx context.Context, c *client.Client, cmd *cobra.Command, args []string) error {
			r, err := c.Rebalance(ctx, &metapb.RebalanceRequest{})
			if err != nil {
				return fmt.Errorf("rebalance: %w", err)
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "%d shard moves planned\n", r.MovesPlanned)
			if !wf.wait || r.MovesPlanned == 0 {
				return nil
			}
			return waitRepair(ctx, w, c, true, wf.every, nil)
		}),
	}
	mf.register(cmd, 0, 0)
	wf.register(cmd, "wait until the moves are done")
	return cmd
}
