// Command chunkd is the rdmafs storage daemon: it keeps chunk versions durable in
// its data directory and serves them to clients over an rdma transport. This file
// only parses flags, wires the chunkserver library together and handles signals.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/rdmafs/rdmafs/internal/sdnotify"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/rdmafs/rdmafs/chunkserver"
	"github.com/rdmafs/rdmafs/chunkserver/store"
	"github.com/rdmafs/rdmafs/cmd/chunkd/metamember"
	"github.com/rdmafs/rdmafs/internal/buildinfo"
	"github.com/rdmafs/rdmafs/internal/bytesize"
	"github.com/rdmafs/rdmafs/internal/gctune"
	"github.com/rdmafs/rdmafs/internal/metricshttp"
	"github.com/rdmafs/rdmafs/internal/sched"
	"github.com/rdmafs/rdmafs/meta/auth"
	"github.com/rdmafs/rdmafs/meta/client"
	"github.com/rdmafs/rdmafs/rdma/transport"
)

func main() {
	gctune.Apply()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := newCommand().ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "chunkd:", err)
		os.Exit(1)
	}
}

type flags struct {
	data, listen, advertise, meta, mem, transport, zone, metrics string
	secretFile, readyFile, logLevel, maxLength, capacity         string
	reserve                                                      string
	repairBW, repairMem, scrubRate                               string
	credits, repairParallel                                      int
	leaseTTL, stagingTTL, heartbeat                              time.Duration
	schedBatch                                                   bool
	tls                                                          auth.TLSFiles
}

