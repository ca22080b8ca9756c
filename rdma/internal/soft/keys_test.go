package soft

import (
	"testing"

	"github.com/rdmafs/rdmafs/rdma"
)

func TestRemoteChecks(t *testing.T) {
	keys := NewKeys()
	pd, other := NewPD(keys, nil), NewPD(keys, nil)
	mem, err := rdma.AllocMemory("keys", 8192)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Free()
	mr, err := pd.RegisterMemory(mem, rdma.AccessLocalWrite|rdma.AccessRemoteRead|rdma.AccessMWBind)
	if err != nil {
		t.Fatal(err)
	}
	defer mr.Deregister()
	base := mr.Addr()
	qpA, qpB := new(int), new(int)
	mw, _ := pd.AllocMW()
	defer mw.Close()
	wkey, err := mw.(*MW).Bind(qpA, mr, base+4096, 100, rdma.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		key    uint32
		pd     *PD
		qp     any
		addr   uint64
		length uint32
		want   rdma.AccessFlags
		ok     bool
	}{
		{"whole region", mr.RKey(), pd, qpB, base, 8192, rdma.AccessRemoteRead, true},
		{"last byte", mr.RKey(), pd, qpB, base + 8191, 1, rdma.AccessRemoteRead, true},
		{"one past the end", mr.RKey(), pd, qpB, base + 8191, 2, rdma.AccessRemoteRead, false},
		{"before the start", mr.RKey(), pd, qpB, base - 1, 1, rdma.AccessRemoteRead, false},
		{"address wraps", mr.RKey(), pd, qpB, ^uint64(0), 2, rdma.AccessRemoteRead, false},
		{"length wraps offset", mr.RKey(), pd, qpB, base + 100, ^uint32(0), rdma.AccessRemoteRead, false},
		{"no such key", mr.RKey() ^ 1, pd, qpB, base, 1, rdma.AccessRemoteRead, false},
		{"other domain", mr.RKey(), other, qpB, base, 1, rdma.AccessRemoteRead, false},
		{"right not granted", mr.RKey(), pd, qpB, base, 1, rdma.AccessRemoteWrite, false},
		{"window, bound qp", wkey, pd, qpA, base + 4096, 100, rdma.AccessRemoteRead, true},
		{"window, other qp", wkey, pd, qpB, base + 4096, 100, rdma.AccessRemoteRead, false},
		{"window, past its end", wkey, pd, qpA, base + 4096, 101, rdma.AccessRemoteRead, false},
	}
	for _, c := range cases {
		r, b, st := keys.Remote(c.key, c.pd, c.qp, c.addr, c.length, c.want)
		if (st == rdma.WCSuccess) != c.ok {
			t.Errorf("%s: status %v, want ok=%v", c.name, st, c.ok)
			continue
		}
		if c.ok {
			if len(b) != int(c.length) {
				t.Errorf("%s: %d bytes, want %d", c.name, len(b), c.length)
			}
			r.Release()
		} else if st != rdma.WCRemAccessErr {
			t.Errorf("%s: status %v, want REM_ACCESS_ERR", c.name, st)
		}
	}
	// Local SGEs never resolve through a window's key.
	if _, _, st := keys.Local(rdma.SGE{Addr: base + 4096, Length: 1, LKey: wkey}, pd, false); st != rdma.WCLocProtErr {
		t.Errorf("local access through a window key: %v, want LOC_PROT_ERR", st)
	}
	if err := mr.Deregister(); err == nil {
		t.Error("deregistered a region with a bound window")
	}
	mw.(*MW).Invalidate()
	if _, _, st := keys.Remote(wkey, pd, qpA, base+4096, 1, rdma.AccessRemoteRead); st != rdma.WCRemAccessErr {
		t.Errorf("invalidated window: %v, want REM_ACCESS_ERR", st)
	}
}

func TestCQGrowsInOrder(t *testing.T) {
	q := NewCQ(16)
	for i := 0; i < 100; i++ {
		q.Push(rdma.WorkCompletion{ID: uint64(i)})
	}
	wcs := make([]rdma.WorkCompletion, 7)
	next := uint64(0)
	for next < 100 {
		n := q.Poll(wcs)
		if n == 0 {
			t.Fatalf("queue empty after %d of 100", next)
		}
		for _, wc := range wcs[:n] {
			if wc.ID != next {
				t.Fatalf("completion %d, want %d", wc.ID, next)
			}
			next++
		}
	}
}
