package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/rdmafs/rdmafs/internal/sdnotify"
	"github.com/rdmafs/rdmafs/meta/metapb"

	"github.com/spf13/cobra"

	"github.com/rdmafs/rdmafs/meta/auth"
	"github.com/rdmafs/rdmafs/meta/server"
)

// newMetaCommand is `rdmafs meta`: the metadata server.
func newMetaCommand() *cobra.Command {
	var (
		dataDir, kvURL, listen, secretFile, metricsListen, logLevel string
		hbTimeout, sessionTTL, grantTTL, electionTTL                time.Duration
		repairGrace, repairTaskTimeout, scrubInterval, dashInterval time.Duration
		durableReplies                                              bool
		tlsFiles                                                    auth.TLSFiles
	)
	cmd := &cobra.Command{
		Use:   "meta",
		Short: "Run the metadata server",
		Long: "Run the metadata server on a data directory prepared by `rdmafs format`. It serves the\n" +
			"namespace, layouts, the stripe table and chunkserver membership over gRPC, refuses\n" +
			"requests without the cluster secret, and stops cleanly on SIGTERM.\n\n" +
			"With --kv etcd://host:port[,host:port]/prefix the state lives in etcd (formatted with\n" +
			"`rdmafs format --kv`) and several meta servers may run on it: one is elected and serves,\n" +
			"the others stand by and take over when it dies (docs/meta-etcd.md). Give clients and\n" +
			"chunkservers all their addresses, comma-separated.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			logger, err := newLogger(logLevel)
			if err != nil {
				return err
			}
			if dataDir == "" && kvURL == "" {
				return fmt.Errorf("meta: give --data DIR (bbolt) or --kv etcd://... (etcd)")
			}
			if secretFile == "" {
				if dataDir == "" {
					return fmt.Errorf("meta: --kv needs --secret-file (there is no data directory to find it in)")
				}
				secretFile = server.DefaultSecretFile(dataDir)
			}
			secret, err := auth.ReadSecretFile(secretFile)
			if err != nil {
				return err
			}
			tlsCfg, err := tlsFiles.ServerConfig()
			if err != nil {
				return fmt.Errorf("meta: %w", err)
			}
			if tlsCfg == nil {
				logger.Warn("meta: serving without TLS: the cluster secret and file names cross the network in clear (see --tls-cert, docs/security.md)")
			}
			ctx := cmd.Context()
			srv, err := server.Start(ctx, server.Config{DataDir: dataDir, KV: kvURL, ElectionTTL: electionTTL, Listen: listen, Secret: secret, TLS: tlsCfg,
				MetricsListen: metricsListen, DashboardInterval: dashInterval, HeartbeatTimeout: hbTimeout, SessionTTL: sessionTTL,
				GrantTTL: grantTTL, Logger: logger, RepairGrace: repairGrace, RepairTaskTimeout: repairTaskTimeout, ScrubInterval: scrubInterval,
				DurableReplies: durableReplies})
			if err != nil {
				return err
			}
			sdnotify.Ready(logger)
			sdnotify.Watchdog(ctx, logger, func(ctx context.Context) error {
				svc := srv.Service()
				if svc == nil {
					return nil // a standby: alive while it campaigns
				}
				_, err := svc.StatFS(ctx, &metapb.StatFSRequest{})
				return err
			})
			<-ctx.Done()
			sdnotify.Stopping(logger)
			logger.Info("shutting down")
			sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			return srv.Stop(sctx)
		},
	}
	f := cmd.Flags()
	f.StringVar(&dataDir, "data", "", "metadata data directory (formatted by rdmafs format)")
	f.StringVar(&kvURL, "kv", "", "metadata store in etcd: etcd://host:port[,host:port]/prefix (default: bbolt in --data)")
	f.DurationVar(&electionTTL, "election-ttl", 5*time.Second, "with --kv: leader lease; a standby takes over this long after the leader dies")
	f.StringVar(&listen, "listen", "127.0.0.1:7400", "gRPC listen address")
	f.StringVar(&secretFile, "secret-file", "", "cluster secret file (default DATA/secret)")
	tlsFiles.Register(f, true)
	f.StringVar(&metricsListen, "http", "", "serve the web dashboard (/), Prometheus metrics (/metrics) and Go profiles (/debug/pprof/) on this address, e.g. 127.0.0.1:7401, over TLS with --tls-cert (off when empty)")
	f.StringVar(&metricsListen, "metrics", "", "the same as --http")
	f.MarkHidden("metrics")
	f.DurationVar(&dashInterval, "dashboard-interval", 10*time.Second, "time between samples of the dashboard's graphs")
	f.MarkHidden("dashboard-interval")
	f.DurationVar(&hbTimeout, "heartbeat-timeout", 10*time.Second, "mark a chunkserver down after this long without a heartbeat")
	f.DurationVar(&sessionTTL, "session-ttl", 30*time.Second, "default client session lifetime without keepalive")
	f.DurationVar(&grantTTL, "grant-ttl", 10*time.Minute, "collect the chunks of write grants not committed within this time")
	f.DurationVar(&repairGrace, "repair-grace", 10*time.Minute, "rebuild the shards of a chunkserver elsewhere once it has been down this long")
	f.DurationVar(&scrubInterval, "scrub-interval", 7*24*time.Hour, "each chunkserver reads back and checks every chunk it stores once per this period, spread evenly (capped by chunkd --scrub-rate)")
	f.DurationVar(&repairTaskTimeout, "repair-task-timeout", 2*time.Minute, "give a repair task to another chunkserver if its target has not finished it within this time")
	f.BoolVar(&durableReplies, "durable-replies", false, "answer each operation only once it is durable on disk (default: once it is in the log, which survives a crash of this process; a client's fsync or fsyncdir waits for the disk)")
	f.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn, error")
	return cmd
}

func newLogger(level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("invalid --log-level %q: %w", level, err)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: l})), nil
}
