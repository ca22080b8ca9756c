package main

import "testing"

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		v    []float64
		want float64
	}{
		{[]float64{5}, 5},
		{[]float64{3, 1}, 2},
		{[]float64{34045, 24507, 33494, 32421}, (32421 + 33494) / 2.0},
		{[]float64{9, 1, 5}, 5},
	} {
		in := append([]float64(nil), tc.v...)
		if got := median(tc.v); got != tc.want {
			t.Errorf("median(%v) = %v, want %v", in, got, tc.want)
		}
		for i := range in {
			if tc.v[i] != in[i] {
				t.Fatalf("median reordered its argument: %v, was %v", tc.v, in)
			}
		}
	}
}
