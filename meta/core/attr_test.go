package core

import (
	"strings"
	"syscall"
	"testing"

	"github.com/rdmafs/rdmafs/meta/metapb"
)

func TestAllowed(t *testing.T) {
	a := &metapb.Attr{Mode: syscall.S_IFREG | 0o640, Uid: 1000, Gid: 1000}
	tests := []struct {
		name string
		c    *metapb.Caller
		mask uint32
		want bool
	}{
		{"owner read", alice, mayRead, true},
		{"owner write", alice, mayWrite, true},
		{"owner exec", alice, mayExec, false},
		{"group member via supplementary groups reads", bob, mayRead, true},
		{"group member writes", bob, mayWrite, false},
		{"other reads", carol, mayRead, false},
		{"root reads and writes", root, mayRead | mayWrite, true},
		{"root cannot exec without any x bit", root, mayExec, false},
	}
	for _, tt := range tests {
		if got := allowed(tt.c, a, tt.mask); got != tt.want {
			t.Errorf("%s: allowed = %v", tt.name, got)
		}
	}
}

func TestSetAttr(t *testing.T) {
	type tc struct {
		name  string
		c     *metapb.Caller
		req   *metapb.SetAttrRequest
		want  syscall.Errno
		check func(t *testing.T, a *metapb.Attr)
	}
	tests := []tc{
		{"chmod by owner", alice, &metapb.SetAttrRequest{SetMode: true, Mode: 0o600}, 0, func(t *testing.T, a *metapb.Attr) {
			if a.Mode != syscall.S_IFREG|0o600 {
				t.Fatalf("mode %o", a.Mode)
			}
		}},
		{"chmod keeps file type", root, &metapb.SetAttrRequest{SetMode: true, Mode: syscall.S_IFDIR | 0o644}, 0, func(t *testing.T, a *metapb.Attr) {
			if a.Mode != syscall.S_IFREG|0o644 {
				t.Fatalf("mode %o", a.Mode)
			}
		}},
		{"chmod by non-owner", carol, &metapb.SetAttrRequest{SetMode: true, Mode: 0o777}, syscall.EPERM, nil},
		{"chmod setgid by group member keeps it", alice, &metapb.SetAttrRequest{SetMode: true, Mode: 0o2755}, 0, func(t *testing.T, a *metapb.Attr) {
			if a.Mode&syscall.S_ISGID == 0 {
				t.Fatalf("mode %o lost setgid", a.Mode)
			}
		}},
		{"chown by user", alice, &metapb.SetAttrRequest{SetUid: true, Uid: 1002}, syscall.EPERM, nil},
		{"chown to same owner by owner", alice, &metapb.SetAttrRequest{SetUid: true, Uid: 1000}, 0, nil},
		{"chgrp to own group", alice, &metapb.SetAttrRequest{SetGid: true, Gid: 1000}, 0, nil},
		{"chgrp to foreign group", alice, &metapb.SetAttrRequest{SetGid: true, Gid: 1002}, syscall.EPERM, nil},
		{"chgrp by non-owner", bob, &metapb.SetAttrRequest{SetGid: true, Gid: 1000}, syscall.EPERM, nil},
		{"chown by root clears setuid", root, &metapb.SetAttrRequest{SetUid: true, Uid: 5, SetGid: true, Gid: 6}, 0, func(t *testing.T, a *metapb.Attr) {
			if a.Uid != 5 || a.Gid != 6 || a.Mode&(syscall.S_ISUID|syscall.S_ISGID) != 0 {
				t.Fatalf("after chown %d:%d mode %o", a.Uid, a.Gid, a.Mode)
			}
		}},
		{"truncate by owner", alice, &metapb.SetAttrRequest{SetSize: true, Size: 12345}, 0, func(t *testing.T, a *metapb.Attr) {
			if a.Size != 12345 || a.MtimeNs == 1700000000e9 {
				t.Fatalf("size %d mtime %d", a.Size, a.MtimeNs)
			}
		}},
		{"truncate without write permission", carol, &metapb.SetAttrRequest{SetSize: true, Size: 0}, syscall.EACCES, nil},
		{"explicit times by owner", alice, &metapb.SetAttrRequest{SetAtime: true, AtimeNs: 5, SetMtime: true, MtimeNs: 6}, 0, func(t *testing.T, a *metapb.Attr) {
			if a.AtimeNs != 5 || a.MtimeNs != 6 || a.CtimeNs <= 1700000000e9 {
				t.Fatalf("times %d %d %d", a.AtimeNs, a.MtimeNs, a.CtimeNs)
			}
		}},
		{"explicit times by non-owner with write", bob, &metapb.SetAttrRequest{SetMtime: true, MtimeNs: 6}, syscall.EPERM, nil},
		{"times now by non-owner with write", bob, &metapb.SetAttrRequest{SetMtime: true, MtimeNow: true, SetAtime: true, AtimeNow: true}, 0, nil},
		{"times now without write", carol, &metapb.SetAttrRequest{SetMtime: true, MtimeNow: true}, syscall.EACCES, nil},
		{"missing inode", root, &metapb.SetAttrRequest{Ino: 99999, SetMode: true}, syscall.ENOENT, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, e *env) {
				d := e.mkdir(root, RootIno, "d", 0o777)
				f := e.create(alice, d, "f", 0o664) // group 1000: bob is a member
				if _, err := e.s.SetAttr(e.ctx, &metapb.SetAttrRequest{Ino: f, SetMode: true, Mode: 0o6775}); err != nil {
					t.Fatal(err)
				}
				e.clock.Advance(1e9)
				if tt.req.Ino == 0 {
					tt.req.Ino = f
				}
				tt.req.Caller = tt.c
				r, err := e.s.SetAttr(e.ctx, tt.req)
				wantErrno(t, err, tt.want)
				if err != nil {
					return
				}
				if r.Attr.CtimeNs != e.clock.Now().UnixNano() {
					t.Fatalf("ctime %d not updated to %d", r.Attr.CtimeNs, e.clock.Now().UnixNano())
				}
				if tt.check != nil {
					tt.check(t, r.Attr)
				}
				if got := e.attr(f); got.Mode != r.Attr.Mode || got.Size != r.Attr.Size {
					t.Fatalf("stored attr %+v differs from reply %+v", got, r.Attr)
				}
			})
		})
	}
}

