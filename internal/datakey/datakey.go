// Package datakey derives the key with which the holder of a mount token
// authenticates to chunkd: meta's token issuer and chunkd's handshake both
// derive it from the cluster secret, so chunkd checks a token's connection
// without asking meta, and the mount never holds the secret.
package datakey

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
)

// Size is the length of a data key.
const Size = sha256.Size

// ForToken returns the data key of the mount token with id and read-only
// bit readOnly under the cluster secret: HMAC-SHA256 of a label, the id and
// the bit, so that a key made for a read-only token does not authenticate
// a connection that claims write access.
func ForToken(secret []byte, id [8]byte, readOnly bool) []byte {
	h := hmac.New(sha256.New, secret)
	h.Write([]byte("rdmafs mount token data key\x00"))
	h.Write(id[:])
	if readOnly {
		h.Write([]byte{1})
	} else {
		h.Write([]byte{0})
	}
	return h.Sum(nil)
}

// CapabilitySize is the length of a chunk capability.
const CapabilitySize = 16

// Capability returns the capability meta gives the holder of mount token id
// for one chunk: HMAC-SHA256 under the cluster secret of a label, the token
// id, the chunk id and whether it allows writing, cut to CapabilitySize
// bytes. chunkd serves a token's connection only the chunks it presented a
// capability for, so that the token's holder reaches no chunk of a file
// outside its subdirectory by guessing chunk ids.
func Capability(secret []byte, id [8]byte, chunk uint64, write bool) []byte {
	h := hmac.New(sha256.New, secret)
	h.Write([]byte("rdmafs chunk capability\x00"))
	h.Write(id[:])
	var b [9]byte
	binary.LittleEndian.PutUint64(b[:8], chunk)
	if write {
		b[8] = 1
	}
	h.Write(b[:])
	return h.Sum(nil)[:CapabilitySize]
}
