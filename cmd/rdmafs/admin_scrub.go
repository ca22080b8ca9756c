package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/rdmafs/rdmafs/meta/client"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// newAdminScrubCommand is `rdmafs admin scrub [META] [--wait]`: a scrub pass
// on every chunkserver now.
func newAdminScrubCommand() *cobra.Command {
	var mf metaFlags
	var wf waitFlags
	var inside string
	cmd := &cobra.Command{
		Use:   "scrub [META-ADDR] [--path PATH] [--wait]",
		Short: "Have every chunkserver read back and check all its chunks now",
		Long: "Every chunkserver starts a scrub pass at once: it reads each chunk version it stores back\n" +
			"from disk, checks its CRC32C, and reports the damaged or missing ones, which repair rebuilds\n" +
			"from the other shards. The pass reads as fast as chunkd --scrub-rate allows. With --wait,\n" +
			"show a progress bar until every chunkserver that is up has finished, then wait until what\n" +
			"it found is repaired. Without a request, each chunkserver scrubs once per meta's\n" +
			"--scrub-interval, spread evenly. With --path (a path inside the file system), only the\n" +
			"stripes of the files below it are read whole and their parity checked.",
		RunE: mf.run(func(ctx context.Context, c *client.Client, cmd *cobra.Command, _ []string) error {
			w := cmd.OutOrStdout()
			before, err := c.Status(ctx, &metapb.StatusRequest{})
			if err != nil {
				return fmt.Errorf("status: %w", err)
			}
			req := &metapb.ScrubRequest{}
			if inside != "" {
				if req.Ino, err = resolvePath(ctx, c, inside); err != nil {
					return err
				}
			}
			r, err := c.Scrub(ctx, req)
			if err != nil {
				return fmt.Errorf("scrub: %w", err)
			}
			switch {
			case wf.wait:
				return waitScrub(ctx, w, c, req, r.RequestedNs, before.GetScrub(), wf.every)
			case req.Ino != 0:
				fmt.Fprintf(w, "parity check of the stripes below %s requested (rdmafs status shows the progress)\n", inside)
			default:
				fmt.Fprintln(w, "scrub requested: every chunkserver starts a pass at its next heartbeat (rdmafs status shows the progress)")
			}
			return nil
		}),
	}
	mf.register(cmd, 0, 0)
	wf.register(cmd, "wait until every chunkserver has finished its pass and what it found is repaired, showing progress")
	cmd.Flags().StringVar(&inside, "path", "", "check only the parity of the stripes of the files below this path inside the file system")
	return cmd
}

// scrubRepaired reports whether what a scrub found is repaired: no corrupt
// version waits for its replacement, repair is idle and every stripe
// healthy.
func scrubRepaired(st *metapb.StatusReply) bool {
	r := st.GetRepair()
	return st.GetScrub().GetCorruptPending() == 0 && r.GetDegradedStripes() == 0 && r.GetLostStripes() == 0 &&
		r.GetQueued() == 0 && r.GetInFlight() == 0
}

// waitScrub shows the progress of the work req asked for (a pass on every
// up chunkserver and the parity of every stripe, or with req.Ino the
// parity of a subtree's stripes) until it covers request, then waits until
// what it found is repaired. A meta server that restarted (it forgot the
// request) is asked again.
func waitScrub(ctx context.Context, w io.Writer, c *client.Client, req *metapb.ScrubRequest, request int64, before *metapb.ScrubStatus, every time.Duration) error {
	start := time.Now()
	whole := req.Ino == 0
	for {
		st, err := c.Status(ctx, &metapb.StatusRequest{})
		if err != nil {
			return fmt.Errorf("status: %w", err)
		}
		sc := st.GetScrub()
		if sc.GetVerifyRequestedNs() < request {
			r, err := c.Scrub(ctx, req)
			if err != nil {
				return fmt.Errorf("scrub (again: the meta server restarted): %w", err)
			}
			request, before = r.RequestedNs, nil
			continue
		}
		var done, total uint64
		up, finished := 0, 0
		for _, cs := range st.Chunkservers {
			if !cs.Up || !whole {
				continue
			}
			up++
			sr := cs.GetScrub()
			switch {
			case sr.GetRequestedNs() >= request:
				finished++
				done += sr.GetPassTotal()
				total += sr.GetPassTotal()
			case sr.GetPassStartedNs() >= request:
				done += sr.GetPassBytes()
				total += sr.GetPassTotal()
			default:
				total += sr.GetPassTotal() // its last pass's size, until the new one starts
			}
		}
		complete := finished == up && (up > 0 || !whole) && sc.GetVerifyCoveredNs() >= request
		elapsed := time.Since(start)
		since := func(now, then uint64) uint64 { return now - min(now, then) }
		verified := fmt.Sprintf("%d stripes' parity verified, %d with a shard that disagrees, %d not verified (see meta's log)",
			since(sc.GetStripesVerified(), before.GetStripesVerified()), since(sc.GetParityMismatches(), before.GetParityMismatches()),
			since(sc.GetVerifyFailed(), before.GetVerifyFailed()))
		if whole {
			frac := 0.0
			switch {
			case complete:
				frac = 1
			case total > 0:
				frac = min(float64(done)/float64(total), 0.99)
			}
			fmt.Fprintf(w, "\r%s  %s of %s  %d of %d chunkservers done  %d stripes left to verify  %s/s ", progressBar(frac),
				humanBytes(done), humanBytes(total), finished, up, sc.GetStripesToVerify(), humanBytes(uint64(float64(done)/max(elapsed.Seconds(), 0.001))))
		} else {
			fmt.Fprintf(w, "\r%d stripes left to verify ", sc.GetStripesToVerify())
		}
		if complete {
			if whole {
				fmt.Fprintf(w, "\nscrubbed %s on %d chunkservers in %v: %d corrupt or missing chunk versions found; %s\n",
					humanBytes(done), up, elapsed.Round(100*time.Millisecond), since(sc.GetErrorsTotal(), before.GetErrorsTotal()), verified)
			} else {
				fmt.Fprintf(w, "\nin %v: %s\n", elapsed.Round(100*time.Millisecond), verified)
			}
			return waitRepair(ctx, w, c, true, every, scrubRepaired)
		}
		select {
		case <-ctx.Done():
			fmt.Fprintln(w)
			return fmt.Errorf("scrub not finished: %w", ctx.Err())
		case <-time.After(every):
		}
	}
}
