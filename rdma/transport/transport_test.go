package transport_test

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/rdmafs/rdmafs/rdma"
	"github.com/rdmafs/rdmafs/rdma/rdmatest"
	"github.com/rdmafs/rdmafs/rdma/transport"
)

// TestAuto runs the conformance suite on the auto device and checks that a peer
// on this host is reached through shared memory, and that the choice is logged.
func TestAuto(t *testing.T) {
	var log bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&log, nil))
	open := func(t testing.TB) rdma.Device {
		d, err := transport.Open("auto", logger)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	rdmatest.Run(t, open, rdmatest.Options{})
	if !strings.Contains(log.String(), "transport=shm") {
		t.Fatalf("auto did not choose shm for a local peer; log:\n%s", log.String())
	}
}

func TestOpenUnknown(t *testing.T) {
	if _, err := transport.Open("carrier-pigeon", nil); err == nil || !strings.Contains(err.Error(), "tcp") {
		t.Fatalf("unknown transport: %v, want an error listing the transports", err)
	}
}
