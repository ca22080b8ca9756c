package store

import (
	"fmt"
	"sync"
	"testing"

	"github.com/rdmafs/rdmafs/chunkserver/chunk"
)

// BenchmarkPut measures durable 1 MiB puts with concurrent writers.
func BenchmarkPut(b *testing.B) {
	for _, cfg := range []struct {
		w        int
		noDirect bool
	}{{1, false}, {1, true}, {4, false}, {4, true}} {
		w := cfg.w
		b.Run(fmt.Sprintf("writers=%d/direct=%v", w, !cfg.noDirect), func(b *testing.B) {
			s, err := Open(b.TempDir(), Options{Logger: quiet(), NoDirectIO: cfg.noDirect})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			data := randBytes(1, 1<<20)
			crc := Checksum(data)
			b.SetBytes(1 << 20)
			b.ResetTimer()
			var wg sync.WaitGroup
			for g := 0; g < w; g++ {
				wg.Go(func() {
					for i := g; i < b.N; i += w {
						if err := s.Put(chunk.Key{Chunk: uint64(g + 1), Version: uint64(i + 1)}, data, crc); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
		})
	}
}
