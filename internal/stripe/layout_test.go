package stripe

import "testing"

func TestLayoutValidate(t *testing.T) {
	ok := []Layout{
		{K: 4, M: 2, Unit: 1 << 20, Inline: DefaultInline},
		{K: 1, M: 2, Unit: 4096},
		{K: 64, M: 64, Unit: 1 << 30, MinWrite: 128, Inline: MaxInline},
		{K: 4, M: 0, Unit: 4096, MinWrite: 4, Inline: 4 * 4096},
	}
	for _, l := range ok {
		if err := l.Validate(); err != nil {
			t.Errorf("%v: %v", l, err)
		}
	}
	bad := []struct {
		l    Layout
		want string
	}{
		{Layout{M: 2, Unit: 4096}, "layout: k=0 out of range 1..64"},
		{Layout{K: 65, M: 2, Unit: 4096}, "layout: k=65 out of range 1..64"},
		{Layout{K: 4, M: 65, Unit: 4096}, "layout: m=65 out of range (k+m at most 128)"},
		{Layout{K: 64, M: 65, Unit: 4096}, "layout: m=65 out of range (k+m at most 128)"},
		{Layout{K: 4, M: -1, Unit: 4096}, "layout: m=-1 out of range (k+m at most 128)"},
		{Layout{K: 4, M: 2, Unit: 5000}, "layout: unit 5000 must be a multiple of 4096 between 4 KiB and 1 GiB"},
		{Layout{K: 4, M: 2, Unit: 2 << 30}, "layout: unit 2147483648 must be a multiple of 4096 between 4 KiB and 1 GiB"},
		{Layout{K: 4, M: 2, Unit: 4096, MinWrite: 3}, "layout: min-write-shards 3 out of range 4..6 (k..k+m)"},
		{Layout{K: 4, M: 2, Unit: 4096, MinWrite: 7}, "layout: min-write-shards 7 out of range 4..6 (k..k+m)"},
		{Layout{K: 4, M: 2, Unit: 1 << 20, Inline: MaxInline + 1}, "layout: inline size 262145 above 262144 or one stripe (4194304)"},
		{Layout{K: 2, M: 1, Unit: 4096, Inline: 8193}, "layout: inline size 8193 above 262144 or one stripe (8192)"},
		{Layout{K: 2, M: 1, Unit: 4096, Inline: -1}, "layout: inline size -1 is negative"},
	}
	for _, c := range bad {
		if err := c.l.Validate(); err == nil || err.Error() != c.want {
			t.Errorf("%+v: got %v, want %q", c.l, err, c.want)
		}
	}
}

func TestLayoutString(t *testing.T) {
	for l, want := range map[Layout]string{
		{K: 4, M: 2, Unit: 1 << 20}:                           "4+2/1048576",
		{K: 4, M: 2, Unit: 1 << 20, Inline: DefaultInline}:    "4+2/1048576/inline=65536",
		{K: 1, M: 2, Unit: 4096, MinWrite: 3}:                 "1+2/4096/min-write=3",
		{K: 6, M: 3, Unit: 65536, MinWrite: 7, Inline: 16384}: "6+3/65536/min-write=7/inline=16384",
	} {
		if got := l.String(); got != want {
			t.Errorf("%+v: String() = %q, want %q", l, got, want)
		}
	}
}

func TestLayoutMinWriteShards(t *testing.T) {
	for _, c := range []struct {
		l    Layout
		want int
	}{
		{Layout{K: 4, M: 2}, 5},              // k+1
		{Layout{K: 4, M: 0}, 4},              // k+1 capped at k+m
		{Layout{K: 1, M: 2}, 2},              // replication: two copies
		{Layout{K: 4, M: 2, MinWrite: 6}, 6}, // as set
		{Layout{K: 4, M: 2, MinWrite: 4}, 4},
		{Layout{K: 4, M: 2, MinWrite: 9}, 6}, // capped at k+m
		{Layout{}, 0},
	} {
		if got := c.l.MinWriteShards(); got != c.want {
			t.Errorf("%+v: MinWriteShards() = %d, want %d", c.l, got, c.want)
		}
	}
}

func TestLayoutLengths(t *testing.T) {
	l := Layout{K: 4, M: 2, Unit: 1 << 20}
	if got := l.StripeSize(); got != 4<<20 {
		t.Errorf("StripeSize() = %d", got)
	}
	for _, length := range []int64{0, 1, 110_000, 1 << 20, 3<<20 + 1, 4 << 20} {
		if got, want := l.CodedLen(length), CodedLen(length, l.Unit); got != want {
			t.Errorf("CodedLen(%d) = %d, want %d", length, got, want)
		}
		for j := range l.K + l.M {
			if got, want := l.ShardLen(length, j), ShardLen(length, l.Unit, l.K, j); got != want {
				t.Errorf("ShardLen(%d, %d) = %d, want %d", length, j, got, want)
			}
		}
	}
}

func TestParseLayout(t *testing.T) {
	for _, l := range []Layout{
		{K: 4, M: 2, Unit: 1 << 20},
		{K: 8, M: 3, Unit: 64 << 10, MinWrite: 9, Inline: 4096},
		{K: 1, M: 2, Unit: 4096},
	} {
		got, err := ParseLayout(l.String())
		if err != nil || got != l {
			t.Errorf("ParseLayout(%q) = %+v, %v; want %+v", l.String(), got, err, l)
		}
	}
	if got, err := ParseLayout("6+3/1MiB/inline=16KiB"); err != nil || got != (Layout{K: 6, M: 3, Unit: 1 << 20, Inline: 16 << 10}) {
		t.Errorf("with suffixes: %+v, %v", got, err)
	}
	for _, bad := range []string{"", "4+2", "4-2/1MiB", "x+2/1MiB", "4+2/1000", "4+2/1MiB/min-write=1", "4+2/1MiB/speed=3", "4+2/1MiB/inline", "0+2/1MiB"} {
		if _, err := ParseLayout(bad); err == nil {
			t.Errorf("ParseLayout(%q) accepted", bad)
		}
	}
}
