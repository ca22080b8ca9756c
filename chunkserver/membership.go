package chunkserver

import (
	"context"
	"time"

	"github.com/rdmafs/rdmafs/chunkserver/chunk"
)

// Membership is chunkd's view of the metadata service: it registers the chunkserver
// and then sends heartbeats, whose replies name the chunk versions chunkd should
// delete; the next heartbeat reports which of them are gone. A nil Membership runs
// chunkd standalone. The metadata service's gRPC client implements it (Register
// and Heartbeat of metapb map field for field).
type Membership interface {
	// Register announces the chunkserver; chunkd calls it at start and again
	// whenever a heartbeat fails with ErrNotRegistered.
	Register(ctx context.Context, info Info) error
	// Heartbeat reports the chunkserver's state, including the versions deleted
	// since the last successful heartbeat, and returns the versions metadata no
	// longer references (garbage) for chunkd to delete and the scrub schedule.
	// It returns an error wrapping ErrNotRegistered when the service does not
	// know the chunkserver.
	Heartbeat(ctx context.Context, stats Stats) (HeartbeatReply, error)
	// Inventory sends part of the list of stored versions taken at taken
	// (after a scrub pass); last marks the list complete.
	Inventory(ctx context.Context, id string, taken time.Time, versions []chunk.Key, last bool) error
}

// HeartbeatReply is what the metadata service answers a heartbeat.
type HeartbeatReply struct {
	// Garbage lists versions no stripe references: chunkd deletes them.
	Garbage []chunk.Key
	// ScrubInterval spreads a scrub pass over this long (0: no scrubbing);
	// ScrubRequested asks for a pass now unless one started after it.
	ScrubInterval  time.Duration
	ScrubRequested time.Time
}

// Info describes a chunkserver to the metadata service.
type Info struct {
	ID        string // stable id kept in the data dir
	Addr      string // address clients connect to
	Transport string // rdma transport it serves ("tcp", "auto", ...)
	Zone      string // failure-domain label
	Capacity  int64  // bytes of disk offered for chunks: the file system's size (or the configured capacity, if smaller) less the reserve
	// Used is the bytes of Capacity not free for new shards (stored versions,
	// writes in progress, other files on the disk): the metadata service takes
	// Capacity − Used as the free space until the first heartbeat.
	Used      int64
	MaxLength int // largest chunk version accepted
}

// Stats is what a heartbeat reports.
type Stats struct {
	ID            string
	Capacity      int64   // bytes offered for chunks, as in Info
	Free          int64   // bytes free for new shards: free space plus kept slots, less the reserve
	Used          int64   // bytes held by stored versions
	Versions      int     // stored versions
	Load          float64 // requests per second since the last heartbeat
	Connections   int
	ResidentBytes int64 // registered memory held by resident versions
	MemInUse      int64 // registered memory in use: resident, staging, message buffers
	Leases        int
	// Deleted lists the garbage versions deleted (or found absent) since the
	// last successful heartbeat.
	Deleted []chunk.Key
	// Scrub is the scrubbing's progress.
	Scrub ScrubProgress
}
