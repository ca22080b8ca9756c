package stripe

import (
	"fmt"
	"sync"

	"github.com/klauspost/reedsolomon"
)

// Codecs hands out one Reed-Solomon encoder per code (k data, m parity
// shards), built on first use and shared: reedsolomon's encoders are safe
// for concurrent use. The zero Codecs is ready; it is safe for concurrent use.
type Codecs struct {
	mu  sync.Mutex
	enc map[[2]int]reedsolomon.Encoder
}

// Get returns the encoder of the k+m code; m = 0 (no parity) returns a nil
// encoder and no error. (With k = 1 the parity shards are copies, which
// callers usually make without the encoder.)
func (c *Codecs) Get(k, m int) (reedsolomon.Encoder, error) {
	if m == 0 {
		return nil, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if enc, ok := c.enc[[2]int{k, m}]; ok {
		return enc, nil
	}
	enc, err := reedsolomon.New(k, m)
	if err != nil {
		return nil, fmt.Errorf("stripe: %d+%d code: %w", k, m, err)
	}
	if c.enc == nil {
		c.enc = map[[2]int]reedsolomon.Encoder{}
	}
	c.enc[[2]int{k, m}] = enc
	return enc, nil
}
