package chunkserver_test

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/rdmafs/rdmafs/chunkserver"
	"github.com/rdmafs/rdmafs/chunkserver/chunk"
	"github.com/rdmafs/rdmafs/chunkserver/chunktest"
	"github.com/rdmafs/rdmafs/chunkserver/client"
	"github.com/rdmafs/rdmafs/chunkserver/proto"
	"github.com/rdmafs/rdmafs/chunkserver/store"
	"github.com/rdmafs/rdmafs/rdma"
)

// stagePatch lays out a patch of ranges in env's buffer: the header at off,
// the ranges' bytes (taken from src at their offsets) at off+64 KiB. It
// returns the patch's SGEs and CRC32C.
func stagePatch(env *chunktest.ClientEnv, off int, ranges []proto.PatchRange, src []byte) ([]rdma.SGE, uint32) {
	buf := env.Bytes()
	h := proto.EncodePatchHeader(buf[off:], ranges)
	d := off + 64<<10
	n := 0
	for _, r := range ranges {
		n += copy(buf[d+n:], src[r.Off:r.Off+r.Len])
	}
	crc := store.UpdateChecksum(store.Checksum(buf[off:off+h]), buf[d:d+n])
	return []rdma.SGE{env.SGE(off, h), env.SGE(d, n)}, crc
}

// applyModel returns base with the ranges of src copied over it.
func applyModel(base []byte, ranges []proto.PatchRange, src []byte) []byte {
	out := append([]byte(nil), base...)
	for _, r := range ranges {
		copy(out[r.Off:r.Off+r.Len], src[r.Off:])
	}
	return out
}

// readBack reads version key whole through the lease cache at off of env's buffer.
func readBack(t *testing.T, c *client.Client, env *chunktest.ClientEnv, off int, key chunk.Key, n int) []byte {
	t.Helper()
	clear(env.Bytes()[off : off+n])
	l, err := c.ReadAt(ctxT(t), key, 0, []rdma.SGE{env.SGE(off, n)})
	if err != nil {
		t.Fatalf("read %v: %v", key, err)
	}
	if int(l.Length) != n {
		t.Fatalf("%v is %d bytes, want %d", key, l.Length, n)
	}
	return append([]byte(nil), env.Bytes()[off:off+n]...)
}

// stagings are the two ways a patch reaches chunkd: through the connection's
// slab when it fits a part of it, otherwise (and always from a chunkd without
// slabs) through a staging granted for it.
var stagings = []struct {
	name string
	cfg  chunkserver.Config
}{
	{"slab", chunkserver.Config{}},
	{"staged", chunkserver.Config{SlabPerConn: -1}},
}

// TestPatch derives versions with patches: the new version is the base with
// the ranges overwritten, durable and checksummed; the base is untouched; a
// base not resident is loaded from disk.
func TestPatch(t *testing.T) {
	for _, st := range stagings {
		t.Run(st.name, func(t *testing.T) { testPatch(t, st.cfg) })
	}
}