func TestSetAttrSpecialCases(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		d := e.mkdir(root, RootIno, "d", 0o777)
		// A non-member of the file's group loses setgid on chmod.
		f := e.create(root, d, "f", 0o644)
		if _, err := e.s.SetAttr(e.ctx, &metapb.SetAttrRequest{Ino: f, SetUid: true, Uid: 1002}); err != nil {
			t.Fatal(err)
		}
		r, err := e.s.SetAttr(e.ctx, &metapb.SetAttrRequest{Caller: carol, Ino: f, SetMode: true, Mode: 0o2755})
		if err != nil || r.Attr.Mode&syscall.S_ISGID != 0 {
			t.Fatalf("setgid kept for non-member: %o %v", r.GetAttr().GetMode(), err)
		}
		_, err = e.s.SetAttr(e.ctx, &metapb.SetAttrRequest{Ino: d, SetSize: true})
		wantErrno(t, err, syscall.EISDIR)
		fifo, err := e.s.Mknod(e.ctx, &metapb.MknodRequest{Parent: d, Name: "p", Mode: syscall.S_IFIFO | 0o644})
		if err != nil {
			t.Fatal(err)
		}
		_, err = e.s.SetAttr(e.ctx, &metapb.SetAttrRequest{Ino: fifo.Attr.Ino, SetSize: true})
		wantErrno(t, err, syscall.EINVAL)
		// ftruncate on a descriptor opened for writing needs no write
		// permission at truncate time.
		sess, err := e.s.OpenSession(e.ctx, &metapb.OpenSessionRequest{Client: "t"})
		if err != nil {
			t.Fatal(err)
		}
		cr, err := e.s.Create(e.ctx, &metapb.CreateRequest{Caller: alice, Parent: d, Name: "ro", Mode: 0o444, Exclusive: true, SessionId: sess.SessionId, OpenFlags: syscall.O_WRONLY})
		if err != nil {
			t.Fatal(err)
		}
		_, err = e.s.SetAttr(e.ctx, &metapb.SetAttrRequest{Caller: alice, Ino: cr.Attr.Ino, SetSize: true, Size: 10})
		wantErrno(t, err, syscall.EACCES)
		if _, err := e.s.SetAttr(e.ctx, &metapb.SetAttrRequest{Caller: alice, Ino: cr.Attr.Ino, SetSize: true, Size: 10, SessionId: sess.SessionId}); err != nil {
			t.Fatalf("ftruncate through an open handle: %v", err)
		}
	})
}

