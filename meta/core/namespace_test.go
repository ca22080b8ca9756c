package core

import (
	"fmt"
	"sort"
	"strings"
	"syscall"
	"testing"

	"github.com/rdmafs/rdmafs/meta/metapb"
)

func TestCreateAndLookupErrors(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		pub := e.mkdir(root, RootIno, "pub", 0o777)
		priv := e.mkdir(root, RootIno, "priv", 0o700)
		noexec := e.mkdir(root, RootIno, "noexec", 0o666)
		file := e.create(root, pub, "file", 0o644)
		gone := e.mkdir(root, pub, "gone", 0o777)
		if _, err := e.s.Rmdir(e.ctx, &metapb.RmdirRequest{Parent: pub, Name: "gone"}); err != nil {
			t.Fatal(err)
		}
		long := strings.Repeat("x", 255)
		tests := []struct {
			name   string
			c      *metapb.Caller
			parent uint64
			file   string
			excl   bool
			want   syscall.Errno
		}{
			{"ok", alice, pub, "a", true, 0},
			{"255-byte name", alice, pub, long, true, 0},
			{"256-byte name", alice, pub, long + "y", true, syscall.ENAMETOOLONG},
			{"exclusive existing", alice, pub, "file", true, syscall.EEXIST},
			{"non-exclusive existing opens", root, pub, "file", false, 0},
			{"dot", alice, pub, ".", true, syscall.EINVAL},
			{"dotdot", alice, pub, "..", true, syscall.EINVAL},
			{"slash", alice, pub, "a/b", true, syscall.EINVAL},
			{"empty", alice, pub, "", true, syscall.EINVAL},
			{"parent is a file", alice, file, "x", true, syscall.ENOTDIR},
			{"parent missing", alice, 999999, "x", true, syscall.ENOENT},
			{"parent removed", alice, gone, "x", true, syscall.ENOENT},
			{"no write permission", alice, priv, "x", true, syscall.EACCES},
			{"no search permission", alice, noexec, "x", true, syscall.EACCES},
			{"root ignores modes", root, priv, "x", true, 0},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				r, err := e.s.Create(e.ctx, &metapb.CreateRequest{Caller: tt.c, Parent: tt.parent, Name: tt.file, Mode: 0o640, Exclusive: tt.excl})
				wantErrno(t, err, tt.want)
				if err != nil {
					return
				}
				if tt.file == "file" && r.Attr.Ino != file {
					t.Fatalf("non-exclusive create returned inode %d, want existing %d", r.Attr.Ino, file)
				}
				ino, err := e.lookup(tt.parent, tt.file)
				if err != nil || ino != r.Attr.Ino {
					t.Fatalf("lookup = %d, %v; want %d", ino, err, r.Attr.Ino)
				}
				a := e.attr(ino)
				if a.Mode&syscall.S_IFMT != syscall.S_IFREG || a.Nlink != 1 || a.Layout == nil {
					t.Fatalf("attr %+v", a)
				}
				if tt.file != "file" && (a.Uid != tt.c.Uid || a.Gid != tt.c.Gid || a.Mode&0o7777 != 0o640) {
					t.Fatalf("owner/mode %d:%d %o", a.Uid, a.Gid, a.Mode)
				}
			})
		}
		lookups := []struct {
			name   string
			c      *metapb.Caller
			parent uint64
			file   string
			want   syscall.Errno
		}{
			{"missing", alice, pub, "nope", syscall.ENOENT},
			{"no search permission", alice, noexec, "x", syscall.EACCES},
			{"not a directory", alice, file, "x", syscall.ENOTDIR},
			{"name too long", alice, pub, long + "z", syscall.ENAMETOOLONG},
		}
		for _, tt := range lookups {
			_, err := e.s.Lookup(e.ctx, &metapb.LookupRequest{Caller: tt.c, Parent: tt.parent, Name: tt.file})
			t.Run("lookup "+tt.name, func(t *testing.T) { wantErrno(t, err, tt.want) })
		}
		wantErrno(t, func() error { _, err := e.s.GetAttr(e.ctx, &metapb.GetAttrRequest{Ino: 424242}); return err }(), syscall.ENOENT)
	})
}

