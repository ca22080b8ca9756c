package bytesize

import "testing"

func TestParse(t *testing.T) {
	tests := []struct {
		in   string
		want int64
		ok   bool
	}{
		{"0", 0, true}, {"4096", 4096, true}, {"64MiB", 64 << 20, true}, {"64M", 64 << 20, true},
		{"4GiB", 4 << 30, true}, {"1t", 1 << 40, true}, {" 16 MiB ", 16 << 20, true}, {"1KB", 1024, true},
		{"", 0, false}, {"MiB", 0, false}, {"12XB", 0, false}, {"-1", 0, false},
		{"9223372036854775807B", 1<<63 - 1, true}, {"8388608TiB", 0, false},
	}
	for _, tc := range tests {
		got, err := Parse(tc.in)
		if (err == nil) != tc.ok || (tc.ok && got != tc.want) {
			t.Errorf("Parse(%q) = %d, %v; want %d ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}
