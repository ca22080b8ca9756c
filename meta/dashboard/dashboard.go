// Package dashboard is the meta server's read-only web dashboard: one
// embedded page (no external resources) showing the cluster's health, its
// chunkservers, stripe health, repair, scrub and relayout progress, and
// graphs of the last hour, fed by a JSON API the page polls.
//
// Routes (Handler): "/" the page, "/static/" its script and style,
// "/api/status" the current state and the history as JSON. When a secret is
// set every route asks for HTTP basic authentication with the cluster secret
// as the password (any user name), unless the request came over TLS with a
// client certificate the server verified.
package dashboard

import (
	"context"
	"crypto/subtle"
	"embed"
	"encoding/json"
	"errors"
	"io/fs"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/rdmafs/rdmafs/meta/metapb"
)

//go:embed static
var static embed.FS

// ErrStandby is what a Config.Status returns on a meta server standing by
// (etcd mode): the page then says so and shows no cluster state.
var ErrStandby = errors.New("dashboard: this meta server is standing by")

// Config configures a Dashboard.
type Config struct {
	// Status returns the cluster's state, as a brief Status call does
	// (metapb.StatusRequest.Brief); ErrStandby on a standby.
	Status func(ctx context.Context) (*metapb.StatusReply, error)
	// Gatherer is the meta server's registry, whose rdmafs_meta_ops_total
	// the graphs show as operations per second.
	Gatherer prometheus.Gatherer
	// Secret, when set, is the password every request must present.
	Secret string
	// Interval is the time between samples of the history (default 10 s);
	// History how long it is kept (default 1 h).
	Interval, History time.Duration
	// Now returns the current time (default time.Now).
	Now    func() time.Time
	Logger *slog.Logger
}

// Dashboard serves the page and keeps the history its graphs draw.
type Dashboard struct {
	cfg Config

	mu      sync.Mutex
	samples []Sample // oldest first, at most cfg.History/cfg.Interval
	prev    *counters
}

// Sample is one point of the graphs.
type Sample struct {
	UnixMs          int64   `json:"t"`
	MetaOpsPerSec   float64 `json:"meta_ops"`        // metadata RPCs answered
	CommitsPerSec   float64 `json:"commits"`         // CommitStripes calls: writes committed
	RepairBytesSec  float64 `json:"repair_bps"`      // rebuilt shards
	RelayoutBytes   float64 `json:"relayout_bps"`    // converted stripes
	ScrubBytesSec   float64 `json:"scrub_bps"`       // verified by the chunkservers
	UsedBytes       uint64  `json:"used"`            // on up chunkservers
	CapacityBytes   uint64  `json:"capacity"`        // of up chunkservers
	DegradedStripes uint64  `json:"degraded"`        // as of the last repair scan
	LostStripes     uint64  `json:"lost"`            // as of the last repair scan
	ChunkserversUp  int     `json:"chunkservers_up"` // reporting heartbeats
}

// counters are the cumulative values rates are computed from.
type counters struct {
	at             time.Time
	ops, commits   float64
	scrubBytes     uint64
	haveMetaCounts bool
}

