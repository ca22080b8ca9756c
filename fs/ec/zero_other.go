//go:build !unix

package ec

// newZero returns a buffer of zeros for padding, at most zeroBufLen bytes:
// longer padding is coded in pieces.
func newZero(_ *Codec, n int) []byte { return make([]byte, min(n, zeroBufLen)) }
