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
