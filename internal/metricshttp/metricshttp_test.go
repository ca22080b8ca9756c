package metricshttp

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: read body: %v", url, err)
	}
	return resp.StatusCode, string(b)
}

// TestServe scrapes /metrics and the pprof index of a server on a free
// port, and checks that the port, taken, makes a second Start fail.
func TestServe(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "metricshttp_test_total", Help: "A test counter."})
	reg.MustRegister(c)
	c.Add(3)
	s, err := Start("127.0.0.1:0", reg)
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + s.Addr()
	if code, body := get(t, base+"/metrics"); code != http.StatusOK || !strings.Contains(body, "metricshttp_test_total 3") {
		t.Fatalf("/metrics: status %d, body:\n%s", code, body)
	}
	if code, body := get(t, base+"/debug/pprof/"); code != http.StatusOK || !strings.Contains(body, "goroutine") {
		t.Fatalf("/debug/pprof/: status %d, body:\n%s", code, body)
	}
	if code, body := get(t, base+"/debug/pprof/goroutine?debug=1"); code != http.StatusOK || !strings.Contains(body, "goroutine profile") {
		t.Fatalf("/debug/pprof/goroutine: status %d, body:\n%.300s", code, body)
	}

	s2, err := Start(s.Addr(), reg)
	if err == nil {
		s2.Shutdown(context.Background())
		t.Fatalf("Start on %s, already in use, succeeded", s.Addr())
	}
	if !strings.Contains(err.Error(), s.Addr()) {
		t.Fatalf("Start on a port in use: %v, want an error naming %s", err, s.Addr())
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if resp, err := (&http.Client{Timeout: 2 * time.Second}).Get(base + "/metrics"); err == nil {
		resp.Body.Close()
		t.Fatal("/metrics still answers after Shutdown")
	}
}

// TestNil checks that a nil Server, metrics off, has no address and shuts
// down without error.
func TestNil(t *testing.T) {
	var s *Server
	if s.Addr() != "" {
		t.Fatalf("nil Server Addr = %q", s.Addr())
	}
	if err := s.Shutdown(context.Background()); err != nil {
		t.Fatalf("nil Server Shutdown: %v", err)
	}
}

// TestStop checks that Stop ends serving, and does nothing on a nil Server.
func TestStop(t *testing.T) {
	s, err := Start("127.0.0.1:0", prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	s.Stop(5*time.Second, slog.Default())
	if resp, err := (&http.Client{Timeout: 2 * time.Second}).Get("http://" + s.Addr() + "/metrics"); err == nil {
		resp.Body.Close()
		t.Fatal("/metrics still answers after Stop")
	}
	var none *Server
	none.Stop(time.Second, slog.Default())
}

// TestOptions serves an extra handler and runs a task whose context ends
// at Shutdown, which waits for it.
func TestOptions(t *testing.T) {
	started, ended := make(chan struct{}), make(chan struct{})
	task := func(ctx context.Context) {
		close(started)
		<-ctx.Done()
		close(ended)
	}
	hello := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello") })
	s, err := Start("127.0.0.1:0", prometheus.NewRegistry(), WithHandler("/hello", hello), WithTask(task))
	if err != nil {
		t.Fatal(err)
	}
	<-started
	if code, body := get(t, "http://"+s.Addr()+"/hello"); code != http.StatusOK || body != "hello" {
		t.Fatalf("/hello: status %d, body %q", code, body)
	}
	if code, _ := get(t, "http://"+s.Addr()+"/metrics"); code != http.StatusOK {
		t.Fatalf("/metrics beside an extra handler: status %d", code)
	}
	select {
	case <-ended:
		t.Fatal("the task ended before Shutdown")
	default:
	}
	if err := s.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ended:
	default:
		t.Fatal("Shutdown returned before the task ended")
	}
}
