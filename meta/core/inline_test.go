package core

import (
	"bytes"
	"syscall"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/rdmafs/rdmafs/meta/metapb"
	"github.com/rdmafs/rdmafs/meta/reqid"
)

// smallFile makes six chunkservers and a file in a directory whose layout
// keeps up to 4 KiB inline, and returns the file's inode.
func smallFile(t *testing.T, e *env) uint64 {
	t.Helper()
	e.chunkservers(6)
	d := e.mkdir(root, RootIno, "small", 0o777)
	l := &metapb.Layout{K: 4, M: 2, Unit: 64 << 10, InlineMax: 4096}
	if _, err := e.s.SetLayout(e.ctx, &metapb.SetLayoutRequest{Ino: d, Layout: l}); err != nil {
		t.Fatal(err)
	}
	return e.create(root, d, "f", 0o644)
}

// TestInlineCommits covers stripes whose bytes live in metadata: the checks
// on an inline commit, its compare-and-set, the versions it takes from the
// stripe's counter, and the moves between inline and sharded both ways.
func TestInlineCommits(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		f := smallFile(t, e)
		inline := func(stripe, expected uint64, data []byte) (*metapb.CommitStripesReply, error) {
			return e.s.CommitStripes(e.ctx, &metapb.CommitStripesRequest{Ino: f, Size: uint64(len(data)),
				Stripes: []*metapb.StripeCommit{{Stripe: stripe, ExpectedVersion: expected, Length: uint64(len(data)), Inline: true, Data: data}}})
		}
		stripe0 := func() *metapb.StripeInfo {
			t.Helper()
			r, err := e.s.GetStripes(e.ctx, &metapb.GetStripesRequest{Ino: f})
			if err != nil || len(r.Stripes) != 1 {
				t.Fatalf("get stripes: %v %v", r, err)
			}
			return r.Stripes[0]
		}
		_, err := inline(1, 0, []byte("x"))
		wantErrno(t, err, syscall.EINVAL) // only stripe 0
		_, err = inline(0, 0, make([]byte, 4097))
		wantErrno(t, err, syscall.EINVAL) // past the layout's inline size
		_, err = e.s.CommitStripes(e.ctx, &metapb.CommitStripesRequest{Ino: f, Size: 3,
			Stripes: []*metapb.StripeCommit{{Stripe: 0, Length: 3, Inline: true, Data: []byte("ab")}}})
		wantErrno(t, err, syscall.EINVAL) // length and data disagree

		r, err := inline(0, 0, []byte("hello"))
		if err != nil {
			t.Fatal(err)
		}
		v1 := r.Versions[0]
		if v1 == 0 || r.Attr.Size != 5 {
			t.Fatalf("inline commit: version %d size %d", v1, r.Attr.Size)
		}
		if si := stripe0(); si.Version != v1 || len(si.Shards) != 0 || string(si.InlineData) != "hello" || si.Length != 5 {
			t.Fatalf("inline stripe reads back as %v", si)
		}
		st, err := e.s.Status(e.ctx, &metapb.StatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if r := st.Repair; st.Stripes != 1 || r.HealthyStripes != 1 || r.LostStripes != 0 || r.DegradedStripes != 0 {
			t.Fatalf("status with one inline stripe: %d stripes, repair %v", st.Stripes, r)
		}
		_, err = inline(0, 0, []byte("stale"))
		if status(err) != codes.Aborted { // lost the compare-and-set
			t.Fatalf("inline commit on a stale version: %v", err)
		}
		// A grant taken now must not collide with the next inline version.
		g := e.grant(f, 0)
		if g.Version <= v1 || g.CommittedVersion != v1 {
			t.Fatalf("grant after inline commit: version %d committed %d (inline was %d)", g.Version, g.CommittedVersion, v1)
		}
		r, err = inline(0, v1, []byte("hello, again"))
		if err != nil {
			t.Fatal(err)
		}
		if v2 := r.Versions[0]; v2 <= g.Version {
			t.Fatalf("inline version %d does not pass the outstanding grant's %d", v2, g.Version)
		}
		v2 := r.Versions[0]
		// The grant is now stale; a fresh one moves the stripe to shards,
		// which leaves nothing inline and nothing to collect.
		g = e.grant(f, 0)
		if err := e.commit(f, g, v2, 64<<10, 64<<10); err != nil {
			t.Fatal(err)
		}
		if si := stripe0(); len(si.Shards) != 6 || len(si.InlineData) != 0 || si.Version != g.Version {
			t.Fatalf("sharded stripe after inline: %v", si)
		}
		if n := countRefs(e.allGC()); n != 0 {
			t.Fatalf("%d chunks to collect after an inline stripe became sharded", n)
		}
		// Truncated small and committed inline again: the shards are collected.
		if _, err := e.s.SetAttr(e.ctx, &metapb.SetAttrRequest{Ino: f, SetSize: true, Size: 2}); err != nil {
			t.Fatal(err)
		}
		if _, err := inline(0, g.Version, []byte("hi")); err != nil {
			t.Fatal(err)
		}
		if n := countRefs(e.allGC()); n != 6 {
			t.Fatalf("%d chunks to collect after the stripe went inline again, want 6", n)
		}
		// Truncation shortens the inline bytes too.
		if _, err := e.s.SetAttr(e.ctx, &metapb.SetAttrRequest{Ino: f, SetSize: true, Size: 1}); err != nil {
			t.Fatal(err)
		}
		if si := stripe0(); !bytes.Equal(si.InlineData, []byte("h")) || si.Length != 1 {
			t.Fatalf("inline stripe after truncate: %v", si)
		}
		e.restart()
		if si := stripe0(); !bytes.Equal(si.InlineData, []byte("h")) {
			t.Fatalf("inline stripe after restart: %v", si)
		}
		// A retried inline commit (its reply lost) gets its first outcome,
		// not a compare-and-set failure against itself.
		id := reqid.ID{Client: 0xbeef, Seq: 1, Millis: uint64(e.clock.Now().UnixMilli())}
		req := &metapb.CommitStripesRequest{Ino: f, Size: 3,
			Stripes: []*metapb.StripeCommit{{Stripe: 0, ExpectedVersion: stripe0().Version, Length: 3, Inline: true, Data: []byte("abc")}}}
		first, err := e.s.CommitStripes(reqid.NewIncoming(e.ctx, id), req)
		if err != nil {
			t.Fatal(err)
		}
		id.Retry = true
		again, err := e.s.CommitStripes(reqid.NewIncoming(e.ctx, id), req)
		if err != nil || again.Versions[0] != first.Versions[0] {
			t.Fatalf("retried inline commit: %v %v, first %v", again, err, first)
		}
		// A retried commit that lost the compare-and-set loses it again.
		id = reqid.ID{Client: 0xbeef, Seq: 2, Millis: uint64(e.clock.Now().UnixMilli())}
		_, err = e.s.CommitStripes(reqid.NewIncoming(e.ctx, id), req)
		if status(err) != codes.Aborted {
			t.Fatalf("stale inline commit: %v", err)
		}
		id.Retry = true
		if _, err = e.s.CommitStripes(reqid.NewIncoming(e.ctx, id), req); status(err) != codes.Aborted {
			t.Fatalf("retry of a stale inline commit: %v", err)
		}
	})
}

