package ratelog

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestBurstThenRate(t *testing.T) {
	var buf bytes.Buffer
	now := time.Unix(1000, 0)
	l := New(slog.New(slog.NewTextHandler(&buf, nil)), time.Second, 3, func() time.Time { return now })
	written := 0
	for i := 0; i < 100; i++ {
		if l.Warn("rejected", "i", i) {
			written++
		}
	}
	if written != 3 {
		t.Fatalf("%d lines in a burst of 100, want 3", written)
	}
	now = now.Add(time.Second)
	if !l.Warn("rejected", "i", 100) {
		t.Fatal("no line after the interval")
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 4 || !strings.Contains(lines[3], "suppressed=97") {
		t.Fatalf("want 4 lines, the last saying 97 suppressed:\n%s", buf.String())
	}
}