// New returns a dashboard; Run must run for its history to fill.
func New(cfg Config) *Dashboard {
	if cfg.Interval <= 0 {
		cfg.Interval = 10 * time.Second
	}
	if cfg.History <= 0 {
		cfg.History = time.Hour
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Dashboard{cfg: cfg}
}

// Run samples the cluster every interval, the first time at once, until
// ctx ends.
func (d *Dashboard) Run(ctx context.Context) {
	t := time.NewTicker(d.cfg.Interval)
	defer t.Stop()
	for {
		d.sample(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// sample adds a point to the history; a standby's or a failed Status adds
// none.
func (d *Dashboard) sample(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, d.cfg.Interval)
	defer cancel()
	st, err := d.cfg.Status(ctx)
	if err != nil {
		if !errors.Is(err, ErrStandby) && ctx.Err() == nil {
			d.cfg.Logger.Warn("dashboard: status", "err", err)
		}
		return
	}
	now := d.cfg.Now()
	cur := &counters{at: now, scrubBytes: st.GetScrub().GetBytesTotal()}
	cur.ops, cur.commits, cur.haveMetaCounts = d.metaCounts()
	s := Sample{UnixMs: now.UnixMilli(), RepairBytesSec: st.GetRepair().GetBytesPerSecond(),
		RelayoutBytes: st.GetRelayout().GetBytesPerSecond(), DegradedStripes: st.GetRepair().GetDegradedStripes(),
		LostStripes: st.GetRepair().GetLostStripes()}
	for _, cs := range st.Chunkservers {
		if cs.Up {
			s.ChunkserversUp++
			s.UsedBytes += cs.Used
			s.CapacityBytes += cs.Capacity
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if p := d.prev; p != nil {
		if dt := now.Sub(p.at).Seconds(); dt > 0 {
			if cur.haveMetaCounts && p.haveMetaCounts && cur.ops >= p.ops {
				s.MetaOpsPerSec = (cur.ops - p.ops) / dt
				s.CommitsPerSec = (cur.commits - p.commits) / dt
			}
			if cur.scrubBytes >= p.scrubBytes {
				s.ScrubBytesSec = float64(cur.scrubBytes-p.scrubBytes) / dt
			}
		}
	}
	d.prev = cur
	d.samples = append(d.samples, s)
	if keep := int(d.cfg.History / d.cfg.Interval); len(d.samples) > keep {
		d.samples = append(d.samples[:0], d.samples[len(d.samples)-keep:]...)
	}
}

// metaCounts sums rdmafs_meta_ops_total: all RPCs, and CommitStripes'.
func (d *Dashboard) metaCounts() (ops, commits float64, ok bool) {
	if d.cfg.Gatherer == nil {
		return 0, 0, false
	}
	fams, err := d.cfg.Gatherer.Gather()
	if err != nil {
		return 0, 0, false
	}
	for _, f := range fams {
		if f.GetName() != "rdmafs_meta_ops_total" {
			continue
		}
		for _, m := range f.Metric {
			v := m.GetCounter().GetValue()
			ops += v
			for _, l := range m.Label {
				if l.GetName() == "method" && l.GetValue() == "CommitStripes" {
					commits += v
				}
			}
		}
		break
	}
	return ops, commits, true // none yet when no call has been answered
}

// Handler returns the dashboard's routes ("/", "/static/", "/api/status"),
// behind the secret when one is set.
func (d *Dashboard) Handler() http.Handler {
	mux := http.NewServeMux()
	sub, err := fs.Sub(static, "static")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	files := http.FileServerFS(sub)
	mux.Handle("GET /static/", http.StripPrefix("/static/", files))
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:")
		http.ServeFileFS(w, r, sub, "index.html")
	})
	mux.HandleFunc("GET /api/status", d.serveStatus)
	return d.authorize(mux)
}

// status is the JSON of /api/status.
type status struct {
	Role       string          `json:"role"` // "leader" (serving) or "standby"
	NowMs      int64           `json:"now_ms"`
	IntervalMs int64           `json:"interval_ms"`
	Status     json.RawMessage `json:"status,omitempty"` // metapb.StatusReply, proto field names
	History    []Sample        `json:"history"`
	Error      string          `json:"error,omitempty"`
}

func (d *Dashboard) serveStatus(w http.ResponseWriter, r *http.Request) {
	out := status{Role: "leader", NowMs: d.cfg.Now().UnixMilli(), IntervalMs: d.cfg.Interval.Milliseconds()}
	st, err := d.cfg.Status(r.Context())
	switch {
	case errors.Is(err, ErrStandby):
		out.Role = "standby"
	case err != nil:
		out.Error = err.Error()
	default:
		b, err := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}.Marshal(st)
		if err != nil {
			http.Error(w, "dashboard: encode status: "+err.Error(), http.StatusInternalServerError)
			return
		}
		out.Status = b
	}
	d.mu.Lock()
	out.History = append([]Sample(nil), d.samples...)
	d.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	if err := json.NewEncoder(w).Encode(out); err != nil {
		d.cfg.Logger.Debug("dashboard: write status", "err", err)
	}
}

// authorize passes requests that present the secret (basic authentication,
// any user) or a verified TLS client certificate; it asks the others for
// credentials.
func (d *Dashboard) authorize(h http.Handler) http.Handler {
	if d.cfg.Secret == "" {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS != nil && len(r.TLS.VerifiedChains) > 0 {
			h.ServeHTTP(w, r)
			return
		}
		if _, pw, ok := r.BasicAuth(); ok && subtle.ConstantTimeCompare([]byte(pw), []byte(d.cfg.Secret)) == 1 {
			h.ServeHTTP(w, r)
			return
		}
		w.Header().Set("WWW-Authenticate", `Basic realm="rdmafs dashboard: the cluster secret is the password"`)
		http.Error(w, "the rdmafs dashboard needs the cluster secret as the password (any user name)", http.StatusUnauthorized)
	})
}