// TestCreateCarriesInline: a create the client answered early may carry the
// file's whole content; it becomes stripe 0's first version, inline, with
// the file's size and times, and survives a restart. Data past the layout's
// inline size, or on a create whose inode the client did not choose, is
// refused and creates nothing; a later commit builds on version 1.
func TestCreateCarriesInline(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		d := e.mkdir(root, RootIno, "small", 0o777)
		if _, err := e.s.SetLayout(e.ctx, &metapb.SetLayoutRequest{Ino: d, Layout: &metapb.Layout{K: 4, M: 2, Unit: 64 << 10, InlineMax: 4096}}); err != nil {
			t.Fatal(err)
		}
		session, first := e.session(8)
		create := func(name string, ino uint64, data []byte) (*metapb.EntryReply, error) {
			e.reserve(session, d, name)
			return e.s.Create(e.ctx, &metapb.CreateRequest{Caller: &metapb.Caller{Session: session}, Parent: d, Name: name,
				Mode: 0o644, Ino: ino, TimeNs: 42, InlineData: data, InlineTimeNs: 77})
		}
		_, err := create("big", first, make([]byte, 4097))
		wantErrno(t, err, syscall.EINVAL)
		_, err = e.s.Create(e.ctx, &metapb.CreateRequest{Caller: &metapb.Caller{Session: session}, Parent: d, Name: "noino",
			Mode: 0o644, InlineData: []byte("x")})
		wantErrno(t, err, syscall.EINVAL)
		for _, name := range []string{"big", "noino"} {
			_, err := e.s.Lookup(e.ctx, &metapb.LookupRequest{Caller: root, Parent: d, Name: name})
			wantErrno(t, err, syscall.ENOENT)
		}
		r, err := create("f", first+1, []byte("hello"))
		if err != nil {
			t.Fatal(err)
		}
		if a := r.Attr; a.Size != 5 || a.Stored != 5 || a.MtimeNs != 77 || a.CtimeNs != 77 || a.AtimeNs != 42 {
			t.Fatalf("create with inline data answered %v", a)
		}
		e.restart()
		s, err := e.s.GetStripes(e.ctx, &metapb.GetStripesRequest{Ino: first + 1})
		if err != nil || len(s.Stripes) != 1 {
			t.Fatalf("get stripes: %v %v", s, err)
		}
		if si := s.Stripes[0]; si.Version != 1 || string(si.InlineData) != "hello" || si.Length != 5 {
			t.Fatalf("the created file's stripe reads back as %v", si)
		}
		c, err := e.s.CommitStripes(e.ctx, &metapb.CommitStripesRequest{Ino: first + 1, Size: 6,
			Stripes: []*metapb.StripeCommit{{Stripe: 0, ExpectedVersion: 1, Length: 6, Inline: true, Data: []byte("hello!")}}})
		if err != nil || len(c.ConflictStripes) != 0 || c.Versions[0] != 2 || c.Attr.Size != 6 || c.Attr.Stored != 6 {
			t.Fatalf("commit on the created version: %v, %v", c, err)
		}
	})
}

