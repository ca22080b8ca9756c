package mempool

import (
	"math/rand/v2"
	"testing"
)

func TestAllocator(t *testing.T) {
	const size, g = 1 << 20, 4096
	a := NewAllocator(size, g)
	r := rand.New(rand.NewPCG(1, 2))
	type ext struct{ off, n int }
	var live []ext
	owner := make([]int, size/g) // 0 free, else index+1 of the extent
	for step := 0; step < 20000; step++ {
		if len(live) > 0 && r.IntN(2) == 0 {
			i := r.IntN(len(live))
			e := live[i]
			a.Free(e.off, e.n)
			for p := e.off / g; p < (e.off+e.n)/g; p++ {
				owner[p] = 0
			}
			live = append(live[:i], live[i+1:]...)
			continue
		}
		n := (r.IntN(64) + 1) * g
		off, ok := a.Alloc(n)
		if !ok {
			if a.InUse()+n <= size && len(a.free) == 1 {
				t.Fatalf("alloc of %d failed with one free extent and %d in use", n, a.InUse())
			}
			continue
		}
		for p := off / g; p < (off+n)/g; p++ {
			if owner[p] != 0 {
				t.Fatalf("step %d: page %d allocated twice", step, p)
			}
			owner[p] = 1
		}
		live = append(live, ext{off, n})
	}
	for _, e := range live {
		a.Free(e.off, e.n)
	}
	if a.InUse() != 0 || len(a.free) != 1 || a.free[0] != (extent{0, size}) {
		t.Fatalf("after freeing everything: in use %d, free %v", a.InUse(), a.free)
	}
}

func TestAllocatorDoubleFreePanics(t *testing.T) {
	a := NewAllocator(1<<16, 4096)
	off, _ := a.Alloc(4096)
	a.Free(off, 4096)
	defer func() {
		if recover() == nil {
			t.Fatal("double free did not panic")
		}
	}()
	a.Free(off, 4096)
}
