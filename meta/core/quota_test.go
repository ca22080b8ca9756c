package core

import (
	"fmt"
	"syscall"
	"testing"

	"github.com/rdmafs/rdmafs/meta/metapb"
)

func (e *env) quota(req *metapb.QuotaRequest) *metapb.QuotaInfo {
	e.t.Helper()
	req.Op = metapb.QuotaRequest_GET
	r, err := e.s.Quota(e.ctx, req)
	if err != nil {
		e.t.Fatal(err)
	}
	return r.Quotas[0]
}

func TestQuotas(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		e.chunkservers(8)
		sb := uint64(4 * 64 << 10)
		d := e.mkdir(root, RootIno, "d", 0o777)
		sub := e.mkdir(alice, d, "sub", 0o777)
		old := e.create(alice, sub, "old", 0o644)
		if err := e.commit(old, e.grant(old, 0), 0, 1000, 1000); err != nil {
			t.Fatal(err)
		}

		// Setting a quota counts what is there; only root may.
		_, err := e.s.Quota(e.ctx, &metapb.QuotaRequest{Caller: alice, Op: metapb.QuotaRequest_SET, Ino: d, InodeLimit: 5})
		wantErrno(t, err, syscall.EPERM)
		if _, err := e.s.Quota(e.ctx, &metapb.QuotaRequest{Op: metapb.QuotaRequest_SET, Ino: d, InodeLimit: 5, SpaceLimit: 2 * sb}); err != nil {
			t.Fatal(err)
		}
		if _, err := e.s.Quota(e.ctx, &metapb.QuotaRequest{Op: metapb.QuotaRequest_SET, ByUid: true, Id: alice.Uid, SpaceLimit: 10 * sb}); err != nil {
			t.Fatal(err)
		}
		if q := e.quota(&metapb.QuotaRequest{Ino: d}); q.InodesUsed != 2 || q.SpaceUsed != 1000 || q.Path != "/d" {
			t.Fatalf("quota of d after set: %+v", q)
		}
		if q := e.quota(&metapb.QuotaRequest{ByUid: true, Id: alice.Uid}); q.InodesUsed != 2 || q.SpaceUsed != 1000 {
			t.Fatalf("alice's quota: %+v", q)
		}

		// Inodes: creates stop at the limit with EDQUOT.
		f := e.create(alice, sub, "f", 0o644)
		e.create(alice, d, "g", 0o644)
		e.mkdir(alice, d, "h", 0o755)
		_, err = e.s.Create(e.ctx, &metapb.CreateRequest{Caller: alice, Parent: sub, Name: "x", Mode: 0o644, Exclusive: true})
		wantErrno(t, err, syscall.EDQUOT)
		out := e.mkdir(root, RootIno, "out", 0o777)
		if _, err := e.s.Create(e.ctx, &metapb.CreateRequest{Caller: root, Parent: out, Name: "outside", Mode: 0o644}); err != nil {
			t.Fatalf("create outside d: %v", err)
		}

		// Space: a write is granted while usage is under the limit; the
		// grant that crosses it is committed, the next refused.
		g := e.grant(f, 0)
		if err := e.commit(f, g, 0, sb, sb); err != nil {
			t.Fatal(err)
		}
		g = e.grant(f, 1)
		if err := e.commit(f, g, 0, sb, 2*sb); err != nil {
			t.Fatal(err)
		}
		_, err = e.s.GrantWrite(e.ctx, &metapb.GrantWriteRequest{Ino: f, Stripes: []uint64{2}})
		wantErrno(t, err, syscall.EDQUOT)
		if q := e.quota(&metapb.QuotaRequest{Ino: d}); q.InodesUsed != 5 || q.SpaceUsed != 1000+2*sb {
			t.Fatalf("quota of d at the limits: %+v", q)
		}
		// df below d shows the quota.
		fsr, err := e.s.StatFS(e.ctx, &metapb.StatFSRequest{Ino: sub})
		if err != nil || fsr.Blocks*fsr.BlockSize != 2*sb || fsr.BlocksAvail != 0 || fsr.Files != 5 || fsr.FilesFree != 0 {
			t.Fatalf("statfs below the quota: %+v %v", fsr, err)
		}

		// Deleting frees; truncating frees; a file moved out takes its usage.
		if _, err := e.s.Unlink(e.ctx, &metapb.UnlinkRequest{Caller: alice, Parent: sub, Name: "old"}); err != nil {
			t.Fatal(err)
		}
		if _, err := e.s.SetAttr(e.ctx, &metapb.SetAttrRequest{Caller: alice, Ino: f, SetSize: true, Size: sb}); err != nil {
			t.Fatal(err)
		}
		if q := e.quota(&metapb.QuotaRequest{Ino: d}); q.InodesUsed != 4 || q.SpaceUsed != sb {
			t.Fatalf("after unlink and truncate: %+v", q)
		}
		if _, err := e.s.Rename(e.ctx, &metapb.RenameRequest{Caller: alice, Parent: sub, Name: "f", NewParent: out, NewName: "f"}); err != nil {
			t.Fatal(err)
		}
		if q := e.quota(&metapb.QuotaRequest{Ino: d}); q.InodesUsed != 3 || q.SpaceUsed != 0 {
			t.Fatalf("after moving f out: %+v", q)
		}
		if q := e.quota(&metapb.QuotaRequest{ByUid: true, Id: alice.Uid}); q.InodesUsed != 4 || q.SpaceUsed != sb {
			t.Fatalf("alice's quota (f moved, still hers): %+v", q)
		}
		// A directory does not move across directory quotas.
		_, err = e.s.Rename(e.ctx, &metapb.RenameRequest{Caller: alice, Parent: d, Name: "h", NewParent: out, NewName: "h"})
		wantErrno(t, err, syscall.EXDEV)

		// Usage survives a restart and matches a recount; drift is fixed.
		e.restart()
		r, err := e.s.Quota(e.ctx, &metapb.QuotaRequest{Op: metapb.QuotaRequest_CHECK})
		if err != nil || len(r.Fixed) != 0 || len(r.Quotas) != 2 {
			t.Fatalf("check after restart: %+v %v", r, err)
		}
		if err := e.store.Update(e.ctx, func(t kvTxn) error {
			return putMsg(t, []byte(fmt.Sprintf("Q%s", string(u64be(d)))), &metapb.QuotaRecord{InodeLimit: 5, SpaceLimit: 2 * sb, InodesUsed: 99})
		}); err != nil {
			t.Fatal(err)
		}
		r, err = e.s.Quota(e.ctx, &metapb.QuotaRequest{Op: metapb.QuotaRequest_CHECK, Ino: d})
		if err != nil || len(r.Fixed) != 1 {
			t.Fatalf("check of drift: %+v %v", r, err)
		}
		if q := e.quota(&metapb.QuotaRequest{Ino: d}); q.InodesUsed != 3 || q.SpaceUsed != 0 {
			t.Fatalf("after check: %+v", q)
		}
		// Deleted, the quota no longer limits.
		if _, err := e.s.Quota(e.ctx, &metapb.QuotaRequest{Op: metapb.QuotaRequest_DELETE, Ino: d}); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 5; i++ {
			e.create(alice, d, fmt.Sprint("n", i), 0o644)
		}
	})
}

func u64be(v uint64) []byte {
	b := make([]byte, 8)
	for i := 7; i >= 0; i-- {
		b[i] = byte(v)
		v >>= 8
	}
	return b
}