func TestCreateCreateDirectoryExisting(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		e.mkdir(root, RootIno, "d", 0o755)
		_, err := e.s.Create(e.ctx, &metapb.CreateRequest{Parent: RootIno, Name: "d", Mode: 0o644})
		wantErrno(t, err, syscall.EISDIR)
	})
}

func TestMknod(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		d := e.mkdir(root, RootIno, "d", 0o777)
		tests := []struct {
			name string
			c    *metapb.Caller
			mode uint32
			rdev uint32
			want syscall.Errno
		}{
			{"fifo", alice, syscall.S_IFIFO | 0o644, 0, 0},
			{"socket", alice, syscall.S_IFSOCK | 0o644, 0, 0},
			{"regular", alice, syscall.S_IFREG | 0o644, 0, 0},
			{"no type means regular", alice, 0o644, 0, 0},
			{"char device as root", root, syscall.S_IFCHR | 0o600, 0x0103, 0},
			{"block device as root", root, syscall.S_IFBLK | 0o600, 0x0801, 0},
			{"char device as user", alice, syscall.S_IFCHR | 0o600, 0x0103, syscall.EPERM},
			{"directory type", alice, syscall.S_IFDIR | 0o755, 0, syscall.EINVAL},
		}
		for i, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				name := fmt.Sprintf("n%d", i)
				r, err := e.s.Mknod(e.ctx, &metapb.MknodRequest{Caller: tt.c, Parent: d, Name: name, Mode: tt.mode, Rdev: tt.rdev})
				wantErrno(t, err, tt.want)
				if err != nil {
					return
				}
				typ := tt.mode & syscall.S_IFMT
				if typ == 0 {
					typ = syscall.S_IFREG
				}
				if r.Attr.Mode&syscall.S_IFMT != typ || r.Attr.Rdev != tt.rdev {
					t.Fatalf("mode %o rdev %x", r.Attr.Mode, r.Attr.Rdev)
				}
				_, err = e.s.Mknod(e.ctx, &metapb.MknodRequest{Caller: tt.c, Parent: d, Name: name, Mode: tt.mode})
				wantErrno(t, err, syscall.EEXIST)
			})
		}
	})
}

func TestMkdirRmdirUnlink(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		d := e.mkdir(root, RootIno, "d", 0o755)
		if n := e.attr(RootIno).Nlink; n != 3 {
			t.Fatalf("root nlink %d after mkdir, want 3", n)
		}
		if a := e.attr(d); a.Nlink != 2 || a.Mode != syscall.S_IFDIR|0o755 {
			t.Fatalf("new dir %+v", a)
		}
		sub := e.mkdir(root, d, "sub", 0o755)
		e.create(root, sub, "f", 0o644)
		e.create(root, d, "file", 0o644)
		e.mkdir(root, RootIno, "empty", 0o755)
		tests := []struct {
			name   string
			rmdir  bool
			parent uint64
			file   string
			want   syscall.Errno
		}{
			{"rmdir non-empty", true, RootIno, "d", syscall.ENOTEMPTY},
			{"rmdir file", true, d, "file", syscall.ENOTDIR},
			{"rmdir dot", true, d, ".", syscall.EINVAL},
			{"rmdir dotdot", true, d, "..", syscall.ENOTEMPTY},
			{"rmdir missing", true, d, "nope", syscall.ENOENT},
			{"unlink directory", false, RootIno, "empty", syscall.EISDIR},
			{"unlink missing", false, d, "nope", syscall.ENOENT},
			{"unlink file", false, d, "file", 0},
			{"unlink again", false, d, "file", syscall.ENOENT},
			{"rmdir empty", true, RootIno, "empty", 0},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				var err error
				if tt.rmdir {
					_, err = e.s.Rmdir(e.ctx, &metapb.RmdirRequest{Caller: root, Parent: tt.parent, Name: tt.file})
				} else {
					_, err = e.s.Unlink(e.ctx, &metapb.UnlinkRequest{Caller: root, Parent: tt.parent, Name: tt.file})
				}
				wantErrno(t, err, tt.want)
			})
		}
		if n := e.attr(RootIno).Nlink; n != 3 {
			t.Fatalf("root nlink %d after rmdir, want 3", n)
		}
		_, err := e.s.Unlink(e.ctx, &metapb.UnlinkRequest{Caller: alice, Parent: sub, Name: "f"})
		wantErrno(t, err, syscall.EACCES)
	})
}

