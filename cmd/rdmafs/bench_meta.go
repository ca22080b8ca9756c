package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/rdmafs/rdmafs/meta/auth"
	"github.com/rdmafs/rdmafs/meta/core"
	"github.com/rdmafs/rdmafs/meta/kv/etcdkv/etcdproc"
	"github.com/rdmafs/rdmafs/meta/metabench"
	"github.com/rdmafs/rdmafs/meta/server"
)

// newBenchMetaCommand is `rdmafs bench meta`: metadata operations per second
// through the gRPC API.
func newBenchMetaCommand() *cobra.Command {
	var addr, secretFile, clients, dataDir, kvFlag string
	var files, entries int
	var dur time.Duration
	cmd := &cobra.Command{
		Use:   "meta",
		Short: "Measure create, stat, readdir, rename and unlink per second through the meta gRPC API",
		Long: "Measure metadata operations per second with 1 and 16 concurrent clients. Without --meta it\n" +
			"formats a temporary data directory and starts a meta server on 127.0.0.1 (durable bbolt\n" +
			"store, group commit), so the figures include gRPC, the transaction and fsync.\n\n" +
			"--kv etcd starts a private etcd server (the etcd binary must be installed) and measures a\n" +
			"meta server on it after the bbolt one, then prints both side by side with the ratio;\n" +
			"--kv etcd://host:port/prefix does the same against a running etcd (the prefix must be\n" +
			"unused: the benchmark formats a file system there).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			levels, err := parseInts(clients)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			opts := metabench.Options{Clients: levels, Files: files, DirEntries: entries, Duration: dur}
			fmt.Fprintf(out, "%d CPUs (GOMAXPROCS %d), %d files per level, readdir of %d entries\n",
				runtime.NumCPU(), runtime.GOMAXPROCS(0), opts.Files, opts.DirEntries)
			// The figures depend on what else runs on the machine: say so.
			printLoad(out, "before")
			defer printLoad(out, "after")
			if addr != "" {
				secret, err := auth.ReadSecretFile(secretFile)
				if err != nil {
					return err
				}
				opts.Addr, opts.Secret = addr, secret
				res, err := metabench.Run(ctx, opts)
				metabench.Print(out, res)
				return err
			}
			fmt.Fprintln(out, "== bbolt")
			boltRes, err := benchInProcess(ctx, out, opts, dataDir, "")
			if err != nil || kvFlag == "" {
				return err
			}
			url := kvFlag
			if kvFlag == "etcd" {
				etcd, err := etcdproc.Start(ctx, etcdproc.Options{})
				if err != nil {
					return fmt.Errorf("bench meta --kv etcd: %w", err)
				}
				defer etcd.Stop()
				url = etcd.URL(fmt.Sprintf("bench-%d", time.Now().UnixNano()))
				fmt.Fprintf(out, "== etcd (private etcd server, pid %d, on %s, fsync on)\n", etcd.PID(), etcd.Endpoint())
			} else {
				fmt.Fprintf(out, "== etcd at %s\n", url)
			}
			etcdRes, err := benchInProcess(ctx, out, opts, "", url)
			if err != nil {
				return err
			}
			fmt.Fprintln(out, "== etcd versus bbolt, same run")
			metabench.PrintComparison(out, "bbolt", boltRes, "etcd", etcdRes)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&addr, "meta", "", "benchmark a running meta server at this address (default: start one in-process)")
	f.StringVar(&secretFile, "secret-file", "", "cluster secret file (with --meta)")
	f.StringVar(&dataDir, "data", "", "data directory for the in-process bbolt server (default: a temporary directory)")
	f.StringVar(&kvFlag, "kv", "", "also measure a meta server on etcd: \"etcd\" (start a private etcd) or etcd://host:port/prefix")
	f.StringVar(&clients, "clients", "1,16", "comma-separated concurrency levels")
	f.IntVar(&files, "files", 4000, "files created, renamed and unlinked per level")
	f.IntVar(&entries, "dir-entries", 1000, "entries of the directory listed by readdir")
	f.DurationVar(&dur, "duration", 2*time.Second, "duration of the stat and readdir phases")
	return cmd
}

// benchInProcess formats a file system (bbolt in dataDir or a temporary
// directory, or etcd at kvURL), starts a meta server on it and runs the
// benchmark against it.
func benchInProcess(ctx context.Context, out io.Writer, opts metabench.Options, dataDir, kvURL string) ([]metabench.Result, error) {
	tmp, err := os.MkdirTemp("", "rdmafs-bench-meta-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	dir := dataDir
	if dir == "" && kvURL == "" {
		dir = tmp
	}
	sf := filepath.Join(tmp, "secret")
	if _, err := server.FormatStore(ctx, dir, kvURL, sf, core.StandardLayout()); err != nil {
		return nil, err
	}
	secret, err := auth.ReadSecretFile(sf)
	if err != nil {
		return nil, err
	}
	reg := prometheus.NewRegistry()
	srv, err := server.Start(ctx, server.Config{DataDir: dir, KV: kvURL, Listen: "127.0.0.1:0", Secret: secret,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Registry: reg})
	if err != nil {
		return nil, err
	}
	defer srv.Stop(ctx)
	for deadline := time.Now().Add(30 * time.Second); !srv.IsLeader(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("bench meta: the meta server on %s was not elected within 30s", kvURL)
		}
	}
	if kvURL == "" {
		fmt.Fprintf(out, "meta server in-process on %s, data %s (bbolt, fsync per group commit)\n", srv.Addr(), dir)
	} else {
		fmt.Fprintf(out, "meta server in-process on %s, store %s (etcd, group commit)\n", srv.Addr(), kvURL)
	}
	opts.Addr, opts.Secret = srv.Addr(), secret
	opts.Commits = func() (uint64, uint64) { return groupCommits(reg) }
	res, err := metabench.Run(ctx, opts)
	metabench.Print(out, res)
	return res, err
}

// printLoad prints the load average (Linux), when it is available.
func printLoad(w io.Writer, when string) {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) >= 3 {
		fmt.Fprintf(w, "load average %s the run: %s\n", when, strings.Join(f[:3], " "))
	}
}

// groupCommits returns the durable group commits of the server's store and
// the transactions in them, from its metrics (zero for etcd).
func groupCommits(reg *prometheus.Registry) (commits, txns uint64) {
	mfs, err := reg.Gather()
	if err != nil {
		return 0, 0
	}
	for _, mf := range mfs {
		if mf.GetName() == "rdmafs_meta_group_commit_txns" && len(mf.GetMetric()) > 0 {
			h := mf.GetMetric()[0].GetHistogram()
			return h.GetSampleCount(), uint64(h.GetSampleSum())
		}
	}
	return 0, 0
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