// TestInlinePatchCommits covers inline commits that send only what changed
// (StripeCommit.patch): the checks on their patches, the bytes they make
// over the expected version (cut, grown with zeros, rewritten), a patch over
// a stripe that was never written, and a patch over a stripe on shards,
// which is a conflict.
func TestInlinePatchCommits(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		f := smallFile(t, e)
		patch := func(expected, length uint64, patches ...*metapb.InlinePatch) (*metapb.CommitStripesReply, error) {
			return e.s.CommitStripes(e.ctx, &metapb.CommitStripesRequest{Ino: f, Size: length,
				Stripes: []*metapb.StripeCommit{{Stripe: 0, ExpectedVersion: expected, Length: length, Inline: true, Patch: true, Patches: patches}}})
		}
		at := func(off uint64, s string) *metapb.InlinePatch {
			return &metapb.InlinePatch{Offset: off, Data: []byte(s)}
		}
		read := func() *metapb.StripeInfo {
			t.Helper()
			r, err := e.s.GetStripes(e.ctx, &metapb.GetStripesRequest{Ino: f})
			if err != nil || len(r.Stripes) != 1 {
				t.Fatalf("get stripes: %v %v", r, err)
			}
			return r.Stripes[0]
		}
		// Bad patches change nothing.
		for _, bad := range []*metapb.StripeCommit{
			{Stripe: 0, Length: 4, Inline: true, Patch: true, Patches: []*metapb.InlinePatch{at(2, "abc")}},        // past the length
			{Stripe: 0, Length: 4, Inline: true, Patch: true, Patches: []*metapb.InlinePatch{at(5, "")}},           // starts past it
			{Stripe: 0, Length: 4, Inline: true, Patch: true, Data: []byte("abcd")},                                // data too
			{Stripe: 0, Length: 4, Inline: true, Data: []byte("abcd"), Patches: []*metapb.InlinePatch{at(0, "x")}}, // not marked
			{Stripe: 0, Length: 4097, Inline: true, Patch: true},                                                   // past the inline size
		} {
			_, err := e.s.CommitStripes(e.ctx, &metapb.CommitStripesRequest{Ino: f, Size: bad.Length, Stripes: []*metapb.StripeCommit{bad}})
			wantErrno(t, err, syscall.EINVAL)
		}
		many := make([]*metapb.InlinePatch, MaxInlinePatches+1)
		for i := range many {
			many[i] = at(0, "x")
		}
		_, err := patch(0, 4, many...)
		wantErrno(t, err, syscall.EINVAL)

		// Over a stripe never written: the patches over zeros.
		r, err := patch(0, 8, at(2, "ab"), at(6, "cd"))
		if err != nil {
			t.Fatal(err)
		}
		v := r.Versions[0]
		if si := read(); si.Version != v || !bytes.Equal(si.InlineData, []byte("\x00\x00ab\x00\x00cd")) || si.Length != 8 {
			t.Fatalf("patch over nothing reads back as %q (version %d, want %d)", si.InlineData, si.Version, v)
		}
		// Grown: the old bytes, zeros, then the patch; later patches win.
		if r, err = patch(v, 12, at(9, "xyz"), at(0, "AB"), at(1, "Q")); err != nil {
			t.Fatal(err)
		}
		v = r.Versions[0]
		if si := read(); !bytes.Equal(si.InlineData, []byte("AQab\x00\x00cd\x00xyz")) || r.Attr.Size != 12 {
			t.Fatalf("grown patch reads back as %q, size %d", si.InlineData, r.Attr.Size)
		}
		// Cut at meta: other bytes, so another version; a patch built on
		// the uncut bytes conflicts instead of landing on the cut ones.
		if _, err := e.s.SetAttr(e.ctx, &metapb.SetAttrRequest{Ino: f, SetSize: true, Size: 5}); err != nil {
			t.Fatal(err)
		}
		si := read()
		if si.Version <= v || !bytes.Equal(si.InlineData, []byte("AQab\x00")) {
			t.Fatalf("inline stripe cut to 5 bytes: version %d (was %d), %q", si.Version, v, si.InlineData)
		}
		if _, err := patch(v, 12, at(0, "A")); status(err) != codes.Aborted {
			t.Fatalf("patch over the uncut version: %v", err)
		}
		// Grown back by a patch over the cut version: zeros, not the old bytes.
		if r, err = patch(si.Version, 12, at(11, "!")); err != nil {
			t.Fatal(err)
		}
		v = r.Versions[0]
		if si := read(); !bytes.Equal(si.InlineData, []byte("AQab\x00\x00\x00\x00\x00\x00\x00!")) {
			t.Fatalf("patch over the cut version reads back as %q", si.InlineData)
		}
		// A stale expected version loses the compare-and-set.
		if _, err := patch(v-1, 5, at(0, "z")); status(err) != codes.Aborted {
			t.Fatalf("patch over a stale version: %v", err)
		}
		// Over a stripe on shards the writer's bytes are stale: a conflict,
		// and the stripe stays as it is.
		g := e.grant(f, 0)
		if err := e.commit(f, g, v, 64<<10, 64<<10); err != nil {
			t.Fatal(err)
		}
		if _, err := patch(g.Version, 5, at(0, "z")); status(err) != codes.Aborted {
			t.Fatalf("patch over a sharded stripe: %v", err)
		}
		if si := read(); si.Version != g.Version || len(si.Shards) != 6 {
			t.Fatalf("sharded stripe after a refused patch: %v", si)
		}
	})
}
