package ec

import "testing"

func TestReadahead(t *testing.T) {
	cfg := ReadaheadConfig{Min: 100, Max: 800}
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
		{"out of bounds ignored", []step{{0, 10, 100}, {-5, 10, 0}, {MaxFileSize, 10, 0}, {10, 10, 200}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := NewReadahead(cfg)
			if err != nil {
				t.Fatal(err)
			}
			for i, s := range tc.steps {
				if got := r.Observe(s.off, s.n); got != s.want {
					t.Fatalf("step %d: Observe(%d, %d) = %d, want %d", i, s.off, s.n, got, s.want)
				}
			}
		})
	}
}

func TestReadaheadConfig(t *testing.T) {
	for _, c := range []ReadaheadConfig{{0, 10}, {-1, 10}, {20, 10}} {
		if _, err := NewReadahead(c); err == nil {
			t.Errorf("NewReadahead(%+v) accepted", c)
		}
	}
	d := DefaultReadahead(DefaultLayout())
	if d.Min != 4<<20 || d.Max != 32<<20 || d.Validate() != nil {
		t.Errorf("DefaultReadahead = %+v", d)
	}
	r, _ := NewReadahead(d)
	r.Observe(0, 10)
	if r.Window() != d.Min {
		t.Errorf("Window = %d", r.Window())
	}
	r.Reset()
	if r.Window() != 0 || r.Observe(10, 10) != 0 {
		t.Error("Reset kept history")
	}
	if a := testing.AllocsPerRun(100, func() { r.Observe(20, 10) }); a != 0 {
		t.Errorf("Observe allocates %v", a)
	}
}
