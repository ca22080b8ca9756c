package shm_test

import (
	"testing"

	"github.com/rdmafs/rdmafs/rdma"
	"github.com/rdmafs/rdmafs/rdma/rdmatest"
	"github.com/rdmafs/rdmafs/rdma/shm"
)

func open(t testing.TB) rdma.Device {
	d, err := shm.Open(shm.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestConformance(t *testing.T) {
	rdmatest.Run(t, open, rdmatest.Options{})
}