func testPatch(t *testing.T, cfg chunkserver.Config) {
	s := chunktest.Start(t, chunktest.Options{Config: cfg})
	c, env := s.Dial(t)
	ctx := ctxT(t)
	const size = 256 << 10
	k1, k2, k3 := chunk.Key{Chunk: 80, Version: 1}, chunk.Key{Chunk: 80, Version: 2}, chunk.Key{Chunk: 80, Version: 5}
	base := put(t, c, env, 0, k1, size)
	src := content(chunk.Key{Chunk: 80, Version: 99}, size)
	ranges := []proto.PatchRange{{Off: 0, Len: 100}, {Off: 4096, Len: 8192}, {Off: size - 3, Len: 3}}
	model := applyModel(base, ranges, src)

	sgl, crc := stagePatch(env, 1<<20, ranges, src)
	info, err := c.WritePatch(ctx, k2, k1.Version, sgl, crc)
	if err != nil {
		t.Fatalf("WritePatch: %v", err)
	}
	if info.Key != k2 || info.Length != size || info.CRC != store.Checksum(model) {
		t.Fatalf("WritePatch = %+v, want %d bytes with crc %08x", info, size, store.Checksum(model))
	}
	if got := readBack(t, c, env, 4<<20, k2, size); !bytes.Equal(got, model) {
		t.Fatal("patched version differs from the model")
	}
	if st, err := c.Stat(ctx, k2); err != nil || st.Length != size || st.CRC != store.Checksum(model) {
		t.Fatalf("Stat(%v) = %+v, %v", k2, st, err)
	}
	if got := readBack(t, c, env, 4<<20, k1, size); !bytes.Equal(got, base) {
		t.Fatal("the base changed")
	}

	// A commit of the stored version answers OK with the version's own CRC,
	// Exists with any other (the patch's included: a writer whose patch
	// commit failed rewrites the stripe whole).
	other, _ := s.Dial(t)
	for _, cc := range []*client.Client{c, other} {
		if err := cc.Commit(ctx, k2, info.CRC); err != nil {
			t.Fatalf("commit with the version's crc: %v", err)
		}
		if err := cc.Commit(ctx, k2, crc); !proto.IsStatus(err, proto.StatusExists) {
			t.Fatalf("commit with the patch's crc = %v, want Exists", err)
		}
	}

	// After a restart: the patched version is durable, and a patch of a base
	// that is not resident loads it from disk.
	dir := s.Dir
	s.Stop()
	s2 := chunktest.Start(t, chunktest.Options{Dir: dir, Config: cfg})
	c2, env2 := s2.Dial(t)
	if got := readBack(t, c2, env2, 4<<20, k2, size); !bytes.Equal(got, model) {
		t.Fatal("patched version after restart differs from the model")
	}
	ranges3 := []proto.PatchRange{{Off: 1, Len: 1}, {Off: 2, Len: 60000}}
	src3 := content(chunk.Key{Chunk: 80, Version: 98}, size)
	model3 := applyModel(base, ranges3, src3)
	sgl3, crc3 := stagePatch(env2, 1<<20, ranges3, src3)
	if info, err := c2.WritePatch(ctx, k3, k1.Version, sgl3, crc3); err != nil || info.CRC != store.Checksum(model3) {
		t.Fatalf("patch of a base on disk = %+v, %v", info, err)
	}
	if got := readBack(t, c2, env2, 4<<20, k3, size); !bytes.Equal(got, model3) {
		t.Fatal("version patched from a base on disk differs from the model")
	}

	// An empty version patched with no ranges.
	e1, e2 := chunk.Key{Chunk: 81, Version: 1}, chunk.Key{Chunk: 81, Version: 2}
	put(t, c2, env2, 0, e1, 0)
	sgl, crc = stagePatch(env2, 1<<20, nil, nil)
	if info, err := c2.WritePatch(ctx, e2, 1, sgl[:1], crc); err != nil || info.Length != 0 || info.CRC != store.Checksum(nil) {
		t.Fatalf("empty patch of an empty version = %+v, %v", info, err)
	}
}

