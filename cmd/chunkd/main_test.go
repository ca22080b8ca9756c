package main

import "testing"

func TestParseSize(t *testing.T) {
	tests := []struct {
		in   string
		want int64
		ok   bool
	}{
		{"0", 0, true}, {"4096", 4096, true}, {"64MiB", 64 << 20, true}, {"64M", 64 << 20, true},
		{"4GiB", 4 << 30, true}, {"1t", 1 << 40, true}, {" 16 MiB ", 16 << 20, true},
		{"", 0, false}, {"MiB", 0, false}, {"12XB", 0, false}, {"-1", 0, false},
	}
	for _, tc := range tests {
		got, err := parseSize(tc.in)
		if (err == nil) != tc.ok || (tc.ok && got != tc.want) {
			t.Errorf("parseSize(%q) = %d, %v; want %d ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

func TestDefaultMem(t *testing.T) {
	m, err := defaultMem()
	if err != nil || m < 64<<20 || m > 4<<30 {
		t.Fatalf("defaultMem = %d, %v", m, err)
	}
}

func TestFlags(t *testing.T) {
	cmd := newCommand()
	for _, f := range []string{"data", "listen", "meta", "mem", "transport", "zone", "metrics", "secret-file"} {
		if cmd.Flags().Lookup(f) == nil {
			t.Errorf("flag --%s missing", f)
		}
	}
	cmd.SetArgs([]string{})
	if err := cmd.Execute(); err == nil {
		t.Error("chunkd without --data ran")
	}
}
