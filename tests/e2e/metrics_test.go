package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"github.com/rdmafs/rdmafs/internal/devcluster"
)

// TestMetricsNames scrapes every process of a dev cluster (meta over
// HTTPS, each chunkd, the mount): promlint finds nothing to say about any
// metric, and every metric of rdmafs is in the rdmafs_ namespace under the
// subsystem of its process (rdmafs_meta_, rdmafs_chunkd_, rdmafs_client_)
// or its transport's (rdmafs_rdma_); only the Go runtime's and the process
// collector's standard ones are not. Then `rdmafs stats` of a chunkd, of
// the mount by its mount point and of meta over TLS shows rates under
// writes, and every metric the Grafana dashboard queries exists.
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
	// Meta serves HTTPS with the cluster's certificate.
	tc, err := c.ClientTLS().ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tc}}
	type target struct {
		prefixes []string
		url      string
	}
	targets := []target{
		{[]string{"rdmafs_meta_"}, "https://" + logged(t, c.Meta.Log, `msg="meta server started".* metrics=(\S+)`)},
		{[]string{"rdmafs_client_", "rdmafs_rdma_"}, "http://" + logged(t, c.Mount.Log, `msg=metrics addr=(\S+)`)},
	}
	for _, ch := range c.Chunk {
		targets = append(targets, target{[]string{"rdmafs_chunkd_", "rdmafs_rdma_"}, "http://" + logged(t, ch.Log, `msg="chunkd: metrics" addr=(\S+)`)})
	}
	exposed := map[string]bool{} // every metric name of every process
	for _, tg := range targets {
		prefix, a := strings.Join(tg.prefixes, "|"), tg.url
		resp, err := hc.Get(a + "/metrics")
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
			exposed[name] = true
			switch {
			case slices.ContainsFunc(tg.prefixes, func(p string) bool { return strings.HasPrefix(name, p) }):
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
	type row struct {
		Metric  string  `json:"metric"`
		Labels  string  `json:"labels"`
		PerSec  float64 `json:"per_second"`
		MeanSec float64 `json:"mean_seconds"`
	}
	stats := func(args ...string) []row {
		t.Helper()
		out, err := rdmafs(t, append([]string{"stats", "--json", "--interval", "700ms"}, args...)...)
		if err != nil {
			t.Fatalf("rdmafs stats %s: %v\n%s", args, err, out)
		}
		var rows []row
		if err := json.Unmarshal([]byte(out), &rows); err != nil {
			t.Fatalf("rdmafs stats --json: %v\n%s", err, out)
		}
		return rows
	}
	moved := func(rows []row, metric, labels string, latency bool) bool {
		for _, r := range rows {
			if r.Metric == metric && strings.Contains(r.Labels, labels) && r.PerSec > 0 && (!latency || r.MeanSec > 0) {
				return true
			}
		}
		return false
	}
	chunkd := stats(strings.TrimPrefix(targets[2].url, "http://"))
	// A mount is found by its mount point (or a directory in it).
	mount := stats(c.MountPoint)
	// A meta server with TLS: its metrics over HTTPS.
	meta := stats(append([]string{strings.TrimPrefix(targets[0].url, "https://")}, c.TLSArgs()...)...)
	close(stop)
	<-done
	if !moved(chunkd, "rdmafs_chunkd_disk_written_bytes_total", "", false) || !moved(chunkd, "rdmafs_chunkd_request_seconds", "", true) {
		t.Errorf("rdmafs stats of a chunkd under writes shows no bytes written or no request latency: %+v", chunkd)
	}
	if !moved(mount, "rdmafs_client_fuse_request_duration_seconds", "op=write", true) ||
		!moved(mount, "rdmafs_client_fuse_request_duration_seconds", "op=fsync", true) ||
		!moved(mount, "rdmafs_client_written_bytes_total", "", false) ||
		!moved(mount, "rdmafs_rdma_bytes_total", "opcode=rdma_write", false) {
		t.Errorf("rdmafs stats of the mount under writes shows no FUSE writes or fsyncs with latency, bytes written or RDMA writes: %+v", mount)
	}
	if !moved(meta, "rdmafs_meta_op_seconds", "", true) {
		t.Errorf("rdmafs stats of meta shows no operations: %+v", meta)
	}
	if out, err := rdmafs(t, "stats", "--json", "/"); err == nil || !strings.Contains(out, "not in an rdmafs mount") {
		t.Errorf("rdmafs stats / (not a mount): %v\n%s", err, out)
	}

	// The Grafana dashboard shows only metrics that exist.
	checkGrafana(t, exposed)
}

// checkGrafana fails t for each metric a query of deploy/grafana's
// dashboards names that no process exposed.
func checkGrafana(t *testing.T, exposed map[string]bool) {
	t.Helper()
	files, err := filepath.Glob("../../deploy/grafana/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no Grafana dashboard in deploy/grafana (%v)", err)
	}
	name := regexp.MustCompile(`rdmafs_[a-z0-9_]+`)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var exprs []string
		var walk func(v any)
		walk = func(v any) {
			switch v := v.(type) {
			case map[string]any:
				for k, x := range v {
					if s, ok := x.(string); ok && k == "expr" {
						exprs = append(exprs, s)
					}
					walk(x)
				}
			case []any:
				for _, x := range v {
					walk(x)
				}
			}
		}
		var doc any
		if err := json.Unmarshal(b, &doc); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		walk(doc)
		if len(exprs) < 10 {
			t.Errorf("%s: only %d queries", f, len(exprs))
		}
		for _, e := range exprs {
			for _, m := range name.FindAllString(e, -1) {
				base := m
				for _, suffix := range []string{"_bucket", "_count", "_sum"} {
					if b, ok := strings.CutSuffix(m, suffix); ok && exposed[b] {
						base = b
					}
				}
				if !exposed[base] {
					t.Errorf("%s: query %q names %s, which no process of the cluster exposes", filepath.Base(f), e, m)
				}
			}
		}
	}
}

// logged waits up to 10 s for log to hold a line matching pattern and
// returns its first group: an address a process logs when it starts.
func logged(t *testing.T, log, pattern string) string {
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
			t.Fatalf("%s logged no line matching %s", log, pattern)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