func TestHardLinks(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		d := e.mkdir(root, RootIno, "d", 0o755)
		f := e.create(root, d, "f", 0o644)
		before := e.attr(f).CtimeNs
		e.clock.Advance(1e9)
		tests := []struct {
			name   string
			ino    uint64
			parent uint64
			file   string
			want   syscall.Errno
		}{
			{"link", f, RootIno, "l1", 0},
			{"second link", f, d, "l2", 0},
			{"name exists", f, d, "f", syscall.EEXIST},
			{"to directory", d, RootIno, "dl", syscall.EPERM},
			{"into non-directory", f, f, "x", syscall.ENOTDIR},
			{"missing inode", 777777, d, "x", syscall.ENOENT},
		}
		for _, tt := range tests {
			_, err := e.s.Link(e.ctx, &metapb.LinkRequest{Caller: root, Ino: tt.ino, NewParent: tt.parent, NewName: tt.file})
			t.Run(tt.name, func(t *testing.T) { wantErrno(t, err, tt.want) })
		}
		a := e.attr(f)
		if a.Nlink != 3 || a.CtimeNs <= before {
			t.Fatalf("after links nlink=%d ctime %d (before %d)", a.Nlink, a.CtimeNs, before)
		}
		for i, name := range []string{"f", "l2"} {
			if _, err := e.s.Unlink(e.ctx, &metapb.UnlinkRequest{Parent: d, Name: name}); err != nil {
				t.Fatal(err)
			}
			if n := e.attr(f).Nlink; n != uint32(2-i) {
				t.Fatalf("nlink %d after unlinking %s", n, name)
			}
		}
		if _, err := e.s.Unlink(e.ctx, &metapb.UnlinkRequest{Parent: RootIno, Name: "l1"}); err != nil {
			t.Fatal(err)
		}
		_, err := e.s.GetAttr(e.ctx, &metapb.GetAttrRequest{Ino: f})
		wantErrno(t, err, syscall.ENOENT)
	})
}

func TestSymlink(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		f := e.create(root, RootIno, "f", 0o644)
		tests := []struct {
			name, target string
			want         syscall.Errno
		}{
			{"relative", "f", 0},
			{"absolute long path", "/" + strings.Repeat("a/", 2000), 0},
			{"empty", "", syscall.ENOENT},
			{"too long", strings.Repeat("a", SymlinkMax+1), syscall.ENAMETOOLONG},
		}
		for i, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				r, err := e.s.Symlink(e.ctx, &metapb.SymlinkRequest{Caller: alice, Parent: RootIno, Name: fmt.Sprintf("s%d", i), Target: tt.target})
				if tt.want == 0 && err != nil {
					// root is 0755 root-owned: alice may not write; use root.
					wantErrno(t, err, syscall.EACCES)
					r, err = e.s.Symlink(e.ctx, &metapb.SymlinkRequest{Caller: root, Parent: RootIno, Name: fmt.Sprintf("s%d", i), Target: tt.target})
				}
				wantErrno(t, err, tt.want)
				if err != nil {
					return
				}
				if r.Attr.Mode != syscall.S_IFLNK|0o777 || r.Attr.Size != uint64(len(tt.target)) {
					t.Fatalf("attr %+v", r.Attr)
				}
				got, err := e.s.Readlink(e.ctx, &metapb.ReadlinkRequest{Ino: r.Attr.Ino})
				if err != nil || got.Target != tt.target {
					t.Fatalf("readlink %q, %v", got.GetTarget(), err)
				}
			})
		}
		_, err := e.s.Readlink(e.ctx, &metapb.ReadlinkRequest{Ino: f})
		wantErrno(t, err, syscall.EINVAL)
	})
}

