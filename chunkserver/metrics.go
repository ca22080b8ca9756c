package chunkserver

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are chunkd's Prometheus metrics. Create them with NewMetrics on the
// registry the metrics endpoint serves.
type Metrics struct {
	BytesRead     prometheus.Counter     // bytes loaded from disk into memory
	BytesWritten  prometheus.Counter     // bytes committed durably
	LeaseBytes    prometheus.Counter     // bytes granted through read leases
	Ops           *prometheus.CounterVec // requests by op and status
	Latency       *prometheus.HistogramVec
	Leases        prometheus.Gauge // live read leases
	Staging       prometheus.Gauge // live staging grants
	StagingBytes  prometheus.Gauge
	ResidentBytes prometheus.Gauge // bytes of resident versions
	Connections   prometheus.Gauge
	Errors        *prometheus.CounterVec // by kind
	Evictions     prometheus.Counter
	Revocations   prometheus.Counter // rkeys revoked at expiry, release or commit
	StoredBytes   prometheus.Gauge
	StoredVersion prometheus.Gauge
	// Repair: shards rebuilt for the metadata service.
	Repairs         *prometheus.CounterVec // tasks by result (done, failed)
	RepairBytes     prometheus.Counter     // bytes of shards rebuilt and stored
	RepairReadBytes prometheus.Counter     // bytes read from other chunkservers for repair
	RepairSeconds   prometheus.Histogram   // time to rebuild one shard
	// Scrub: stored versions read back and checked.
	ScrubBytes    prometheus.Counter // bytes verified
	ScrubErrors   prometheus.Counter // versions found corrupt or missing
	ScrubLastPass prometheus.Gauge   // when the last full pass finished (unix seconds)
}

// NewMetrics creates the metrics and registers them with reg (which may be nil).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	const ns, sub = "rdmafs", "chunkd"
	m := &Metrics{
		BytesRead:       prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "disk_read_bytes_total", Help: "Bytes of chunk data read from disk into registered memory."}),
		BytesWritten:    prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "disk_written_bytes_total", Help: "Bytes of chunk data committed durably."}),
		LeaseBytes:      prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "leased_bytes_total", Help: "Bytes of chunk data granted through new read leases."}),
		Ops:             prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "requests_total", Help: "Chunk protocol requests by operation and status."}, []string{"op", "status"}),
		Latency:         prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "request_seconds", Help: "Time to serve a chunk protocol request.", Buckets: prometheus.ExponentialBuckets(10e-6, 4, 10)}, []string{"op"}),
		Leases:          prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "leases", Help: "Live read leases."}),
		Staging:         prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "staging_grants", Help: "Live write staging grants."}),
		StagingBytes:    prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "staging_bytes", Help: "Registered memory held by write staging."}),
		ResidentBytes:   prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "resident_bytes", Help: "Registered memory held by resident chunk versions."}),
		Connections:     prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "connections", Help: "Connected clients."}),
		Errors:          prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "errors_total", Help: "Errors by kind."}, []string{"kind"}),
		Evictions:       prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "evictions_total", Help: "Resident versions evicted from memory."}),
		Revocations:     prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "revocations_total", Help: "Memory windows invalidated."}),
		StoredBytes:     prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "stored_bytes", Help: "Bytes of stored chunk versions on disk."}),
		StoredVersion:   prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "stored_versions", Help: "Stored chunk versions on disk."}),
		Repairs:         prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "repairs_total", Help: "Repair tasks by result."}, []string{"result"}),
		RepairBytes:     prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "repair_rebuilt_bytes_total", Help: "Bytes of shards rebuilt (or moved) and stored durably."}),
		RepairReadBytes: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "repair_read_bytes_total", Help: "Bytes read with RDMA_READ from other chunkservers for repair."}),
		RepairSeconds:   prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "repair_seconds", Help: "Time to rebuild and store one shard.", Buckets: prometheus.ExponentialBuckets(1e-3, 2, 14)}),
		ScrubBytes:      prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "scrub_verified_bytes_total", Help: "Bytes of stored chunk versions read back from disk and checked by scrubbing."}),
		ScrubErrors:     prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "scrub_corrupt_total", Help: "Stored chunk versions scrubbing found corrupt or missing."}),
		ScrubLastPass:   prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "scrub_last_pass_timestamp_seconds", Help: "When the last full scrub pass finished (unix time)."}),
	}
	// Every kind's series exists from the start, at zero, so that rates
	// and alerts over them work before the first error.
	for _, kind := range []string{"protocol", "checksum", "nospace", "auth", "bind", "busy", "clone", "commit", "lease",
		"patch", "patch base", "prepare", "shutdown", "staging", "corrupt"} {
		m.Errors.WithLabelValues(kind)
	}
	if reg != nil {
		reg.MustRegister(m.BytesRead, m.BytesWritten, m.LeaseBytes, m.Ops, m.Latency, m.Leases, m.Staging,
			m.StagingBytes, m.ResidentBytes, m.Connections, m.Errors, m.Evictions, m.Revocations, m.StoredBytes, m.StoredVersion,
			m.Repairs, m.RepairBytes, m.RepairReadBytes, m.RepairSeconds, m.ScrubBytes, m.ScrubErrors, m.ScrubLastPass)
	}
	return m
}
