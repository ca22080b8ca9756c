//go:build verbs

package transport

import (
	"github.com/rdmafs/rdmafs/rdma"
	"github.com/rdmafs/rdmafs/rdma/verbs"
)

const verbsBuilt = true

func openVerbs() (rdma.Device, error) { return verbs.Open(verbs.Options{}) }