func TestRename(t *testing.T) {
	// Each case starts from a fresh tree:
	//   /a/file /a/file2 /a/hl (hard link of file) /a/emptydir /a/full/x /a/sub/ /b/
	tests := []struct {
		name  string
		from  func(s setup) (uint64, string)
		to    func(s setup) (uint64, string)
		flags uint32
		want  syscall.Errno
		check func(t *testing.T, e *env, s setup)
	}{
		{"simple", at("a", "file"), at("a", "renamed"), 0, 0, func(t *testing.T, e *env, s setup) {
			mustLookup(t, e, s.a, "renamed", s.file)
			mustMissing(t, e, s.a, "file")
		}},
		{"across directories", at("a", "file"), at("b", "moved"), 0, 0, func(t *testing.T, e *env, s setup) {
			mustLookup(t, e, s.b, "moved", s.file)
		}},
		{"over a file", at("a", "file"), at("a", "file2"), 0, 0, func(t *testing.T, e *env, s setup) {
			mustLookup(t, e, s.a, "file2", s.file)
			if _, err := e.s.GetAttr(e.ctx, &metapb.GetAttrRequest{Ino: s.file2}); err == nil {
				t.Fatal("replaced file still exists")
			}
		}},
		{"directory over empty directory", at("a", "sub"), at("a", "emptydir"), 0, 0, func(t *testing.T, e *env, s setup) {
			mustLookup(t, e, s.a, "emptydir", s.sub)
			if n := e.attr(s.a).Nlink; n != 4 { // ., .., full, emptydir(=sub)
				t.Fatalf("parent nlink %d, want 4", n)
			}
		}},
		{"directory across directories", at("a", "sub"), at("b", "sub"), 0, 0, func(t *testing.T, e *env, s setup) {
			if na, nb := e.attr(s.a).Nlink, e.attr(s.b).Nlink; na != 4 || nb != 3 {
				t.Fatalf("nlink a=%d b=%d, want 4 and 3", na, nb)
			}
		}},
		{"directory over non-empty directory", at("a", "sub"), at("a", "full"), 0, syscall.ENOTEMPTY, nil},
		{"directory over file", at("a", "sub"), at("a", "file"), 0, syscall.ENOTDIR, nil},
		{"file over directory", at("a", "file"), at("a", "emptydir"), 0, syscall.EISDIR, nil},
		{"missing source", at("a", "nope"), at("a", "x"), 0, syscall.ENOENT, nil},
		{"directory under itself", at("a", "full"), func(s setup) (uint64, string) { return s.full, "loop" }, 0, syscall.EINVAL, nil},
		{"directory onto itself as parent", func(s setup) (uint64, string) { return RootIno, "a" }, func(s setup) (uint64, string) { return s.sub, "a" }, 0, syscall.EINVAL, nil},
		{"hard links of one inode", at("a", "file"), at("a", "hl"), 0, 0, func(t *testing.T, e *env, s setup) {
			mustLookup(t, e, s.a, "file", s.file) // POSIX: nothing happens
			mustLookup(t, e, s.a, "hl", s.file)
		}},
		{"noreplace onto existing", at("a", "file"), at("a", "file2"), uint32(metapb.RenameFlag_RENAME_NOREPLACE), syscall.EEXIST, nil},
		{"noreplace onto new", at("a", "file"), at("a", "new"), uint32(metapb.RenameFlag_RENAME_NOREPLACE), 0, nil},
		{"exchange files", at("a", "file"), at("a", "file2"), uint32(metapb.RenameFlag_RENAME_EXCHANGE), 0, func(t *testing.T, e *env, s setup) {
			mustLookup(t, e, s.a, "file", s.file2)
			mustLookup(t, e, s.a, "file2", s.file)
		}},
		{"exchange file and directory across directories", at("a", "sub"), func(s setup) (uint64, string) { return RootIno, "b" }, uint32(metapb.RenameFlag_RENAME_EXCHANGE), 0, func(t *testing.T, e *env, s setup) {
			mustLookup(t, e, RootIno, "b", s.sub)
			mustLookup(t, e, s.a, "sub", s.b)
			if n := e.attr(RootIno).Nlink; n != 4 {
				t.Fatalf("root nlink %d", n)
			}
		}},
		{"exchange with missing", at("a", "file"), at("a", "nope"), uint32(metapb.RenameFlag_RENAME_EXCHANGE), syscall.ENOENT, nil},
		{"exchange parent with child", func(s setup) (uint64, string) { return RootIno, "a" }, at("a", "sub"), uint32(metapb.RenameFlag_RENAME_EXCHANGE), syscall.EINVAL, nil},
		{"exchange and noreplace", at("a", "file"), at("a", "file2"), 3, syscall.EINVAL, nil},
		{"whiteout", at("a", "file"), at("a", "w"), uint32(metapb.RenameFlag_RENAME_WHITEOUT), syscall.EINVAL, nil},
		{"target parent is a file", at("a", "file"), func(s setup) (uint64, string) { return s.file2, "x" }, 0, syscall.ENOTDIR, nil},
		{"invalid new name", at("a", "file"), at("a", ".."), 0, syscall.EINVAL, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, e *env) {
				var s setup
				s.a = e.mkdir(root, RootIno, "a", 0o755)
				s.b = e.mkdir(root, RootIno, "b", 0o755)
				s.file = e.create(root, s.a, "file", 0o644)
				s.file2 = e.create(root, s.a, "file2", 0o644)
				if _, err := e.s.Link(e.ctx, &metapb.LinkRequest{Ino: s.file, NewParent: s.a, NewName: "hl"}); err != nil {
					t.Fatal(err)
				}
				s.emptyDir = e.mkdir(root, s.a, "emptydir", 0o755)
				s.full = e.mkdir(root, s.a, "full", 0o755)
				e.create(root, s.full, "x", 0o644)
				s.sub = e.mkdir(root, s.a, "sub", 0o755)
				fp, fn := tt.from(s)
				tp, tn := tt.to(s)
				_, err := e.s.Rename(e.ctx, &metapb.RenameRequest{Caller: root, Parent: fp, Name: fn, NewParent: tp, NewName: tn, Flags: tt.flags})
				wantErrno(t, err, tt.want)
				if tt.check != nil {
					tt.check(t, e, s)
				}
				if err != nil {
					mustLookup(t, e, s.a, "file", s.file) // failed renames change nothing
				}
			})
		})
	}
}

