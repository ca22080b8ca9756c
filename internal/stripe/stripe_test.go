package stripe

import "testing"

func TestShardLen(t *testing.T) {
	const unit = 1 << 20
	cases := []struct {
		length int64
		want   []int64 // shards 0..5 of a 4+2 layout
	}{
		{0, []int64{4096, 4096, 4096, 4096, 4096, 4096}},
		{1, []int64{4096, 4096, 4096, 4096, 4096, 4096}},
		{110_000, []int64{110_592, 4096, 4096, 4096, 110_592, 110_592}},
		{unit, []int64{unit, 4096, 4096, 4096, unit, unit}},
		{unit + 5000, []int64{unit, 8192, 4096, 4096, unit, unit}},
		{3*unit + 1, []int64{unit, unit, unit, 4096, unit, unit}},
		{4 * unit, []int64{unit, unit, unit, unit, unit, unit}},
	}
	for _, c := range cases {
		for shard, want := range c.want {
			if got := ShardLen(c.length, unit, 4, shard); got != want {
				t.Errorf("ShardLen(%d, 1 MiB, 4, %d) = %d, want %d", c.length, shard, got, want)
			}
		}
		if got := CodedLen(c.length, unit); got != c.want[0] {
			t.Errorf("CodedLen(%d) = %d, want %d", c.length, got, c.want[0])
		}
	}
	// Replication (k=1): every copy as long as the data.
	for shard := range 3 {
		if got := ShardLen(5000, unit, 1, shard); got != 8192 {
			t.Errorf("ShardLen(5000, 1 MiB, 1, %d) = %d, want 8192", shard, got)
		}
	}
}
