package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/rdmafs/rdmafs/meta/auth"
	"github.com/rdmafs/rdmafs/meta/core"
	"github.com/rdmafs/rdmafs/meta/metabench"
	"github.com/rdmafs/rdmafs/meta/server"
)

// newBenchMetaCommand is `rdmafs bench meta`: metadata operations per second
// through the gRPC API.
func newBenchMetaCommand() *cobra.Command {
	var addr, secretFile, clients, dataDir string
	var files, entries int
	var dur time.Duration
	cmd := &cobra.Command{
		Use:   "meta",
		Short: "Measure create, stat, readdir, rename and unlink per second through the meta gRPC API",
		Long: "Measure metadata operations per second with 1 and 16 concurrent clients. Without --meta it\n" +
			"formats a temporary data directory and starts a meta server on 127.0.0.1 (durable bbolt\n" +
			"store, group commit), so the figures include gRPC, the transaction and fsync.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			levels, err := parseInts(clients)
			if err != nil {
				return err
			}
			opts := metabench.Options{Clients: levels, Files: files, DirEntries: entries, Duration: dur}
			if addr != "" {
				secret, err := auth.ReadSecretFile(secretFile)
				if err != nil {
					return err
				}
				opts.Addr, opts.Secret = addr, secret
			} else {
				dir := dataDir
				if dir == "" {
					if dir, err = os.MkdirTemp("", "rdmafs-bench-meta-"); err != nil {
						return err
					}
					defer os.RemoveAll(dir)
				}
				sf := server.DefaultSecretFile(dir)
				if _, err := server.Format(ctx, dir, sf, core.StandardLayout()); err != nil {
					return err
				}
				secret, err := auth.ReadSecretFile(sf)
				if err != nil {
					return err
				}
				srv, err := server.Start(ctx, server.Config{DataDir: dir, Listen: "127.0.0.1:0", Secret: secret,
					Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
				if err != nil {
					return err
				}
				defer srv.Stop(ctx)
				opts.Addr, opts.Secret = srv.Addr(), secret
				fmt.Fprintf(cmd.OutOrStdout(), "meta server in-process on %s, data %s (bbolt, fsync per group commit)\n", srv.Addr(), dir)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%d CPUs (GOMAXPROCS %d), %d files per level, readdir of %d entries\n",
				runtime.NumCPU(), runtime.GOMAXPROCS(0), opts.Files, opts.DirEntries)
			res, err := metabench.Run(ctx, opts)
			metabench.Print(cmd.OutOrStdout(), res)
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&addr, "meta", "", "benchmark a running meta server at this address (default: start one in-process)")
	f.StringVar(&secretFile, "secret-file", "", "cluster secret file (with --meta)")
	f.StringVar(&dataDir, "data", "", "data directory for the in-process server (default: a temporary directory)")
	f.StringVar(&clients, "clients", "1,16", "comma-separated concurrency levels")
	f.IntVar(&files, "files", 4000, "files created, renamed and unlinked per level")
	f.IntVar(&entries, "dir-entries", 1000, "entries of the directory listed by readdir")
	f.DurationVar(&dur, "duration", 2*time.Second, "duration of the stat and readdir phases")
	return cmd
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, p := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("invalid --clients %q", s)
		}
		out = append(out, n)
	}
	return out, nil
}
