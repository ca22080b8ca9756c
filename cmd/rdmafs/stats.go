package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/rdmafs/rdmafs/fs"
	"github.com/rdmafs/rdmafs/meta/auth"
)

// newStatsCommand is `rdmafs stats ADDR`: a live view of a process's
// throughput, operations per second and latency, from its metrics endpoint.
func newStatsCommand() *cobra.Command {
	var interval time.Duration
	var count int
	var asJSON bool
	var tlsFiles auth.TLSFiles
	cmd := &cobra.Command{
		Use:   "stats MOUNTPOINT|ADDR",
		Short: "Live operations per second, bytes per second and latency of a mount, meta server or chunkd",
		Long: "Reads the Prometheus metrics of a mount (MOUNTPOINT, or any directory in it: the mount serves its\n" +
			"metrics on a port of 127.0.0.1 unless started with --metrics off) or of the process serving them\n" +
			"at ADDR (its --metrics or --http address) every --interval and prints, for each counter that\n" +
			"moved, its rate, and for each latency histogram the operations per second and their mean latency\n" +
			"over the interval, like iostat: the mount's FUSE requests by operation, bytes read and written\n" +
			"and transfers by opcode, meta's operations, chunkd's requests and bytes. --json prints one sample.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			url, err := metricsURL(args[0])
			if err != nil {
				return err
			}
			tc, err := tlsFiles.ClientConfig()
			if err != nil {
				return fmt.Errorf("stats: %w", err)
			}
			hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: tc}}
			if !strings.Contains(url, "://") {
				url = "http://" + url
				if tc != nil {
					url = "https://" + strings.TrimPrefix(url, "http://")
				}
			}
			url = strings.TrimSuffix(url, "/") + "/metrics"
			ctx := cmd.Context()
			prev, err := scrape(ctx, hc, url)
			if err != nil {
				return err
			}
			if asJSON {
				count = 1
			}
			for i := 0; count <= 0 || i < count; i++ {
				start := time.Now()
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(interval):
				}
				cur, err := scrape(ctx, hc, url)
				if err != nil {
					return err
				}
				rows := statRows(prev, cur, time.Since(start))
				prev = cur
				if asJSON {
					enc := json.NewEncoder(cmd.OutOrStdout())
					enc.SetIndent("", "  ")
					return enc.Encode(rows)
				}
				printStats(cmd.OutOrStdout(), rows)
			}
			return nil
		},
	}
	cmd.Flags().DurationVar(&interval, "interval", time.Second, "time between samples")
	cmd.Flags().IntVar(&count, "count", 0, "samples to print (0: until interrupted)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one sample as JSON and exit")
	tlsFiles.Register(cmd.Flags(), false) // a meta server with TLS serves its metrics over HTTPS
	return cmd
}

// metricsURL returns target's metrics address: a mount's (the value of
// fs.MetricsXattr) when target is a directory, else target itself.
func metricsURL(target string) (string, error) {
	st, err := os.Stat(target)
	if err != nil || !st.IsDir() {
		return target, nil
	}
	buf := make([]byte, 256)
	n, err := unix.Getxattr(target, fs.MetricsXattr, buf)
	switch {
	case errors.Is(err, unix.ENODATA):
		return "", fmt.Errorf("stats: the mount at %s serves no metrics (mounted with --metrics off)", target)
	case errors.Is(err, unix.ENOTSUP):
		return "", fmt.Errorf("stats: %s is not in an rdmafs mount (a mount point, or give a metrics address host:port)", target)
	case err != nil:
		return "", fmt.Errorf("stats: %s: %w", target, err)
	}
	return string(buf[:n]), nil
}

// statRow is one line of `rdmafs stats`: a counter's rate, or a
// histogram's rate and mean over the interval.
type statRow struct {
	Metric  string  `json:"metric"`
	Labels  string  `json:"labels,omitempty"`
	PerSec  float64 `json:"per_second"`
	MeanSec float64 `json:"mean_seconds,omitempty"` // histograms of durations
}

// sample is one scrape: each series' value (counters) or count and sum
// (histograms), by metric name and labels.
type sample map[string]map[string][2]float64

// scrape reads url's metrics in the text format.
func scrape(ctx context.Context, hc *http.Client, url string) (sample, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("stats: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("stats: %s: %s: %s", url, resp.Status, b)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("stats: %s: %w", url, err)
	}
	out := sample{}
	for name, f := range fams {
		series := map[string][2]float64{}
		for _, m := range f.Metric {
			key := labelString(m.Label)
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				series[key] = [2]float64{m.GetCounter().GetValue()}
			case dto.MetricType_HISTOGRAM:
				h := m.GetHistogram()
				series[key] = [2]float64{float64(h.GetSampleCount()), h.GetSampleSum()}
			default:
				continue
			}
		}
		if len(series) > 0 {
			out[name] = series
		}
	}
	return out, nil
}

func labelString(ls []*dto.LabelPair) string {
	parts := make([]string, 0, len(ls))
	for _, l := range ls {
		parts = append(parts, l.GetName()+"="+l.GetValue())
	}
	return strings.Join(parts, ",")
}

// statRows returns the series that moved between two samples d apart,
// the busiest first; the Go runtime's and the process's own are left out.
func statRows(prev, cur sample, d time.Duration) []statRow {
	var rows []statRow
	for name, series := range cur {
		if strings.HasPrefix(name, "go_") || strings.HasPrefix(name, "process_") || strings.HasPrefix(name, "promhttp_") {
			continue
		}
		for labels, v := range series {
			p := prev[name][labels]
			delta := v[0] - p[0]
			if delta <= 0 {
				continue
			}
			r := statRow{Metric: name, Labels: labels, PerSec: delta / d.Seconds()}
			if strings.HasSuffix(name, "_seconds") {
				r.MeanSec = (v[1] - p[1]) / delta
			}
			rows = append(rows, r)
		}
	}
	sort.Slice(rows, func(i, j int) bool {
		if rows[i].PerSec != rows[j].PerSec {
			return rows[i].PerSec > rows[j].PerSec
		}
		return rows[i].Metric+rows[i].Labels < rows[j].Metric+rows[j].Labels
	})
	return rows
}

// printStats prints one sample as a table: bytes as bytes per second,
// latency histograms with their mean.
func printStats(w io.Writer, rows []statRow) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "%s\tRATE\tMEAN\tLABELS\n", time.Now().Format("15:04:05"))
	for _, r := range rows {
		rate := fmt.Sprintf("%.1f/s", r.PerSec)
		if strings.Contains(r.Metric, "bytes") {
			rate = humanBytes(uint64(r.PerSec)) + "/s"
		}
		mean := ""
		if r.MeanSec > 0 {
			mean = time.Duration(r.MeanSec * float64(time.Second)).Round(time.Microsecond).String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.Metric, rate, mean, r.Labels)
	}
	if len(rows) == 0 {
		fmt.Fprintln(tw, "(idle)")
	}
	tw.Flush()
	fmt.Fprintln(w)
}
