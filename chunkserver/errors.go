package chunkserver

import "github.com/rdmafs/rdmafs/chunkserver/store"

// Short names for the store's errors, as statusOf maps them.
type storeVersionError = store.VersionError

var (
	errStoreNotFound = store.ErrNotFound
	errStoreExists   = store.ErrExists
	errStoreBusy     = store.ErrBusy
	errStoreTooLong  = store.ErrTooLong
	errStoreNoSpace  = store.ErrNoSpace
	errStoreClosed   = store.ErrClosed
	checksum         = store.Checksum
)
