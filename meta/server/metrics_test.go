package server_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/meta/server"
)

// TestMetricsListen checks that a server serves its metrics on
// MetricsListen, and that one whose metrics address is taken fails to start
// with an error naming it (instead of running without metrics).
func TestMetricsListen(t *testing.T) {
	ctx := context.Background()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	dir, secret := formatted(t)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	cfg := server.Config{DataDir: dir, Listen: "127.0.0.1:0", Secret: secret, Logger: quiet, MetricsListen: taken.Addr().String()}
	if s, err := server.Start(ctx, cfg); err == nil {
		s.Stop(ctx)
		t.Fatalf("Start with the metrics address %s taken succeeded", cfg.MetricsListen)
	} else if !strings.Contains(err.Error(), cfg.MetricsListen) {
		t.Fatalf("Start with the metrics address taken: %v, want an error naming %s", err, cfg.MetricsListen)
	}

	// The failed start released the store: a second one opens it.
	cfg.MetricsListen = "127.0.0.1:0"
	s, err := server.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop(ctx)
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get("http://" + s.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatalf("scrape metrics: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), "rdmafs_meta_repair_queue ") {
		t.Fatalf("metrics lack the meta server's:\n%.2000s", body)
	}
}
