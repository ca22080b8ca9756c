//go:build !verbs

package transport

import (
	"errors"

	"github.com/rdmafs/rdmafs/rdma"
)

const verbsBuilt = false

func openVerbs() (rdma.Device, error) {
	return nil, errors.New("rdma transport verbs: not in this build (build with -tags verbs)")
}
