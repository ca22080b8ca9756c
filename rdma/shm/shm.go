// Package shm is the same-host transport: queue pairs run over unix sockets, and
// once the target has granted a key the initiator executes RDMA_READ and
// RDMA_WRITE itself as a bounds-, key- and rights-checked copy between its
// registered memory and the target's, which it has mapped from the memfds the
// target passed at connection setup. The target's CPU does nothing for them.
// SEND and RECV, and the first access through each key, travel over the socket.
// Deregistration, window invalidation and a closed connection revoke access.
//
// Listen("host:port") listens on the unix socket named after the port (a TCP
// port is bound only to reserve a unique number); Connect takes the same
// address, or a unix socket path or @abstract name.
package shm

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

// Open opens a shm transport device.
func Open(opts Options) (rdma.Device, error) {
	return stream.Open(stream.Options{Name: "shm", Mode: stream.ModeShm, HandshakeTimeout: opts.HandshakeTimeout})
}
