// Package bytesize parses sizes written for people, as the commands' flags take
// them: 4096, 64KiB, 16 MiB, 4G, 1t.
package bytesize

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

var units = map[string]int64{"": 1, "b": 1,
	"k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10,
	"m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20,
	"g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30,
	"t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40}

// Parse parses a non-negative number of bytes with an optional unit, powers of
// 1024 whatever the spelling (K, KB, KiB, ... T), case-insensitive.
func Parse(s string) (int64, error) {
	s = strings.TrimSpace(s)
	num := strings.TrimRightFunc(s, func(r rune) bool { return r < '0' || r > '9' })
	unit := strings.ToLower(strings.TrimSpace(s[len(num):]))
	n, err := strconv.ParseInt(num, 10, 64)
	if err == nil && n < 0 {
		err = strconv.ErrRange
	}
	if err != nil {
		return 0, fmt.Errorf("size %q: %w", s, err)
	}
	mult, ok := units[unit]
	if !ok {
		return 0, fmt.Errorf("size %q: unknown unit %q (want B, KiB, MiB, GiB or TiB)", s, unit)
	}
	if n > math.MaxInt64/mult {
		return 0, fmt.Errorf("size %q: %w", s, strconv.ErrRange)
	}
	return n * mult, nil
}
