// Package datakey derives the key with which the holder of a mount token
// authenticates to chunkd: meta's token issuer and chunkd's handshake both
// derive it from the cluster secret, so chunkd checks a token's connection
// without asking meta, and the mount never holds the secret.
package datakey

import (
	"crypto/hmac"
	"crypto/sha256"
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
