package fileio

import "testing"

func TestSeqWindow(t *testing.T) {
	type step struct {
		off, n int64
		want   int64
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"sequential from 0 doubles to max", []step{
			{0, 10, 100}, {10, 10, 200}, {20, 30, 400}, {50, 5, 800}, {55, 5, 800}, {60, 1000, 800}}},
		{"first read elsewhere is random", []step{{500, 10, 0}, {510, 10, 100}, {520, 10, 200}}},
		{"random read resets", []step{
			{0, 10, 100}, {10, 10, 200}, {5000, 10, 0}, {5010, 10, 100}}},
		{"backwards is random", []step{{0, 10, 100}, {10, 10, 200}, {10, 10, 0}, {20, 10, 100}}},
		{"gap is random", []step{{0, 10, 100}, {11, 10, 0}}},
		{"zero-length read changes nothing", []step{{0, 10, 100}, {999, 0, 0}, {10, 10, 200}}},
		{"random stays zero", []step{{7, 1, 0}, {3, 1, 0}, {100, 1, 0}, {50, 1, 0}}},
		{"out of range ignored", []step{{0, 10, 100}, {-5, 10, 0}, {maxFileSize, 10, 0}, {10, 10, 200}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := newSeqWindow(100, 800)
			for i, s := range tc.steps {
				if got := w.observe(s.off, s.n); got != s.want {
					t.Fatalf("step %d: observe(%d, %d) = %d, want %d", i, s.off, s.n, got, s.want)
				}
			}
		})
	}
	for _, b := range [][2]int64{{0, 10}, {-1, 10}, {20, 10}} {
		if newSeqWindow(b[0], b[1]) != nil {
			t.Errorf("newSeqWindow(%d, %d) accepted", b[0], b[1])
		}
	}
	w := newSeqWindow(100, 800)
	w.observe(0, 10)
	w.reset()
	if w.observe(10, 10) != 0 {
		t.Error("reset kept history")
	}
	if a := testing.AllocsPerRun(100, func() { w.observe(20, 10) }); a != 0 {
		t.Errorf("observe allocates %v", a)
	}
}