func TestStickyAndSetgidDirectories(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		tmp := e.mkdir(root, RootIno, "tmp", 0o1777)
		e.create(alice, tmp, "alices", 0o644)
		e.create(bob, tmp, "bobs", 0o644)
		tests := []struct {
			name string
			c    *metapb.Caller
			file string
			want syscall.Errno
		}{
			{"other user cannot unlink", carol, "alices", syscall.EPERM},
			{"other user cannot rename", carol, "bobs", syscall.EPERM},
			{"owner unlinks", alice, "alices", 0},
			{"root unlinks", root, "bobs", 0},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				var err error
				if strings.Contains(tt.name, "rename") {
					_, err = e.s.Rename(e.ctx, &metapb.RenameRequest{Caller: tt.c, Parent: tmp, Name: tt.file, NewParent: tmp, NewName: "x"})
				} else {
					_, err = e.s.Unlink(e.ctx, &metapb.UnlinkRequest{Caller: tt.c, Parent: tmp, Name: tt.file})
				}
				wantErrno(t, err, tt.want)
			})
		}
		sg := e.mkdir(root, RootIno, "sg", 0o777)
		if _, err := e.s.SetAttr(e.ctx, &metapb.SetAttrRequest{Ino: sg, SetGid: true, Gid: 4242, SetMode: true, Mode: 0o2777}); err != nil {
			t.Fatal(err)
		}
		f := e.create(alice, sg, "f", 0o644)
		sub := e.mkdir(alice, sg, "sub", 0o755)
		if a := e.attr(f); a.Gid != 4242 || a.Uid != 1000 {
			t.Fatalf("file in setgid dir: %d:%d", a.Uid, a.Gid)
		}
		if a := e.attr(sub); a.Gid != 4242 || a.Mode&syscall.S_ISGID == 0 {
			t.Fatalf("subdir of setgid dir: gid %d mode %o", a.Gid, a.Mode)
		}
	})
}

