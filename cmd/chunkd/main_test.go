package main

import "testing"

func TestDefaultMem(t *testing.T) {
	m, err := defaultMem()
	if err != nil || m < 64<<20 || m > 4<<30 {
		t.Fatalf("defaultMem = %d, %v", m, err)
	}
}

func TestFlags(t *testing.T) {
	cmd := newCommand()
	for _, f := range []string{"data", "listen", "meta", "mem", "transport", "zone", "metrics", "secret-file", "reserve"} {
		if cmd.Flags().Lookup(f) == nil {
			t.Errorf("flag --%s missing", f)
		}
	}
	cmd.SetArgs([]string{})
	if err := cmd.Execute(); err == nil {
		t.Error("chunkd without --data ran")
	}
}

func TestParseReserve(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"auto", 0, true}, {"0", -1, true}, {"64MiB", 64 << 20, true}, {"1GiB", 1 << 30, true}, {"-1", 0, false}, {"lots", 0, false},
	} {
		got, err := parseReserve(tc.in)
		if (err == nil) != tc.ok || (tc.ok && got != tc.want) {
			t.Errorf("parseReserve(%q) = %d, %v; want %d (ok %v)", tc.in, got, err, tc.want, tc.ok)
		}
	}
}
