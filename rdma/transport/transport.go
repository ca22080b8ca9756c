// Package transport opens an rdma device by transport name, so that commands can
// take a --transport flag without knowing each transport's package.
package transport

import (
	"fmt"
	"log/slog"
	"strings"

	"github.com/rdmafs/rdmafs/rdma"
	"github.com/rdmafs/rdmafs/rdma/internal/stream"
	"github.com/rdmafs/rdmafs/rdma/shm"
	"github.com/rdmafs/rdmafs/rdma/tcp"
)

// Names lists the transports this build can open.
func Names() []string {
	names := []string{"auto", "tcp", "shm"}
	if verbsBuilt {
		names = append(names, "verbs")
	}
	return names
}

// Open opens a device of the named transport:
//   - "tcp": software RDMA over TCP, anywhere;
//   - "shm": same-host peers through shared memory;
//   - "verbs": an RDMA NIC through libibverbs (builds with the verbs tag);
//   - "auto": verbs where built and a device exists; otherwise a device that
//     listens on both TCP and shared memory and, per connection, uses shared memory
//     when the peer is on this host and TCP otherwise. Choices are logged once
//     per peer to logger (nil: not logged).
func Open(name string, logger *slog.Logger) (rdma.Device, error) {
	switch name {
	case "tcp":
		return tcp.Open(tcp.Options{})
	case "shm":
		return shm.Open(shm.Options{})
	case "verbs":
		return openVerbs()
	case "auto", "":
		if verbsBuilt {
			if dev, err := openVerbs(); err == nil {
				if logger != nil {
					logger.Info("rdma transport chosen", "transport", "verbs")
				}
				return dev, nil
			}
		}
		return stream.Open(stream.Options{Name: "auto", Mode: stream.ModeAuto, Logger: logger})
	}
	return nil, fmt.Errorf("rdma transport %q: unknown (this build has %s)", name, strings.Join(Names(), ", "))
}
