package client

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rdmafs/rdmafs/rdma"
)

// WireOp is a kind of work request a connection posts.
type WireOp int

// The kinds of work requests, the opcode label of the transport metrics.
const (
	WireSend      WireOp = iota // a control message (requests to chunkd)
	WireRDMARead                // a one-sided read of a chunkserver's memory
	WireRDMAWrite               // a one-sided write into a chunkserver's staging memory
	NumWireOps
)

// String returns the opcode's metric label: send, rdma_read or rdma_write.
func (o WireOp) String() string {
	switch o {
	case WireSend:
		return "send"
	case WireRDMARead:
		return "rdma_read"
	case WireRDMAWrite:
		return "rdma_write"
	}
	return "unknown"
}

// WireStats count what connections put on the wire, by kind of work
// request: operations posted, their bytes, and those that failed (posting
// failed, or the operation completed in error or was abandoned). One
// WireStats may be shared by all the connections of a pool; it is safe for
// concurrent use and counting allocates nothing.
type WireStats struct {
	Ops, Bytes, Errors [NumWireOps]atomic.Uint64
}

func (s *WireStats) posted(op WireOp, n int) {
	if s != nil {
		s.Ops[op].Add(1)
		s.Bytes[op].Add(uint64(n))
	}
}

func (s *WireStats) failed(op WireOp) {
	if s != nil {
		s.Errors[op].Add(1)
	}
}

// wireOp is the kind of a one-sided operation's opcode.
func wireOp(opcode rdma.Opcode) WireOp {
	if opcode == rdma.OpRDMAWrite {
		return WireRDMAWrite
	}
	return WireRDMARead
}

// Collector returns a Prometheus collector of s, the rdmafs_rdma_* counters
// by opcode, labelled with the transport's name.
func (s *WireStats) Collector(transport string) prometheus.Collector {
	return wireCollector{s: s, transport: transport,
		ops: prometheus.NewDesc("rdmafs_rdma_operations_total",
			"Work requests posted to chunkservers, by opcode (send: control messages; rdma_read, rdma_write: one-sided data transfers).", []string{"transport", "opcode"}, nil),
		bytes: prometheus.NewDesc("rdmafs_rdma_bytes_total",
			"Bytes of the work requests posted to chunkservers, by opcode.", []string{"transport", "opcode"}, nil),
		errors: prometheus.NewDesc("rdmafs_rdma_errors_total",
			"Work requests that could not be posted, completed in error or were abandoned, by opcode.", []string{"transport", "opcode"}, nil)}
}

type wireCollector struct {
	s                  *WireStats
	transport          string
	ops, bytes, errors *prometheus.Desc
}

// Describe implements prometheus.Collector.
func (c wireCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.ops
	ch <- c.bytes
	ch <- c.errors
}

// Collect implements prometheus.Collector.
func (c wireCollector) Collect(ch chan<- prometheus.Metric) {
	for op := range NumWireOps {
		label := op.String()
		ch <- prometheus.MustNewConstMetric(c.ops, prometheus.CounterValue, float64(c.s.Ops[op].Load()), c.transport, label)
		ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.CounterValue, float64(c.s.Bytes[op].Load()), c.transport, label)
		ch <- prometheus.MustNewConstMetric(c.errors, prometheus.CounterValue, float64(c.s.Errors[op].Load()), c.transport, label)
	}
}
