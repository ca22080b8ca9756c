package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"github.com/rdmafs/rdmafs/internal/devcluster"
)

// TestMetricsNames scrapes every process of a dev cluster (meta, each
// chunkd, the mount): promlint finds nothing to say about any metric, and
// every metric of rdmafs is in the rdmafs_ namespace under the subsystem of
// its process (rdmafs_meta_, rdmafs_chunkd_, rdmafs_client_); only the Go
// runtime's and the process collector's standard ones are not.
func TestMetricsNames(t *testing.T) {
	needRoot(t)
	metrics := []string{"--metrics", "127.0.0.1:0"}
	c := upWith(t, func(cfg *devcluster.Config) {
		cfg.Chunkservers = 2
		cfg.EC, cfg.Unit = "1+1", "64KiB"
		cfg.MetaArgs, cfg.ChunkdArgs, cfg.MountArgs = metrics, metrics, metrics
	})
	// Some traffic, so that labelled metrics have series.
	if err := os.WriteFile(c.MountPoint+"/f", bytes.Repeat([]byte("x"), 300<<10), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := os.ReadFile(c.MountPoint + "/f"); err != nil {
		t.Fatal(err)
	}
	addr := func(log, pattern string) string {
		t.Helper()
		re := regexp.MustCompile(pattern)
		deadline := time.Now().Add(10 * time.Second)
		for {
			b, err := os.ReadFile(log)
			if err != nil {
				t.Fatal(err)
			}
			if m := re.FindSubmatch(b); m != nil {
				return string(m[1])
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s logged no metrics address (%s)", log, pattern)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	type target struct{ prefix, addr string }
	targets := []target{
		{"rdmafs_meta_", addr(c.Meta.Log, `msg="meta server started".* metrics=(\S+)`)},
		{"rdmafs_client_", addr(c.Mount.Log, `msg=metrics addr=(\S+)`)},
	}
	for _, ch := range c.Chunk {
		targets = append(targets, target{"rdmafs_chunkd_", addr(ch.Log, `msg="chunkd: metrics" addr=(\S+)`)})
	}
	for _, tg := range targets {
		prefix, a := tg.prefix, tg.addr
		resp, err := http.Get("http://" + a + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		problems, err := promlint.New(bytes.NewReader(body)).Lint()
		if err != nil {
			t.Fatalf("%s (%s): %v", a, prefix, err)
		}
		for _, p := range problems {
			t.Errorf("%s (%s): %s: %s", a, prefix, p.Metric, p.Text)
		}
		own := 0
		sc := bufio.NewScanner(bytes.NewReader(body))
		for sc.Scan() {
			name, ok := strings.CutPrefix(sc.Text(), "# TYPE ")
			if !ok {
				continue
			}
			name, _, _ = strings.Cut(name, " ")
			switch {
			case strings.HasPrefix(name, prefix):
				own++
			case strings.HasPrefix(name, "go_"), strings.HasPrefix(name, "process_"), strings.HasPrefix(name, "promhttp_"):
			default:
				t.Errorf("%s: metric %s is not under %s", a, name, prefix)
			}
		}
		if own == 0 {
			t.Errorf("%s: no metric under %s", a, prefix)
		}
	}

	// rdmafs stats: one sample of a chunkd while a writer writes.
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			f, err := os.Create(fmt.Sprintf("%s/w%d", c.MountPoint, i%4))
			if err != nil {
				return
			}
			f.Write(bytes.Repeat([]byte{byte(i)}, 256<<10))
			f.Sync()
			f.Close()
		}
	}()
	out, err := rdmafs(t, "stats", targets[2].addr, "--json", "--interval", "700ms")
	close(stop)
	<-done
	if err != nil {
		t.Fatalf("rdmafs stats: %v\n%s", err, out)
	}
	var rows []struct {
		Metric  string  `json:"metric"`
		Labels  string  `json:"labels"`
		PerSec  float64 `json:"per_second"`
		MeanSec float64 `json:"mean_seconds"`
	}
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatalf("rdmafs stats --json: %v\n%s", err, out)
	}
	var written, latency bool
	for _, r := range rows {
		written = written || r.Metric == "rdmafs_chunkd_disk_written_bytes_total" && r.PerSec > 0
		latency = latency || r.Metric == "rdmafs_chunkd_request_seconds" && r.PerSec > 0 && r.MeanSec > 0
	}
	if !written || !latency {
		t.Fatalf("rdmafs stats of a chunkd under writes shows no bytes written or no request latency:\n%s", out)
	}
}
