//go:build unix

package ec

import (
	"runtime"
	"syscall"
)

// newZero returns a read-only buffer of n zero bytes. On unix it is an
// anonymous read-only mapping: every page is the kernel's shared zero page, so
// it costs no memory however large the unit, stays hot in the CPU caches, and a
// stray write faults instead of corrupting parity. The mapping is released
// when owner becomes unreachable.
func newZero(owner *Codec, n int) []byte {
	b, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		return make([]byte, min(n, zeroBufLen))
	}
	runtime.AddCleanup(owner, func(b []byte) { _ = syscall.Munmap(b) }, b)
	return b
}