func newCommand() *cobra.Command {
	var f flags
	cmd := &cobra.Command{
		Use:           "chunkd",
		Short:         "chunkd: the rdmafs storage daemon",
		Long:          "chunkd keeps chunk versions durable in --data and serves them from registered memory over an rdma transport.",
		Args:          cobra.NoArgs,
		Version:       buildinfo.Read().String(),
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE:          func(cmd *cobra.Command, _ []string) error { return run(cmd.Context(), &f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.data, "data", "", "data directory (required)")
	fl.StringVar(&f.listen, "listen", "127.0.0.1:7500", "address to serve the chunk protocol on (meta's default is 7400)")
	fl.StringVar(&f.advertise, "advertise", "", "address registered with the metadata service (default: the listen address)")
	fl.StringVar(&f.meta, "meta", "", "metadata service address, or several comma-separated (meta servers on one etcd; empty: standalone)")
	fl.StringVar(&f.mem, "mem", "", "registered memory for resident chunks and staging, e.g. 512MiB (default min(RAM/8, 4GiB))")
	fl.StringVar(&f.transport, "transport", "auto", "rdma transport: "+strings.Join(transport.Names(), ", "))
	fl.StringVar(&f.zone, "zone", "", "failure-domain label")
	fl.StringVar(&f.metrics, "metrics", "", "serve Prometheus metrics (/metrics) and Go profiles (/debug/pprof/) on this address (empty: off)")
	fl.StringVar(&f.secretFile, "secret-file", "", "file holding the cluster secret clients must present")
	f.tls.Register(fl, false)
	fl.StringVar(&f.readyFile, "ready-file", "", "file to write the listen address to once serving")
	fl.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	fl.StringVar(&f.maxLength, "max-length", "16MiB", "largest chunk version accepted")
	fl.StringVar(&f.capacity, "capacity", "0", "bytes of disk chunkd may use (0: the file system's size)")
	fl.StringVar(&f.reserve, "reserve", "auto", "free space kept back from new shards: a chunkserver offers the metadata service its free space "+
		"(deleted versions kept for reuse counted) less this, and refuses a new version's prepare with no-space once the space "+
		"left after it would be under this; repairs may use it. auto: 2% of the capacity, within [64MiB, 4GiB], at most half of it; 0: none")
	fl.IntVar(&f.credits, "credits", 32, "request messages a connection may have outstanding")
	fl.DurationVar(&f.leaseTTL, "lease-ttl", 10*time.Second, "read lease time")
	fl.DurationVar(&f.stagingTTL, "staging-ttl", 60*time.Second, "time a prepared write may wait for its commit")
	fl.DurationVar(&f.heartbeat, "heartbeat", 5*time.Second, "heartbeat interval to the metadata service")
	fl.StringVar(&f.repairBW, "repair-bw", "128MiB", "bytes per second repair may read from other chunkservers (0: unlimited)")
	fl.StringVar(&f.scrubRate, "scrub-rate", "64MiB", "bytes per second scrubbing may read back from disk (0: unlimited); meta's --scrub-interval sets how often")
	fl.IntVar(&f.repairParallel, "repair-parallel", 2, "repair tasks run at once")
	fl.StringVar(&f.repairMem, "repair-mem", "32MiB", "registered memory for repair reads (a 4+2 task with 1 MiB units needs 5 MiB)")
	fl.BoolVar(&f.schedBatch, "sched-batch", true, "run under SCHED_BATCH (no wake-up preemption: fewer context switches per request)")
	cmd.MarkFlagRequired("data")
	return cmd
}

func run(ctx context.Context, f *flags) error {
	var level slog.Level
	if err := level.UnmarshalText([]byte(f.logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	slog.SetDefault(log)
	if f.schedBatch {
		if err := sched.Batch(); err != nil {
			log.Warn("chunkd: staying under the default scheduling policy", "err", err)
		}
	}

	memBytes, err := defaultMem()
	if err != nil {
		return err
	}
	if f.mem != "" {
		if memBytes, err = bytesize.Parse(f.mem); err != nil {
			return fmt.Errorf("--mem: %w", err)
		}
	}
	maxLength, err := bytesize.Parse(f.maxLength)
	if err != nil {
		return fmt.Errorf("--max-length: %w", err)
	}
	capacity, err := bytesize.Parse(f.capacity)
	if err != nil {
		return fmt.Errorf("--capacity: %w", err)
	}
	scrubRate, err := bytesize.Parse(f.scrubRate)
	if err != nil {
		return fmt.Errorf("--scrub-rate: %w", err)
	}
	repairBW, err := bytesize.Parse(f.repairBW)
	if err != nil {
		return fmt.Errorf("--repair-bw: %w", err)
	}
	repairMem, err := bytesize.Parse(f.repairMem)
	if err != nil {
		return fmt.Errorf("--repair-mem: %w", err)
	}
	if f.repairParallel < 1 || f.repairParallel > 64 {
		return fmt.Errorf("--repair-parallel %d: must be 1..64", f.repairParallel)
	}
	var secret []byte
	if f.secretFile != "" {
		s, err := auth.ReadSecretFile(f.secretFile)
		if err != nil {
			return fmt.Errorf("--secret-file: %w", err)
		}
		secret = []byte(s)
	}
	dev, err := transport.Open(f.transport, log)
	if err != nil {
		return err
	}
	defer dev.Close()
	var member chunkserver.Membership
	var repair chunkserver.RepairConfig
	if f.meta != "" {
		if len(secret) == 0 {
			return fmt.Errorf("--meta needs --secret-file: the metadata service refuses requests without the cluster secret")
		}
		tlsCfg, err := f.tls.ClientConfig()
		if err != nil {
			return fmt.Errorf("chunkd: %w", err)
		}
		mc, err := client.Dial(f.meta, string(secret), client.WithTLS(tlsCfg))
		if err != nil {
			return err
		}
		defer mc.Close()
		mm := metamember.New(mc)
		member = mm
		repair = chunkserver.RepairConfig{Planner: mm, Bandwidth: repairBW, Parallel: f.repairParallel, MemBytes: int(repairMem)}
	} else {
		log.Warn("chunkd: no --meta: serving standalone, not registered with a metadata service")
	}

	reserve, err := parseReserve(f.reserve)
	if err != nil {
		return err
	}
	st, err := store.Open(f.data, store.Options{MaxLength: int(maxLength), Capacity: capacity, Reserve: reserve, Logger: log})
	if err != nil {
		return err
	}
	defer st.Close()
	sp := st.Space()
	log.Info("chunkd: disk space", "dir", f.data, "total", sp.Total, "available", sp.Avail, "kept", sp.Kept, "reserve", sp.Reserve)

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	srv, err := chunkserver.New(ctx, chunkserver.Config{
		Device: dev, Store: st, Addr: f.listen, AdvertiseAddr: f.advertise,
		MemBytes: int(memBytes), Secret: secret, Credits: f.credits,
		LeaseTTL: f.leaseTTL, StagingTTL: f.stagingTTL, HeartbeatInterval: f.heartbeat,
		Zone: f.zone, Logger: log, Registerer: reg, Membership: member, Repair: repair, ScrubRate: scrubRate,
	})
	if err != nil {
		return err
	}
	if f.metrics != "" {
		ms, err := metricshttp.Start(f.metrics, reg)
		if err != nil {
			srv.Close()
			return fmt.Errorf("--metrics: %w", err)
		}
		defer ms.Stop(5*time.Second, log)
		log.Info("chunkd: metrics", "addr", ms.Addr())
	}
	if f.readyFile != "" {
		tmp := f.readyFile + ".tmp"
		err := os.WriteFile(tmp, []byte(srv.Addr()+"\n"), 0o600)
		if err == nil {
			err = os.Rename(tmp, f.readyFile)
		}
		if err != nil {
			srv.Close()
			return fmt.Errorf("--ready-file: %w", err)
		}
	}
	sdnotify.Ready(log)
	sdnotify.Watchdog(ctx, log, func(context.Context) error { return nil })
	context.AfterFunc(ctx, func() { sdnotify.Stopping(log) })
	err = srv.Serve(ctx)
	if err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// parseReserve turns --reserve into store.Options.Reserve: "auto" is 0 (the
// store's default), "0" is -1 (no reserve), a size is itself.
func parseReserve(v string) (int64, error) {
	if v == "auto" {
		return 0, nil
	}
	n, err := bytesize.Parse(v)
	if err != nil {
		return 0, fmt.Errorf("--reserve: %w", err)
	}
	if n == 0 {
		return -1, nil
	}
	return n, nil
}

// defaultMem returns min(RAM/8, 4 GiB), at least 64 MiB.
func defaultMem() (int64, error) {
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err != nil {
		return 0, fmt.Errorf("sysinfo: %w", err)
	}
	ram := int64(si.Totalram) * int64(si.Unit)
	return max(min(ram/8, 4<<30), 64<<20), nil
}
