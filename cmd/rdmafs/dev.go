package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/rdmafs/rdmafs/internal/devcluster"
)

func newDevCommand() *cobra.Command {
	c := &cobra.Command{
		Use:   "dev",
		Short: "Run a whole rdmafs on this host for development and demos",
	}
	var cfg devcluster.Config
	up := &cobra.Command{
		Use:   "up DIR",
		Short: "Format a file system in DIR, start a meta server and chunkd processes on 127.0.0.1, and mount it at DIR/mnt",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg.Dir = args[0]
			if cfg.Bin == "" {
				exe, err := os.Executable()
				if err != nil {
					return err
				}
				cfg.Bin = filepath.Dir(exe)
			}
			c, err := devcluster.Up(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "meta %s (pid %d), %d chunkservers", c.MetaAddr, c.Meta.PID, len(c.Chunk))
			if c.MountPoint != "" {
				fmt.Fprintf(cmd.OutOrStdout(), ", mounted at %s", c.MountPoint)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "\nlogs in %s; stop with: rdmafs dev down %s\n", c.Dir, c.Dir)
			fmt.Fprintf(cmd.OutOrStdout(), "clients: rdmafs status %s %s\n", c.MetaAddr, strings.Join(c.ClientArgs(), " "))
			return nil
		},
	}
	fl := up.Flags()
	fl.StringVar(&cfg.Bin, "bin", "", "directory with the rdmafs and chunkd binaries (default: this binary's)")
	fl.IntVar(&cfg.Chunkservers, "chunkservers", 6, "chunkd processes to start")
	fl.StringVar(&cfg.EC, "ec", "4+2", "erasure coding k+m")
	fl.StringVar(&cfg.Unit, "unit", "1MiB", "shard unit size")
	fl.StringVar(&cfg.TrashDays, "trash-days", "1", "days deleted files are kept in the trash (0: none)")
	fl.StringVar(&cfg.Transport, "transport", "auto", "rdma transport: auto, tcp, shm or verbs")
	fl.StringVar(&cfg.ChunkdMem, "chunkd-mem", "256MiB", "registered memory per chunkd")
	fl.StringVar(&cfg.ClientMem, "client-mem", "256MiB", "client buffer memory")
	fl.BoolVar(&cfg.Mount, "mount", true, "mount the file system at DIR/mnt")
	fl.StringArrayVar(&cfg.MetaArgs, "meta-arg", nil, "an extra flag for rdmafs meta, e.g. --meta-arg=--scrub-interval=1h (repeatable)")
	fl.StringArrayVar(&cfg.ChunkdArgs, "chunkd-arg", nil, "an extra flag for every chunkd, e.g. --chunkd-arg=--scrub-rate=0 (repeatable)")
	fl.BoolVar(&cfg.PlainText, "plaintext", false, "no TLS on the control plane (by default DIR/tls holds a CA and certificates, and meta requires client certificates)")
	down := &cobra.Command{
		Use:   "down DIR",
		Short: "Unmount and stop the cluster in DIR (by PID)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := devcluster.Load(args[0])
			if err != nil {
				return err
			}
			return c.Down(cmd.Context())
		},
	}
	c.AddCommand(up, down)
	return c
}
