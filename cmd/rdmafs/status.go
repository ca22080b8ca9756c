package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/rdmafs/rdmafs/meta/client"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// newStatusCommand is `rdmafs status [META]`: a readable cluster overview,
// or with --json the whole StatusReply.
func newStatusCommand() *cobra.Command {
	var mf metaFlags
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status [META-ADDR]",
		Short: "Show chunkservers, file and stripe counts and degraded stripes",
		RunE: mf.run(func(ctx context.Context, c *client.Client, cmd *cobra.Command, args []string) error {
			st, err := c.Status(ctx, &metapb.StatusRequest{})
			if err != nil {
				return fmt.Errorf("status of %s: %w", mf.addr, err)
			}
			if asJSON {
				b, err := protojson.MarshalOptions{Multiline: true, EmitUnpopulated: true}.Marshal(st)
				if err != nil {
					return fmt.Errorf("status: %w", err)
				}
				fmt.Fprintln(cmd.OutOrStdout(), string(b))
				return nil
			}
			printStatus(cmd, st)
			return nil
		}),
	}
	mf.register(cmd, 10*time.Second, 0)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the status as JSON (the fields of metapb.StatusReply)")
	return cmd
}

func printStatus(cmd *cobra.Command, st *metapb.StatusReply) {
	w := cmd.OutOrStdout()
	l := st.DefaultLayout
	fmt.Fprintf(w, "cluster %s  default layout %d+%d unit %s\n", st.ClusterId, l.GetK(), l.GetM(), humanBytes(l.GetUnit()))
	fmt.Fprintf(w, "files %d  directories %d  stripes %d  degraded stripes %d  sessions %d  pending chunk deletes %d\n",
		st.Files, st.Directories, st.Stripes, st.DegradedStripes, st.Sessions, st.PendingDeletes)
	if st.SharedBytes > 0 {
		fmt.Fprintf(w, "file data in stripes: %s shared with snapshots (counted once per file), %s unshared\n", humanBytes(st.SharedBytes), humanBytes(st.UniqueBytes))
	}
	for _, q := range st.Quotas {
		fmt.Fprintf(w, "quota %s: ", quotaLabel(q))
		printQuotaLine(w, q)
	}
	if st.TrashSeconds > 0 {
		fmt.Fprintf(w, "trash: %d files, %s, kept %s\n\n", st.TrashFiles, humanBytes(st.TrashBytes), time.Duration(st.TrashSeconds)*time.Second)
	} else {
		fmt.Fprintf(w, "trash: off (%d files, %s)\n\n", st.TrashFiles, humanBytes(st.TrashBytes))
	}
	printRepair(w, st)
	printScrub(w, st.GetScrub())
	printRelayout(w, st.GetRelayout())
	fmt.Fprintf(w, "chunkservers: %d registered, %d up\n", len(st.Chunkservers), st.ChunkserversUp())
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tZONE\tADDRESS\tTRANSPORTS\tCAPACITY\tUSED\tFREE\tCHUNKS\tSHARDS\tLOAD\tGC\tLAST HEARTBEAT")
	for _, cs := range st.Chunkservers {
		state := "down"
		if cs.Up {
			state = "up"
		}
		if cs.Retiring {
			state += ",retiring"
		}
		last := "never"
		if cs.LastHeartbeatNs != 0 {
			last = time.Since(time.Unix(0, cs.LastHeartbeatNs)).Round(time.Millisecond).String() + " ago"
		}
		zone := cs.Zone
		if zone == "" {
			zone = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%.2f\t%d\t%s\n", cs.Id, state, zone, cs.Address,
			strings.Join(cs.Transports, ","), humanBytes(cs.Capacity), humanBytes(cs.Used), humanBytes(cs.Free),
			cs.ChunkCount, cs.Shards, cs.Load, cs.PendingDeletes, last)
	}
	tw.Flush()
}

func humanBytes(b uint64) string {
	const unit = 1024
	if b < unit {
		return fmt.Sprintf("%dB", b)
	}
	div, exp := uint64(unit), 0
	for n := b / unit; n >= unit; n /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f%ciB", float64(b)/float64(div), "KMGTPE"[exp])
}

// printRelayout prints the conversions to other layouts in one line, when
// there are or were any.
func printRelayout(w io.Writer, r *metapb.RelayoutStatus) {
	if r == nil || r.FilesPending == 0 && r.StripesDone == 0 && r.InFlight == 0 {
		return
	}
	fmt.Fprintf(w, "relayout: %d files to convert, %d stripes converting; %d stripes (%s) converted, %d failed, %d raced by writers; %s/s\n\n",
		r.FilesPending, r.InFlight, r.StripesDone, humanBytes(r.BytesDone), r.Failed, r.Stale, humanBytes(uint64(r.BytesPerSecond)))
}

// printScrub prints the chunkservers' scrubbing in one line.
func printScrub(w io.Writer, sc *metapb.ScrubStatus) {
	if sc == nil {
		return
	}
	last := "not yet on every chunkserver"
	if sc.LastFullPassNs != 0 {
		last = time.Since(time.Unix(0, sc.LastFullPassNs)).Round(time.Second).String() + " ago"
	}
	fmt.Fprintf(w, "scrub: a pass every %v; last full pass %s; %s verified, %d corrupt or missing found, "+
		"%d stripes' parity verified, %d mismatched, %d rebuilt\n\n",
		time.Duration(sc.IntervalNs), last, humanBytes(sc.BytesTotal), sc.ErrorsTotal, sc.StripesVerified, sc.ParityMismatches, sc.RepairedTotal)
}
