// Package transport opens an rdma device by transport name, so that commands can
// take a --transport flag without knowing each transport's package.
package transport

import (
	"fmt"
	"strings"

	"github.com/rdmafs/rdmafs/rdma"
	"github.com/rdmafs/rdmafs/rdma/tcp"
)

// Names lists the transports this build can open.
func Names() []string { return []string{"tcp"} }

// Open opens a device of the named transport.
func Open(name string) (rdma.Device, error) {
	switch name {
	case "tcp", "":
		return tcp.Open(tcp.Options{})
	}
	return nil, fmt.Errorf("rdma transport %q: unknown (this build has %s)", name, strings.Join(Names(), ", "))
}
