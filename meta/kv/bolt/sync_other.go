//go:build !linux

package bolt

import "os"

// fdatasync makes f's data durable (fsync where fdatasync is not available).
func fdatasync(f *os.File) error { return f.Sync() }
