// Package chunk names chunk versions: the identifiers chunkd, its clients and the
// metadata service share.
package chunk

import "fmt"

// ID identifies a chunk; the metadata service allocates them.
type ID = uint64

// Version numbers the successive contents of a chunk. A new version never
// overwrites an existing one.
type Version = uint64

// Key is one version of one chunk.
type Key struct {
	Chunk   ID
	Version Version
}

// String formats k as chunk@version in hexadecimal, as it appears in file names.
func (k Key) String() string { return fmt.Sprintf("%016x@%x", k.Chunk, k.Version) }

// Info describes a stored chunk version.
type Info struct {
	Key
	Length uint32 // bytes of data
	CRC    uint32 // CRC32C (Castagnoli) of the data
}
