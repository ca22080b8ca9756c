package dashboard

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rdmafs/rdmafs/meta/metapb"
)

// fakeCluster is a Status source whose reply the test changes.
type fakeCluster struct {
	mu      sync.Mutex
	reply   *metapb.StatusReply
	standby bool
}

func (c *fakeCluster) status(ctx context.Context) (*metapb.StatusReply, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.standby {
		return nil, ErrStandby
	}
	return c.reply, nil
}

func get(t *testing.T, srv *httptest.Server, path, password string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if password != "" {
		req.SetBasicAuth("admin", password)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

func TestDashboard(t *testing.T) {
	cluster := &fakeCluster{reply: &metapb.StatusReply{ClusterId: "c1",
		Chunkservers: []*metapb.ChunkserverStatus{
			{Id: "cs1", Address: "127.0.0.1:1", Up: true, Capacity: 1000, Used: 100},
			{Id: "cs2", Address: "127.0.0.1:2", Up: false, Capacity: 1000, Used: 300},
		},
		Repair: &metapb.RepairStatus{HealthyStripes: 5, DegradedStripes: 2, BytesPerSecond: 64},
		Scrub:  &metapb.ScrubStatus{BytesTotal: 1000},
	}}
	reg := prometheus.NewRegistry()
	ops := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rdmafs_meta_ops_total"}, []string{"method", "code"})
	reg.MustRegister(ops)
	now := time.Unix(1000, 0)
	var clock sync.Mutex
	d := New(Config{Status: cluster.status, Gatherer: reg, Secret: "s3cret", Interval: 10 * time.Second,
		History: 30 * time.Second, Now: func() time.Time { clock.Lock(); defer clock.Unlock(); return now }})
	srv := httptest.NewServer(d.Handler())
	defer srv.Close()

	for _, path := range []string{"/", "/api/status", "/static/app.js"} {
		if resp, _ := get(t, srv, path, ""); resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("WWW-Authenticate") == "" {
			t.Errorf("GET %s without the secret: %s, want 401 asking for credentials", path, resp.Status)
		}
		if resp, _ := get(t, srv, path, "wrong"); resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("GET %s with a wrong secret: %s, want 401", path, resp.Status)
		}
	}
	resp, page := get(t, srv, "/", "s3cret")
	if resp.StatusCode != http.StatusOK || !strings.Contains(page, `src="static/app.js"`) ||
		!strings.Contains(resp.Header.Get("Content-Security-Policy"), "default-src 'self'") {
		t.Fatalf("GET /: %s, CSP %q:\n%s", resp.Status, resp.Header.Get("Content-Security-Policy"), page)
	}
	for _, path := range []string{"/static/app.js", "/static/style.css"} {
		if resp, body := get(t, srv, path, "s3cret"); resp.StatusCode != http.StatusOK || len(body) < 100 {
			t.Errorf("GET %s: %s, %d bytes", path, resp.Status, len(body))
		}
	}
	if resp, _ := get(t, srv, "/nothing", "s3cret"); resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET /nothing: %s, want 404", resp.Status)
	}

	// Samples: rates come from the differences between two samples.
	ctx := context.Background()
	d.sample(ctx)
	ops.WithLabelValues("Create", "OK").Add(150)
	ops.WithLabelValues("CommitStripes", "OK").Add(50)
	cluster.mu.Lock()
	cluster.reply.Scrub.BytesTotal = 3000
	cluster.mu.Unlock()
	clock.Lock()
	now = now.Add(10 * time.Second)
	clock.Unlock()
	d.sample(ctx)

	var got struct {
		Role    string          `json:"role"`
		Status  json.RawMessage `json:"status"`
		History []Sample        `json:"history"`
	}
	_, body := get(t, srv, "/api/status", "s3cret")
	if err := json.Unmarshal([]byte(body), &got); err != nil {
		t.Fatalf("api/status: %v\n%s", err, body)
	}
	if got.Role != "leader" || !strings.Contains(string(got.Status), `"cluster_id":"c1"`) ||
		!strings.Contains(string(got.Status), `"degraded_stripes":"2"`) || !strings.Contains(string(got.Status), `"id":"cs2"`) {
		t.Fatalf("api/status: %s", body)
	}
	if len(got.History) != 2 {
		t.Fatalf("history of %d samples, want 2: %+v", len(got.History), got.History)
	}
	want := Sample{UnixMs: 1010_000, MetaOpsPerSec: 20, CommitsPerSec: 5, RepairBytesSec: 64, ScrubBytesSec: 200,
		UsedBytes: 100, CapacityBytes: 1000, DegradedStripes: 2, ChunkserversUp: 1}
	if got.History[1] != want {
		t.Errorf("second sample %+v, want %+v", got.History[1], want)
	}

	// The history keeps History/Interval samples.
	for range 5 {
		clock.Lock()
		now = now.Add(10 * time.Second)
		clock.Unlock()
		d.sample(ctx)
	}
	d.mu.Lock()
	n, last := len(d.samples), d.samples[len(d.samples)-1].UnixMs
	d.mu.Unlock()
	if n != 3 || last != now.UnixMilli() {
		t.Errorf("history holds %d samples ending at %d, want 3 ending at %d", n, last, now.UnixMilli())
	}

	// A standby says so and adds no samples.
	cluster.mu.Lock()
	cluster.standby = true
	cluster.mu.Unlock()
	d.sample(ctx)
	_, body = get(t, srv, "/api/status", "s3cret")
	got.Status, got.History = nil, nil
	if err := json.Unmarshal([]byte(body), &got); err != nil || got.Role != "standby" || len(got.Status) != 0 || len(got.History) != 3 {
		t.Errorf("standby's api/status: %s", body)
	}
}

func TestDashboardWithoutSecret(t *testing.T) {
	cluster := &fakeCluster{reply: &metapb.StatusReply{ClusterId: "c1"}}
	srv := httptest.NewServer(New(Config{Status: cluster.status}).Handler())
	defer srv.Close()
	if resp, _ := get(t, srv, "/api/status", ""); resp.StatusCode != http.StatusOK {
		t.Errorf("GET /api/status with no secret configured: %s", resp.Status)
	}
}