// setup holds the inodes of the tree each rename case starts from.
type setup struct {
	a, b, sub, file, file2, emptyDir, full uint64
}

func at(dir, name string) func(s setup) (uint64, string) {
	return func(s setup) (uint64, string) {
		if dir == "a" {
			return s.a, name
		}
		return s.b, name
	}
}

func mustLookup(t *testing.T, e *env, parent uint64, name string, want uint64) {
	t.Helper()
	got, err := e.lookup(parent, name)
	if err != nil || got != want {
		t.Fatalf("lookup %q = %d, %v; want %d", name, got, err, want)
	}
}

func mustMissing(t *testing.T, e *env, parent uint64, name string) {
	t.Helper()
	_, err := e.lookup(parent, name)
	wantErrno(t, err, syscall.ENOENT)
}

func TestReadDirCookiesStable(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		d := e.mkdir(root, RootIno, "d", 0o755)
		for i := 0; i < 60; i++ {
			e.create(root, d, fmt.Sprintf("f%02d", i), 0o644)
		}
		seen := map[string]int{}
		cookie := uint64(0)
		removed := map[string]bool{}
		for page := 0; ; page++ {
			r, err := e.s.ReadDir(e.ctx, &metapb.ReadDirRequest{Caller: alice, Ino: d, Cookie: cookie, Limit: 10, Plus: true})
			if err != nil {
				t.Fatal(err)
			}
			for _, en := range r.Entries {
				seen[en.Name]++
				if en.Cookie <= cookie || en.Attr == nil || en.Attr.Ino != en.Ino || en.Type != syscall.S_IFREG {
					t.Fatalf("entry %+v after cookie %d", en, cookie)
				}
				cookie = en.Cookie
			}
			// Concurrent changes between pages: remove entries not yet
			// listed, add new ones, rename one that was listed.
			victim := fmt.Sprintf("f%02d", 59-page)
			if _, ok := seen[victim]; !ok && page < 5 {
				if _, err := e.s.Unlink(e.ctx, &metapb.UnlinkRequest{Parent: d, Name: victim}); err != nil {
					t.Fatal(err)
				}
				removed[victim] = true
			}
			e.create(root, d, fmt.Sprintf("new%d", page), 0o644)
			if r.Eof {
				break
			}
		}
		for i := 0; i < 60; i++ {
			n := fmt.Sprintf("f%02d", i)
			if removed[n] {
				if seen[n] != 0 {
					t.Fatalf("%s listed after its removal", n)
				}
				continue
			}
			if seen[n] != 1 {
				t.Fatalf("%s listed %d times", n, seen[n])
			}
		}
		for n, c := range seen {
			if c != 1 {
				t.Fatalf("%s listed %d times", n, c)
			}
		}
		got := e.names(d)
		if !sort.StringsAreSorted(got[:60-len(removed)]) {
			t.Fatalf("fresh listing not in creation order: %v", got)
		}
		if len(got) != 60-len(removed)+countNew(got) || countNew(got) == 0 {
			t.Fatalf("fresh listing has %d entries", len(got))
		}
		priv := e.mkdir(root, RootIno, "priv", 0o700)
		_, err := e.s.ReadDir(e.ctx, &metapb.ReadDirRequest{Caller: alice, Ino: priv})
		wantErrno(t, err, syscall.EACCES)
		f := e.create(root, RootIno, "file", 0o644)
		_, err = e.s.ReadDir(e.ctx, &metapb.ReadDirRequest{Ino: f})
		wantErrno(t, err, syscall.ENOTDIR)
	})
}

func countNew(names []string) int {
	n := 0
	for _, s := range names {
		if strings.HasPrefix(s, "new") {
			n++
		}
	}
	return n
}

func TestDirectoryTimesAndPersistence(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *env) {
		before := e.attr(RootIno)
		e.clock.Advance(2e9)
		d := e.mkdir(root, RootIno, "d", 0o755)
		after := e.attr(RootIno)
		if after.MtimeNs <= before.MtimeNs || after.CtimeNs <= before.CtimeNs {
			t.Fatal("mkdir did not update the parent's mtime and ctime")
		}
		f := e.create(root, d, "f", 0o644)
		e.restart()
		mustLookup(t, e, RootIno, "d", d)
		mustLookup(t, e, d, "f", f)
		if got := e.names(d); len(got) != 1 || got[0] != "f" {
			t.Fatalf("names after restart %v", got)
		}
		// Inode numbers are never reused after a restart.
		if g := e.create(root, d, "g", 0o644); g <= f {
			t.Fatalf("inode %d allocated after %d", g, f)
		}
	})
}
