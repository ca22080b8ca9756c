package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/rdmafs/rdmafs/internal/devcluster"
	"github.com/rdmafs/rdmafs/internal/fiorun"
	"github.com/rdmafs/rdmafs/internal/fuseceiling"
)

func newBenchFSCommand() *cobra.Command {
	var (
		size, jobs, transport, clusterDir string
		runtime                           int
	)
	c := &cobra.Command{
		Use:   "fs",
		Short: "fio against rdmafs and against the FUSE ceiling (go-fuse loopback over tmpfs, no passthrough), same run",
		Long: `Brings up a local cluster (meta + 6 chunkd on 127.0.0.1, EC 4+2, data on disk),
mounts it, mounts go-fuse's loopback file system over a tmpfs directory with kernel
passthrough off (every byte through the daemon: the FUSE ceiling on this machine),
runs the same fio job file against both and prints both with their ratio.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runBenchFS(cmd.Context(), cmd.OutOrStdout(), jobs, size, runtime, transport, clusterDir)
		},
	}
	fl := c.Flags()
	fl.StringVar(&size, "size", "512M", "fio file size")
	fl.IntVar(&runtime, "runtime", 10, "seconds of each timed job")
	fl.StringVar(&jobs, "jobs", "bench/jobs.fio", "fio job file (uses DIR, SIZE, RUNTIME)")
	fl.StringVar(&transport, "transport", "auto", "rdma transport")
	fl.StringVar(&clusterDir, "dir", "", "cluster directory (default: a new one under /tmp, removed after)")
	return c
}

func runBenchFS(ctx context.Context, w io.Writer, jobs, size string, runtime int, transport, clusterDir string) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	if clusterDir == "" {
		if clusterDir, err = os.MkdirTemp("", "rdmafs-bench-"); err != nil {
			return err
		}
		defer os.RemoveAll(clusterDir)
	}
	cl, err := devcluster.Up(ctx, devcluster.Config{Dir: clusterDir, Bin: filepath.Dir(exe), Transport: transport, Mount: true})
	if err != nil {
		return fmt.Errorf("bench fs: %w", err)
	}
	defer cl.Down(context.Background())
	// The ceiling: tmpfs under /dev/shm, looped back through go-fuse.
	backing, err := os.MkdirTemp("/dev/shm", "rdmafs-ceiling-")
	if err != nil {
		return fmt.Errorf("bench fs: tmpfs directory: %w", err)
	}
	defer os.RemoveAll(backing)
	ceilMnt, err := os.MkdirTemp("", "rdmafs-ceiling-mnt-")
	if err != nil {
		return err
	}
	defer os.Remove(ceilMnt)
	srv, err := fuseceiling.Mount(backing, ceilMnt)
	if err != nil {
		return fmt.Errorf("bench fs: %w", err)
	}
	defer func() {
		for i := 0; i < 50 && srv.Unmount() != nil; i++ {
			time.Sleep(100 * time.Millisecond)
		}
	}()
	env := func(dir string) []string {
		return []string{"DIR=" + dir, "SIZE=" + size, fmt.Sprintf("RUNTIME=%d", runtime)}
	}
	fmt.Fprintf(w, "fio %s, %s file, %ds timed jobs; rdmafs: EC 4+2 over %d chunkd on 127.0.0.1 (%s transport), data on disk\n",
		jobs, size, runtime, len(cl.Chunk), transport)
	ours, err := fiorun.Run(ctx, jobs, env(cl.MountPoint)...)
	if err != nil {
		return fmt.Errorf("bench fs: rdmafs: %w", err)
	}
	ceiling, err := fiorun.Run(ctx, jobs, env(ceilMnt)...)
	if err != nil {
		return fmt.Errorf("bench fs: ceiling: %w", err)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "job\trdmafs\tFUSE ceiling\tratio\t")
	for i, r := range ours {
		if i >= len(ceiling) {
			break
		}
		c := ceiling[i]
		var a, b float64
		var unit string
		switch {
		case r.Name == "randread-4k":
			a, b, unit = r.ReadIOPS, c.ReadIOPS, "IOPS"
		case r.WriteBW > 0:
			a, b, unit = r.WriteBW/(1<<20), c.WriteBW/(1<<20), "MiB/s"
		default:
			a, b, unit = r.ReadBW/(1<<20), c.ReadBW/(1<<20), "MiB/s"
		}
		fmt.Fprintf(tw, "%s\t%.0f %s\t%.0f %s\t%.2f\t\n", r.Name, a, unit, b, unit, a/b)
	}
	return tw.Flush()
}