func TestXattrs(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		d := e.mkdir(root, RootIno, "d", 0o777)
		f := e.create(alice, d, "f", 0o644)
		sl, err := e.s.Symlink(e.ctx, &metapb.SymlinkRequest{Caller: alice, Parent: d, Name: "sl", Target: "f"})
		if err != nil {
			t.Fatal(err)
		}
		const create, replace = uint32(metapb.XattrFlag_XATTR_CREATE), uint32(metapb.XattrFlag_XATTR_REPLACE)
		set := func(c *metapb.Caller, ino uint64, name, val string, flags uint32) error {
			_, err := e.s.SetXattr(e.ctx, &metapb.SetXattrRequest{Caller: c, Ino: ino, Name: name, Value: []byte(val), Flags: flags})
			return err
		}
		get := func(c *metapb.Caller, ino uint64, name string) (string, error) {
			r, err := e.s.GetXattr(e.ctx, &metapb.GetXattrRequest{Caller: c, Ino: ino, Name: name})
			return string(r.GetValue()), err
		}
		steps := []struct {
			name string
			op   func() error
			want syscall.Errno
		}{
			{"set", func() error { return set(alice, f, "user.a", "1", 0) }, 0},
			{"create existing", func() error { return set(alice, f, "user.a", "2", create) }, syscall.EEXIST},
			{"replace existing", func() error { return set(alice, f, "user.a", "3", replace) }, 0},
			{"replace missing", func() error { return set(alice, f, "user.b", "x", replace) }, syscall.ENODATA},
			{"create new", func() error { return set(alice, f, "user.b", "", create) }, 0},
			{"both flags", func() error { return set(alice, f, "user.c", "", create|replace) }, syscall.EINVAL},
			{"get", func() error {
				v, err := get(carol, f, "user.a")
				if err == nil && v != "3" {
					t.Fatalf("value %q", v)
				}
				return err
			}, 0},
			{"get missing", func() error { _, err := get(alice, f, "user.zz"); return err }, syscall.ENODATA},
			{"set without write permission", func() error { return set(carol, f, "user.x", "", 0) }, syscall.EACCES},
			{"trusted as user", func() error { return set(alice, f, "trusted.x", "", 0) }, syscall.EPERM},
			{"trusted as root", func() error { return set(root, f, "trusted.x", "t", 0) }, 0},
			{"security as user", func() error { return set(alice, f, "security.x", "", 0) }, syscall.EPERM},
			{"unknown namespace", func() error { return set(alice, f, "foo.x", "", 0) }, syscall.EOPNOTSUPP},
			{"system namespace", func() error { return set(root, f, "system.posix_acl_access", "", 0) }, syscall.EOPNOTSUPP},
			{"bare prefix", func() error { return set(alice, f, "user.", "", 0) }, syscall.EOPNOTSUPP},
			{"name too long", func() error { return set(alice, f, "user."+strings.Repeat("n", 251), "", 0) }, syscall.ERANGE},
			{"value too big", func() error { return set(alice, f, "user.big", strings.Repeat("v", XattrValueMax+1), 0) }, syscall.E2BIG},
			{"largest value", func() error { return set(alice, f, "user.big", strings.Repeat("v", XattrValueMax), 0) }, 0},
			{"user xattr on symlink", func() error { return set(alice, sl.Attr.Ino, "user.x", "", 0) }, syscall.EPERM},
			{"remove", func() error {
				_, err := e.s.RemoveXattr(e.ctx, &metapb.RemoveXattrRequest{Caller: alice, Ino: f, Name: "user.b"})
				return err
			}, 0},
			{"remove missing", func() error {
				_, err := e.s.RemoveXattr(e.ctx, &metapb.RemoveXattrRequest{Caller: alice, Ino: f, Name: "user.b"})
				return err
			}, syscall.ENODATA},
			{"missing inode", func() error { return set(root, 98765, "user.a", "", 0) }, syscall.ENOENT},
			// kill_priv: the capabilities a write drops, for any writer.
			{"capabilities set by root", func() error { return set(root, f, "security.capability", "caps", 0) }, 0},
			{"capabilities removed by a writer", func() error {
				_, err := e.s.RemoveXattr(e.ctx, &metapb.RemoveXattrRequest{Caller: alice, Ino: f, Name: "security.capability"})
				return err
			}, syscall.EPERM},
			{"capabilities killed by a non-writer", func() error {
				_, err := e.s.RemoveXattr(e.ctx, &metapb.RemoveXattrRequest{Caller: carol, Ino: f, Name: "security.capability", KillPriv: true})
				return err
			}, syscall.EPERM},
			{"capabilities killed by a writer", func() error {
				_, err := e.s.RemoveXattr(e.ctx, &metapb.RemoveXattrRequest{Caller: alice, Ino: f, Name: "security.capability", KillPriv: true})
				return err
			}, 0},
			{"capabilities gone", func() error { _, err := get(root, f, "security.capability"); return err }, syscall.ENODATA},
			{"no capabilities to kill", func() error {
				_, err := e.s.RemoveXattr(e.ctx, &metapb.RemoveXattrRequest{Caller: alice, Ino: f, Name: "security.capability", KillPriv: true})
				return err
			}, syscall.ENODATA},
			{"kill_priv of another attribute", func() error {
				_, err := e.s.RemoveXattr(e.ctx, &metapb.RemoveXattrRequest{Caller: alice, Ino: f, Name: "user.a", KillPriv: true})
				return err
			}, syscall.EINVAL},
		}
		for _, st := range steps {
			t.Run(st.name, func(t *testing.T) { wantErrno(t, st.op(), st.want) })
		}
		// Setting and removing an attribute change the inode: its ctime.
		for _, op := range []func() error{
			func() error { return set(alice, f, "user.t", "v", 0) },
			func() error {
				_, err := e.s.RemoveXattr(e.ctx, &metapb.RemoveXattrRequest{Caller: alice, Ino: f, Name: "user.t"})
				return err
			},
		} {
			e.clock.Advance(1e9)
			if err := op(); err != nil {
				t.Fatal(err)
			}
			if a := e.attr(f); a.CtimeNs != e.clock.Now().UnixNano() {
				t.Fatalf("ctime %d after changing an xattr, want %d", a.CtimeNs, e.clock.Now().UnixNano())
			}
		}
		list := func(c *metapb.Caller) string {
			r, err := e.s.ListXattr(e.ctx, &metapb.ListXattrRequest{Caller: c, Ino: f})
			if err != nil {
				t.Fatal(err)
			}
			return strings.Join(r.Names, ",")
		}
		if got := list(root); got != "trusted.x,user.a,user.big" {
			t.Fatalf("root list %q", got)
		}
		if got := list(alice); got != "user.a,user.big" {
			t.Fatalf("user list %q", got)
		}
		// Removing the file removes its attributes.
		if _, err := e.s.Unlink(e.ctx, &metapb.UnlinkRequest{Parent: d, Name: "f"}); err != nil {
			t.Fatal(err)
		}
		_, err = e.s.ListXattr(e.ctx, &metapb.ListXattrRequest{Ino: f})
		wantErrno(t, err, syscall.ENOENT)
	})
}

