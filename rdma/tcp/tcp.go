// Package tcp is software RDMA over TCP, the transport that runs anywhere: the role
// soft-iWARP plays in the kernel, in user space. Each queue pair is one TCP
// connection. The target's engine executes RDMA_READ and RDMA_WRITE against its
// table of registered memory — key, protection domain, window binding, access rights
// and bounds checked — without calling into the application; payloads are gathered
// from the SGEs with writev and received straight into the target memory.
//
// Errors follow verbs and iWARP: a request the target refuses completes on the
// initiator with the target's status (REM_ACCESS_ERR, REM_INV_REQ_ERR,
// RNR_RETRY_EXC_ERR, ...), and the connection terminates, moving both queue pairs to
// ERR and flushing what was outstanding with WR_FLUSH_ERR.
package tcp

import (
	"time"

	"github.com/rdmafs/rdmafs/rdma"
	"github.com/rdmafs/rdmafs/rdma/internal/stream"
)

// Options configure the transport.
type Options struct {
	// HandshakeTimeout bounds connection setup when the context sets no deadline
	// (default 10s).
	HandshakeTimeout time.Duration
}

// Open opens a tcp transport device.
func Open(opts Options) (rdma.Device, error) {
	return stream.Open(stream.Options{Name: "tcp", Mode: stream.ModeTCP, HandshakeTimeout: opts.HandshakeTimeout})
}
