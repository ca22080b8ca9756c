package fs

import "syscall"

// MetricsXattr is the virtual extended attribute, on every file and
// directory of a mount, whose value is the host:port the mount serves its
// Prometheus metrics on (`rdmafs stats MOUNTPOINT` reads it). It is absent
// (ENODATA) when the mount serves no metrics. Like the other rdmafs.*
// attributes it is not listed.
const MetricsXattr = "rdmafs.metrics"

func (n *Node) metricsXattr(dest []byte) (uint32, syscall.Errno) {
	v := n.fsys.opts.MetricsAddr
	if v == "" {
		return 0, syscall.ENODATA
	}
	if len(dest) < len(v) {
		return uint32(len(v)), syscall.ERANGE
	}
	return uint32(copy(dest, v)), 0
}