// TestClone: a clone equals its base byte for byte, aligned or not, empty or
// not, with many clones of one base made at once; a retried clone answers OK.
func TestClone(t *testing.T) {
	s := chunktest.Start(t, chunktest.Options{})
	c, env := s.Dial(t)
	ctx := ctxT(t)
	for i, n := range []int{0, 1, 4096, 100000, 1 << 20} {
		id := uint64(90 + i)
		base := put(t, c, env, 0, chunk.Key{Chunk: id, Version: 1}, n)
		k := chunk.Key{Chunk: id, Version: 3}
		info, err := c.Clone(ctx, k, 1)
		if err != nil || info.Key != k || info.Length != uint32(n) || info.CRC != store.Checksum(base) {
			t.Fatalf("Clone of %d bytes = %+v, %v", n, info, err)
		}
		if st, err := c.Stat(ctx, k); err != nil || st.Length != uint32(n) || st.CRC != store.Checksum(base) {
			t.Fatalf("Stat(%v) = %+v, %v", k, st, err)
		}
		if n > 0 && !bytes.Equal(readBack(t, c, env, 2<<20, k, n), base) {
			t.Fatalf("clone of %d bytes differs from its base", n)
		}
		if again, err := c.Clone(ctx, k, 1); err != nil || again != info {
			t.Fatalf("retried clone = %+v, %v; want %+v", again, err, info)
		}
	}

	// Clones of one resident base from several connections at once.
	const size = 100000
	baseKey := chunk.Key{Chunk: 99, Version: 1}
	base := put(t, c, env, 0, baseKey, size)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for g := 0; g < 4; g++ {
		cg, _ := s.Dial(t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 4; i++ {
				k := chunk.Key{Chunk: 99, Version: uint64(10 + 4*g + i)}
				if info, err := cg.Clone(ctx, k, 1); err != nil || info.CRC != store.Checksum(base) {
					errs <- fmt.Errorf("clone %v = %+v, %w", k, info, err)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for v := uint64(10); v < 26; v++ {
		if !bytes.Equal(readBack(t, c, env, 2<<20, chunk.Key{Chunk: 99, Version: v}, size), base) {
			t.Fatalf("clone %d differs from its base", v)
		}
	}
	if !bytes.Equal(readBack(t, c, env, 2<<20, baseKey, size), base) {
		t.Fatal("the base changed")
	}
}

// TestPatchErrors: every refused patch or clone answers its status and leaves
// nothing stored, staged or claimed.
func TestPatchErrors(t *testing.T) {
	for _, st := range stagings {
		t.Run(st.name, func(t *testing.T) { testPatchErrors(t, st.cfg) })
	}
}

func testPatchErrors(t *testing.T, cfg chunkserver.Config) {
	s := chunktest.Start(t, chunktest.Options{MaxLength: 1 << 20, Config: cfg})
	c, env := s.Dial(t)
	other, _ := s.Dial(t)
	ctx := ctxT(t)
	const size = 64 << 10
	const id = 70
	base := put(t, c, env, 0, chunk.Key{Chunk: id, Version: 1}, size)
	put(t, c, env, 0, chunk.Key{Chunk: id, Version: 2}, 5000) // exists
	if _, err := other.PrepareWrite(ctx, chunk.Key{Chunk: id, Version: 3}, 10); err != nil {
		t.Fatal(err) // being written by another connection
	}
	src := content(chunk.Key{Chunk: id, Version: 77}, size+4096) // room for ranges past the base
	good := []proto.PatchRange{{Off: 10, Len: 10}}
	patch := func(key chunk.Key, base chunk.Version, ranges []proto.PatchRange) error {
		sgl, crc := stagePatch(env, 1<<20, ranges, src)
		_, err := c.WritePatch(ctx, key, base, sgl, crc)
		return err
	}
	clone := func(key chunk.Key, base chunk.Version) error {
		_, err := c.Clone(ctx, key, base)
		return err
	}
	k := func(v uint64) chunk.Key { return chunk.Key{Chunk: id, Version: v} }
	badPatches := testutil.ToFloat64(s.Metrics().Errors.WithLabelValues("patch"))

	tests := []struct {
		name   string
		do     func() error
		want   proto.Status
		absent chunk.Key // must not be stored afterwards
	}{
		{"patch: base missing", func() error { return patch(k(9), 5, good) }, proto.StatusWrongVersion, k(9)},
		{"clone: base missing", func() error { return clone(k(9), 5) }, proto.StatusWrongVersion, k(9)},
		{"patch: chunk unknown", func() error { return patch(chunk.Key{Chunk: 71, Version: 2}, 1, good) }, proto.StatusUnknownChunk, chunk.Key{Chunk: 71, Version: 2}},
		{"clone: chunk unknown", func() error { return clone(chunk.Key{Chunk: 71, Version: 2}, 1) }, proto.StatusUnknownChunk, chunk.Key{Chunk: 71, Version: 2}},
		{"patch: base 0", func() error { return patch(k(9), 0, good) }, proto.StatusInvalid, k(9)},
		{"clone: base 0", func() error { return clone(k(9), 0) }, proto.StatusInvalid, k(9)},
		{"patch: base is the version", func() error { return patch(k(9), 9, good) }, proto.StatusInvalid, k(9)},
		{"clone: base is the version", func() error { return clone(k(9), 9) }, proto.StatusInvalid, k(9)},
		{"patch: base after the version", func() error { return patch(k(1), 2, good) }, proto.StatusInvalid, k(0)},
		{"clone: base after the version", func() error { return clone(k(1), 2) }, proto.StatusInvalid, k(0)},
		{"patch: range outside the base", func() error {
			return patch(k(9), 1, []proto.PatchRange{{Off: 10, Len: 10}, {Off: size - 10, Len: 20}})
		}, proto.StatusInvalid, k(9)},
		{"patch: ranges unsorted", func() error {
			return patch(k(9), 1, []proto.PatchRange{{Off: 100, Len: 10}, {Off: 10, Len: 10}})
		}, proto.StatusInvalid, k(9)},
		{"patch: ranges overlap", func() error {
			return patch(k(9), 1, []proto.PatchRange{{Off: 10, Len: 10}, {Off: 19, Len: 10}})
		}, proto.StatusInvalid, k(9)},
		{"patch: data short", func() error {
			sgl, _ := stagePatch(env, 1<<20, good, src)
			sgl[1].Length--
			b := env.Bytes()
			crc := store.UpdateChecksum(store.Checksum(b[1<<20:1<<20+16]), b[1<<20+64<<10:1<<20+64<<10+9])
			_, err := c.WritePatch(ctx, k(9), 1, sgl, crc)
			return err
		}, proto.StatusInvalid, k(9)},
		{"patch: shorter than a header", func() error { _, err := c.PreparePatch(ctx, k(9), 1, 7); return err }, proto.StatusInvalid, k(9)},
		{"patch: over the length limit", func() error {
			reps, err := c.Do(ctx, []proto.Request{{Op: proto.OpPreparePatch, Chunk: id, Version: 9, Base: 1, Length: 1<<20 + 1}})
			if err != nil {
				return err
			}
			return reps[0].Status.Err(proto.OpPreparePatch)
		}, proto.StatusTooLong, k(9)},
		{"patch: target exists", func() error { return patch(k(2), 1, good) }, proto.StatusExists, k(0)},
		{"clone: target exists", func() error { return clone(k(2), 1) }, proto.StatusExists, k(0)},
		{"patch: target being written", func() error { return patch(k(3), 1, good) }, proto.StatusExists, k(3)},
		{"clone: target being written", func() error { return clone(k(3), 1) }, proto.StatusExists, k(3)},
		{"patch: wrong crc", func() error {
			sgl, crc := stagePatch(env, 1<<20, good, src)
			_, err := c.WritePatch(ctx, k(9), 1, sgl, crc^1)
			return err
		}, proto.StatusChecksumMismatch, k(9)},
		{"patch: base deleted before the commit", func() error {
			// The base is resident (just written): the commit must not
			// derive the version from a resident copy of a deleted version.
			b := chunk.Key{Chunk: id, Version: 4}
			put(t, c, env, 0, b, size)
			st, err := c.PreparePatch(ctx, k(9), b.Version, proto.PatchHeaderLen(1)+10)
			if err != nil {
				return err
			}
			h := proto.EncodePatchHeader(env.Bytes()[1<<20:], good)
			copy(env.Bytes()[1<<20+h:], src[:10])
			p := env.Bytes()[1<<20 : 1<<20+h+10]
			if err := c.Write(ctx, st, 0, []rdma.SGE{env.SGE(1<<20, len(p))}); err != nil {
				return err
			}
			if err := c.Delete(ctx, b); err != nil {
				return err
			}
			return c.Commit(ctx, k(9), store.Checksum(p))
		}, proto.StatusWrongVersion, k(9)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.do()
			if !proto.IsStatus(err, tc.want) {
				t.Fatalf("got %v, want status %q", err, tc.want)
			}
			if tc.absent.Version != 0 {
				if info, err := c.Stat(ctx, tc.absent); err == nil {
					t.Fatalf("%v stored after a refusal: %+v", tc.absent, info)
				}
			}
		})
	}
	if n := testutil.ToFloat64(s.Metrics().Errors.WithLabelValues("patch")) - badPatches; n != 4 {
		t.Fatalf("%v bad patches counted, want 4", n)
	}
	slabPatches := 0.0
	for st := proto.StatusOK; st <= proto.StatusShuttingDown; st++ {
		slabPatches += testutil.ToFloat64(s.Metrics().Ops.WithLabelValues(proto.OpPatchSlab.String(), st.String()))
	}
	if slabs := cfg.SlabPerConn >= 0; slabs != (slabPatches > 0) {
		t.Fatalf("%v slab patches served with slabs %v", slabPatches, slabs)
	}
	// Nothing is left staged but the other connection's grant, the base is
	// intact, and a good patch and a clone of the refused version succeed
	// (nothing left claimed it).
	if g := testutil.ToFloat64(s.Metrics().Staging); g != 1 {
		t.Fatalf("staging grants = %v, want 1", g)
	}
	if !bytes.Equal(readBack(t, c, env, 2<<20, k(1), size), base) {
		t.Fatal("the base changed")
	}
	if err := patch(k(9), 1, good); err != nil {
		t.Fatalf("patch after the refusals: %v", err)
	}
	if err := clone(k(10), 1); err != nil {
		t.Fatalf("clone after the refusals: %v", err)
	}
	if err := clone(k(10), 2); !proto.IsStatus(err, proto.StatusExists) {
		t.Fatalf("clone of another base over a clone = %v, want Exists", err)
	}
}

// TestPatchSpace: a patch claims room for its base's length, not its own, and
// a clone for the base's length: a chunkserver without that room refuses both
// with NoSpace before any data moves, while a small plain write still fits.
// Refused patches leave no claim behind.
func TestPatchSpace(t *testing.T) {
	const unit = 1 << 20
	s := chunktest.Start(t, chunktest.Options{MaxLength: unit, Reserve: -1,
		Capacity: 2*store.FileSize(unit) + store.FileSize(4096)})
	c, env := s.Dial(t)
	ctx := ctxT(t)
	k := func(v uint64) chunk.Key { return chunk.Key{Chunk: 60, Version: v} }
	put(t, c, env, 0, k(1), unit)
	src := content(k(50), unit)
	ranges := []proto.PatchRange{{Off: 100, Len: 100}}

	// Failed patch commits release their claim of a whole unit: there is
	// room for one more unit only, which the last patch takes.
	sgl, crc := stagePatch(env, 2<<20, ranges, src)
	if _, err := c.WritePatch(ctx, k(2), 1, sgl, crc^1); !proto.IsStatus(err, proto.StatusChecksumMismatch) {
		t.Fatalf("patch with a wrong crc = %v", err)
	}
	bad, badCRC := stagePatch(env, 3<<20, []proto.PatchRange{{Off: unit - 1, Len: 2}}, append(src, 0))
	if _, err := c.WritePatch(ctx, k(2), 1, bad, badCRC); !proto.IsStatus(err, proto.StatusInvalid) {
		t.Fatalf("patch past the base = %v", err)
	}
	if _, err := c.WritePatch(ctx, k(2), 1, sgl, crc); err != nil {
		t.Fatalf("patch with room for one unit: %v", err)
	}

	// Room for 4 KiB is left: a patch of a few bytes of a 1 MiB base and a
	// clone of it are refused, a 4 KiB write is not.
	_, err := c.PreparePatch(ctx, k(3), 2, 100)
	if !proto.IsStatus(err, proto.StatusNoSpace) || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("patch of a unit without room for it = %v, want NoSpace", err)
	}
	if _, err := c.Clone(ctx, k(3), 1); !proto.IsStatus(err, proto.StatusNoSpace) {
		t.Fatalf("clone of a unit without room for it = %v, want NoSpace", err)
	}
	small := chunk.Key{Chunk: 61, Version: 1}
	if _, err := c.PrepareWrite(ctx, small, 4096); err != nil {
		t.Fatalf("4 KiB write with 4 KiB of room: %v", err)
	}
	if err := c.Abort(ctx, small); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Stat(ctx, k(3)); !proto.IsStatus(err, proto.StatusWrongVersion) {
		t.Fatalf("after the refusals: stat = %v", err)
	}
	// Deleting the patched version gives its room back to the clone.
	if err := c.Delete(ctx, k(2)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Clone(ctx, k(3), 1); err != nil {
		t.Fatalf("clone after a delete: %v", err)
	}
}

// TestPatchSlab: a patch that fits a part of the connection's slab goes as
// OpPatchSlab, a larger one as OpPreparePatch; more patches at once than the
// slab has parts all land; chunkd refuses a slab patch outside its slab, or
// before the connection has one, and keeps one slab per connection, which it
// frees when the connection ends.
func TestPatchSlab(t *testing.T) {
	s := chunktest.Start(t, chunktest.Options{Mem: 16 << 20})
	c, env := s.Dial(t)
	ctx := ctxT(t)
	const size = 256 << 10
	ops := func(op proto.Op) float64 {
		return testutil.ToFloat64(s.Metrics().Ops.WithLabelValues(op.String(), proto.StatusOK.String()))
	}
	base := put(t, c, env, 0, chunk.Key{Chunk: 90, Version: 1}, size)
	src := content(chunk.Key{Chunk: 90, Version: 99}, size)

	small := []proto.PatchRange{{Off: 4096, Len: 4096}}
	sgl, crc := stagePatch(env, 1<<20, small, src)
	if _, err := c.WritePatch(ctx, chunk.Key{Chunk: 90, Version: 2}, 1, sgl, crc); err != nil {
		t.Fatal(err)
	}
	large := []proto.PatchRange{{Off: 0, Len: client.SlabPart}}
	sgl, crc = stagePatch(env, 1<<20, large, src)
	if _, err := c.WritePatch(ctx, chunk.Key{Chunk: 90, Version: 3}, 1, sgl, crc); err != nil {
		t.Fatal(err)
	}
	if p, s := ops(proto.OpPatchSlab), ops(proto.OpPreparePatch); p != 1 || s != 1 {
		t.Fatalf("PatchSlab %v, PreparePatch %v: want one each", p, s)
	}
	for v, ranges := range map[uint64][]proto.PatchRange{2: small, 3: large} {
		if got := readBack(t, c, env, 4<<20, chunk.Key{Chunk: 90, Version: v}, size); !bytes.Equal(got, applyModel(base, ranges, src)) {
			t.Fatalf("version %d differs from the model", v)
		}
	}

	// Three times as many patches at once as the slab has parts.
	const n = 3 * (256 << 10) / client.SlabPart
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		put(t, c, env, 0, chunk.Key{Chunk: 100 + uint64(i), Version: 1}, size)
	}
	for i := range n {
		wg.Go(func() {
			r := []proto.PatchRange{{Off: uint32(i * 512), Len: 512}}
			sgl, crc := stagePatch(env, (8+2*i)*128<<10, r, src)
			key := chunk.Key{Chunk: 100 + uint64(i), Version: 2}
			info, err := c.WritePatch(ctx, key, 1, sgl, crc)
			if err == nil && info.CRC != store.Checksum(applyModel(content(chunk.Key{Chunk: key.Chunk, Version: 1}, size), r, src)) {
				err = fmt.Errorf("patch %d: crc %08x differs from the model's", i, info.CRC)
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}

	// Raw requests: a slab patch before the connection asked for its slab,
	// and outside the slab, is refused; the slab is granted once.
	raw, _ := s.Dial(t)
	req := proto.Request{Op: proto.OpPatchSlab, Chunk: 90, Version: 7, Base: 1, Length: 64}
	if reps, err := raw.Do(ctx, []proto.Request{req}); err != nil || reps[0].Status != proto.StatusInvalid {
		t.Fatalf("slab patch without a slab = %+v, %v; want invalid", reps, err)
	}
	first, err := raw.Do(ctx, []proto.Request{{Op: proto.OpSlab}, {Op: proto.OpSlab}})
	if err != nil || first[0].Status != proto.StatusOK || first[0].Length != 256<<10 ||
		first[1].Addr != first[0].Addr || first[1].RKey != first[0].RKey || first[1].Length != first[0].Length {
		t.Fatalf("slab grants = %+v, %v; want the same 256 KiB slab twice", first, err)
	}
	req.Slab, req.Length = 252<<10, 4097
	if reps, err := raw.Do(ctx, []proto.Request{req}); err != nil || reps[0].Status != proto.StatusInvalid {
		t.Fatalf("slab patch past the slab = %+v, %v; want invalid", reps, err)
	}
	if info, err := c.Stat(ctx, chunk.Key{Chunk: 90, Version: 7}); err == nil {
		t.Fatalf("refused slab patch stored: %+v", info)
	}

	// A slab is not counted in the connection's staging quota (a quarter of
	// the 16 MiB): the connection holding one still stages a version of the
	// whole quota.
	put(t, c, env, 20<<20, chunk.Key{Chunk: 95, Version: 1}, 4<<20)

	// A slab patch replaces a staging of the same version the connection
	// left: its commit applies the patch, not the abandoned bytes.
	if _, err := c.PrepareWrite(ctx, chunk.Key{Chunk: 90, Version: 8}, size); err != nil {
		t.Fatal(err)
	}
	sgl, crc = stagePatch(env, 1<<20, small, src)
	if info, err := c.WritePatch(ctx, chunk.Key{Chunk: 90, Version: 8}, 1, sgl, crc); err != nil || info.CRC != store.Checksum(applyModel(base, small, src)) {
		t.Fatalf("slab patch over an abandoned staging = %+v, %v", info, err)
	}

	// A connection's slab goes with it: far more connections, one after
	// the other, than the 16 MiB of memory holds slabs.
	// Each is waited for to be gone (staging_bytes back where it was), so
	// that the budget of eight slabs is not outrun by chunkd noticing closes.
	held := testutil.ToFloat64(s.Metrics().StagingBytes)
	for i := range 100 {
		cl := env.Dial(t, s.Addr(), s.Secret)
		reps, err := cl.Do(ctx, []proto.Request{{Op: proto.OpSlab}})
		if err != nil || reps[0].Status != proto.StatusOK {
			t.Fatalf("slab of connection %d: %+v, %v", i, reps, err)
		}
		cl.Close()
		for deadline := time.Now().Add(10 * time.Second); testutil.ToFloat64(s.Metrics().StagingBytes) != held; {
			if time.Now().After(deadline) {
				t.Fatalf("connection %d closed, its slab still held: staging_bytes %v, %v before", i, testutil.ToFloat64(s.Metrics().StagingBytes), held)
			}
			time.Sleep(time.Millisecond)
		}
	}
}
