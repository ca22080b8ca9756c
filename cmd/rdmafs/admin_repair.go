package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/rdmafs/rdmafs/meta/client"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// printRepair writes the repair part of a status: stripes by health, the
// queue and the throughput.
func printRepair(w io.Writer, st *metapb.StatusReply) {
	r := st.GetRepair()
	if r == nil {
		return
	}
	fmt.Fprintf(w, "stripes: %d healthy, %d degraded, %d lost\n", r.HealthyStripes, r.DegradedStripes, r.LostStripes)
	fmt.Fprintf(w, "repair: %d shards queued (%d moves), %d in flight, %d done, %d failed, %d stale, %s rebuilt, %s/s  (grace %v)\n\n",
		r.Queued, r.MovesQueued, r.InFlight, r.Done, r.Failed, r.Stale, humanBytes(r.BytesRebuilt),
		humanBytes(uint64(r.BytesPerSecond)), time.Duration(r.GraceMs)*time.Millisecond)
}

// errStripesLost is returned by `admin repair --wait` when stripes cannot be
// rebuilt because fewer than k of their shards are readable.
var errStripesLost = errors.New("stripes lost")

// newAdminRepairCommand is `rdmafs admin repair META`: shows repair progress
// and, with --wait, waits until every stripe has full redundancy again.
func newAdminRepairCommand() *cobra.Command {
	var mf metaFlags
	var wf waitFlags
	cmd := &cobra.Command{
		Use:   "repair [META-ADDR]",
		Short: "Show repair progress; with --wait, wait until every stripe has full redundancy",
		Long: "Show stripes by health (healthy, degraded, lost), the repair queue and its throughput.\n" +
			"With --wait, show a progress bar until every stripe is healthy and nothing is queued\n" +
			"(exit status 0), or fail at once if stripes are lost: fewer than k of their shards\n" +
			"are readable, so only bringing their chunkservers back can save them.",
		RunE: mf.run(func(ctx context.Context, c *client.Client, cmd *cobra.Command, args []string) error {
			return waitRepair(ctx, cmd.OutOrStdout(), c, wf.wait, wf.every, nil)
		}),
	}
	mf.register(cmd, 0, 0)
	wf.register(cmd, "wait until every stripe is healthy, showing progress")
	return cmd
}

// waitFlags are --wait and --interval of the commands that can wait for
// the repair machinery to finish (admin repair, drain, rebalance).
type waitFlags struct {
	wait  bool
	every time.Duration
}

// register adds --wait, which waitHelp describes, and --interval (the
// progress refresh interval, default 1s) to cmd.
func (f *waitFlags) register(cmd *cobra.Command, waitHelp string) {
	cmd.Flags().BoolVar(&f.wait, "wait", false, waitHelp)
	cmd.Flags().DurationVar(&f.every, "interval", time.Second, "progress refresh interval")
}

// waitRepair prints repair state once or, with wait, until done(st) (default:
// all stripes healthy and nothing queued or in flight).
func waitRepair(ctx context.Context, w io.Writer, c *client.Client, wait bool, every time.Duration,
	done func(*metapb.StatusReply) bool) error {
	if done == nil {
		done = func(st *metapb.StatusReply) bool {
			r := st.GetRepair()
			return r.GetDegradedStripes() == 0 && r.GetLostStripes() == 0 && r.GetQueued() == 0 && r.GetInFlight() == 0
		}
	}
	var initial uint64
	first := true
	for {
		st, err := c.Status(ctx, &metapb.StatusRequest{})
		if err != nil {
			return fmt.Errorf("status: %w", err)
		}
		r := st.GetRepair()
		if !wait {
			printRepair(w, st)
			return lostErr(r)
		}
		if err := lostErr(r); err != nil {
			fmt.Fprintln(w)
			return err
		}
		todo := r.GetQueued() + r.GetInFlight()
		if first || todo > initial {
			initial = max(todo, 1)
			first = false
		}
		finished := done(st)
		frac := 1 - float64(todo)/float64(initial)
		if finished {
			frac = 1
		}
		fmt.Fprintf(w, "\r%s  %d healthy %d degraded %d lost  queue %d  in flight %d  %s/s ",
			progressBar(frac), r.GetHealthyStripes(), r.GetDegradedStripes(), r.GetLostStripes(), r.GetQueued(), r.GetInFlight(),
			humanBytes(uint64(r.GetBytesPerSecond())))
		if finished {
			fmt.Fprintf(w, "\nfull redundancy: %d stripes healthy, %s rebuilt\n", r.GetHealthyStripes(), humanBytes(r.GetBytesRebuilt()))
			return nil
		}
		select {
		case <-ctx.Done():
			fmt.Fprintln(w)
			return fmt.Errorf("repair not finished: %w", ctx.Err())
		case <-time.After(every):
		}
	}
}

// progressBar draws frac (0 to 1) as a bar of 40 and a percentage.
func progressBar(frac float64) string {
	const width = 40
	n := int(frac * width)
	return fmt.Sprintf("[%s%s] %3.0f%%", strings.Repeat("#", n), strings.Repeat(".", width-n), frac*100)
}

func lostErr(r *metapb.RepairStatus) error {
	if r.GetLostStripes() > 0 {
		return fmt.Errorf("%w: %d stripes have fewer than k readable shards and cannot be rebuilt; "+
			"bring their chunkservers back (rdmafs status shows which are down)", errStripesLost, r.GetLostStripes())
	}
	return nil
}
