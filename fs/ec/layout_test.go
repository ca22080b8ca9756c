package ec

import (
	"errors"
	"strings"
	"testing"
)

func TestLayoutValidate(t *testing.T) {
	tests := []struct {
		l    Layout
		want string // "" for valid
	}{
		{DefaultLayout(), ""},
		{Layout{K: 1, M: 0, Unit: 4096}, ""},
		{Layout{K: 1, M: 2, Unit: 4096}, ""},
		{Layout{K: 8, M: 3, Unit: 64 << 20}, ""},
		{Layout{K: 16, M: 16, Unit: 1 << 20}, ""},
		{Layout{K: 0, M: 2, Unit: 4096}, "need at least 1 data shard"},
		{Layout{K: -1, M: 2, Unit: 4096}, "need at least 1 data shard"},
		{Layout{K: 4, M: -1, Unit: 4096}, "M=-1 is negative"},
		{Layout{K: 30, M: 3, Unit: 4096}, "K+M=33 shards, at most 32"},
		{Layout{K: 1 << 62, M: 1 << 62, Unit: 4096}, "at most 32"},
		{Layout{K: 4, M: 2, Unit: 0}, "unit 0 is not positive"},
		{Layout{K: 4, M: 2, Unit: -4096}, "not positive"},
		{Layout{K: 4, M: 2, Unit: 4095}, "not a multiple of 4096"},
		{Layout{K: 4, M: 2, Unit: 6000}, "not a multiple of 4096"},
		{Layout{K: 4, M: 2, Unit: 64<<20 + 4096}, "larger than 67108864"},
	}
	for _, tc := range tests {
		err := tc.l.Validate()
		if tc.want == "" {
			if err != nil {
				t.Errorf("%v: unexpected error %v", tc.l, err)
			}
			continue
		}
		if !errors.Is(err, ErrInvalidLayout) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err = %v; want ErrInvalidLayout with %q", tc.l, err, tc.want)
		}
	}
}

func TestLayoutString(t *testing.T) {
	for l, want := range map[Layout]string{
		DefaultLayout():                  "4+2/1MiB",
		{K: 8, M: 3, Unit: 64 << 10}:     "8+3/64KiB",
		{K: 1, M: 2, Unit: 4096}:         "1+2/4KiB",
		{K: 1, M: 2, Unit: 100}:          "1+2/100B",
		{K: 2, M: 1, Unit: 3 << 20}:      "2+1/3MiB",
		{K: 2, M: 1, Unit: 1<<20 + 4096}: "2+1/1028KiB",
	} {
		if got := l.String(); got != want {
			t.Errorf("%#v.String() = %q, want %q", l, got, want)
		}
	}
}

func TestLayoutGeometry(t *testing.T) {
	l := Layout{K: 4, M: 2, Unit: 4096}
	if l.StripeSize() != 16384 || l.Shards() != 6 || l.IsReplication() {
		t.Fatalf("geometry of %v wrong", l)
	}
	if !(Layout{K: 1, M: 2, Unit: 4096}).IsReplication() {
		t.Fatal("1+2 is replication")
	}
	tests := []struct {
		size, stripe     int64
		stripes, dataLen int64
	}{
		{0, 0, 0, 0},
		{1, 0, 1, 1},
		{16384, 0, 1, 16384},
		{16385, 0, 2, 16384},
		{16385, 1, 2, 1},
		{16385, 2, 2, 0},
		{5 * 16384, 4, 5, 16384},
	}
	for _, tc := range tests {
		if got := l.NumStripes(tc.size); got != tc.stripes {
			t.Errorf("NumStripes(%d) = %d, want %d", tc.size, got, tc.stripes)
		}
		if got := l.StripeDataLen(tc.size, tc.stripe); got != tc.dataLen {
			t.Errorf("StripeDataLen(%d, %d) = %d, want %d", tc.size, tc.stripe, got, tc.dataLen)
		}
	}
	lens := []struct {
		n        int64
		L        int
		dataLens [4]int
	}{
		{1, 1, [4]int{1, 0, 0, 0}},
		{4096, 4096, [4]int{4096, 0, 0, 0}},
		{4097, 4096, [4]int{4096, 1, 0, 0}},
		{3*4096 + 5, 4096, [4]int{4096, 4096, 4096, 5}},
		{16384, 4096, [4]int{4096, 4096, 4096, 4096}},
	}
	for _, tc := range lens {
		if got := l.ShardLen(tc.n); got != tc.L {
			t.Errorf("ShardLen(%d) = %d, want %d", tc.n, got, tc.L)
		}
		for i, want := range tc.dataLens {
			if got := l.DataShardLen(tc.n, i); got != want {
				t.Errorf("DataShardLen(%d, %d) = %d, want %d", tc.n, i, got, want)
			}
		}
	}
	if l.StripeOf(16383) != 0 || l.StripeOf(16384) != 1 || l.StripeStart(3) != 3*16384 {
		t.Error("StripeOf/StripeStart wrong")
	}
}

func TestStripeShards(t *testing.T) {
	l := Layout{K: 4, M: 2, Unit: 4096}
	buf := make([]byte, 6*4096)
	c, _ := NewCodec(l)
	for _, n := range []int64{1, 4096, 4097, 3*4096 + 9, 4 * 4096} {
		shards, err := l.StripeShards(make([][]byte, 0, 6), buf, n)
		if err != nil {
			t.Fatal(err)
		}
		if len(shards) != 6 {
			t.Fatalf("n=%d: %d shards", n, len(shards))
		}
		for i, s := range shards {
			want := l.ShardLen(n)
			if i < 4 {
				want = l.DataShardLen(n, i)
			}
			if len(s) != want || (want > 0 && cap(s) != 4096) || (want == 0 && s != nil) {
				t.Fatalf("n=%d shard %d: len %d cap %d, want len %d cap 4096", n, i, len(s), cap(s), want)
			}
			if want > 0 && &s[0] != &buf[i*4096] {
				t.Fatalf("n=%d shard %d: not at its unit in buf", n, i)
			}
		}
		if err := c.Encode(shards); err != nil {
			t.Fatalf("n=%d: Encode of StripeShards: %v", n, err)
		}
	}
	for _, tc := range []struct {
		buf []byte
		n   int64
	}{{buf, 0}, {buf, 4*4096 + 1}, {buf[:6*4096-1], 10}} {
		if _, err := l.StripeShards(nil, tc.buf, tc.n); !errors.Is(err, ErrRange) {
			t.Errorf("StripeShards(len %d, n %d): err = %v, want ErrRange", len(tc.buf), tc.n, err)
		}
	}
	if _, err := (Layout{}).StripeShards(nil, buf, 1); !errors.Is(err, ErrInvalidLayout) {
		t.Errorf("invalid layout: err = %v", err)
	}
	dst := make([][]byte, 0, 6)
	if a := testing.AllocsPerRun(50, func() { dst, _ = l.StripeShards(dst[:0], buf, 5000) }); a != 0 {
		t.Errorf("StripeShards with capacity: %v allocations", a)
	}
}