func TestRenamePermissions(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		shared := e.mkdir(root, RootIno, "shared", 0o777)
		ro := e.mkdir(root, RootIno, "ro", 0o755)
		e.create(root, ro, "f", 0o644)
		e.create(alice, shared, "mine", 0o644)
		// A directory alice cannot write: she may not move it to another parent.
		e.mkdir(root, shared, "locked", 0o755)
		other := e.mkdir(alice, shared, "other", 0o755)
		tests := []struct {
			name  string
			c     *metapb.Caller
			fromP uint64
			from  string
			toP   uint64
			to    string
			want  syscall.Errno
		}{
			{"out of a read-only directory", alice, ro, "f", shared, "g", syscall.EACCES},
			{"into a read-only directory", alice, shared, "mine", ro, "mine", syscall.EACCES},
			{"directory she cannot write to a new parent", alice, shared, "locked", other, "locked", syscall.EACCES},
			{"same directory rename of that directory", alice, shared, "locked", shared, "locked2", 0},
			{"own file", alice, shared, "mine", other, "mine", 0},
		}
		for _, tt := range tests {
			_, err := e.s.Rename(e.ctx, &metapb.RenameRequest{Caller: tt.c, Parent: tt.fromP, Name: tt.from, NewParent: tt.toP, NewName: tt.to})
			t.Run(tt.name, func(t *testing.T) { wantErrno(t, err, tt.want) })
		}
	})
}
