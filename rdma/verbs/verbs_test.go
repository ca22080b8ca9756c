//go:build verbs

package verbs_test

import (
	"errors"
	"testing"

	"github.com/rdmafs/rdmafs/rdma"
	"github.com/rdmafs/rdmafs/rdma/rdmatest"
	"github.com/rdmafs/rdmafs/rdma/verbs"
)

// TestConformance runs the transport conformance suite on the first RDMA device.
// Without one (no NIC, no Soft-RoCE) it skips, saying why.
func TestConformance(t *testing.T) {
	d, err := verbs.Open(verbs.Options{})
	if errors.Is(err, verbs.ErrNoDevice) {
		t.Skip("verbs: ibv_get_device_list found no RDMA device; to run this suite without a NIC, " +
			"load Soft-RoCE: `rdma link add rxe0 type rxe netdev <iface>`")
	}
	if err != nil {
		t.Fatal(err)
	}
	d.Close()
	open := func(t testing.TB) rdma.Device {
		d, err := verbs.Open(verbs.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	rdmatest.Run(t, open, rdmatest.Options{})
}
