package chunkserver

import (
	"context"

	"github.com/rdmafs/rdmafs/chunkserver/chunk"
)

// Membership is chunkd's view of the metadata service: it registers the chunkserver
// once and then sends heartbeats, whose replies name the chunk versions chunkd may
// delete. A nil Membership runs chunkd standalone.
type Membership interface {
	// Register announces the chunkserver; chunkd calls it at start and again
	// whenever a heartbeat fails with ErrNotRegistered.
	Register(ctx context.Context, info Info) error
	// Heartbeat reports the chunkserver's state and returns the versions that
	// metadata no longer references (garbage).
	Heartbeat(ctx context.Context, stats Stats) (garbage []chunk.Key, err error)
}

// Info describes a chunkserver to the metadata service.
type Info struct {
	ID        string // stable id kept in the data dir
	Addr      string // address clients connect to
	Transport string // rdma transport name ("tcp", ...)
	Zone      string // failure-domain label
	Capacity  int64  // bytes of disk for chunks
	MaxLength int    // largest chunk version accepted
}

// Stats is what a heartbeat reports.
type Stats struct {
	ID            string
	Capacity      int64 // bytes
	Free          int64 // bytes
	Used          int64 // bytes held by stored versions
	Versions      int   // stored versions
	Connections   int
	ResidentBytes int64
	Leases        int
}
