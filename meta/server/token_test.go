package server_test

import (
	"context"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/meta/auth"
	"github.com/rdmafs/rdmafs/meta/client"
	"github.com/rdmafs/rdmafs/meta/core"
	"github.com/rdmafs/rdmafs/meta/metapb"
	"github.com/rdmafs/rdmafs/meta/metatest"
)

// TestMountTokens checks what meta enforces of a mount token: its mount's
// root is the token's subdirectory; inodes outside it cannot be used, by
// number or by a path that leaves it; a read-only token changes nothing;
// root is squashed to nobody; membership and administration are refused; a
// token with a MAC of another secret is refused outright.
func TestMountTokens(t *testing.T) {
	m := metatest.Start(t, metatest.Options{})
	full := m.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	root := &metapb.Caller{Uid: 0, Gid: 0}
	mkdir := func(parent uint64, name string) uint64 {
		r, err := full.Mkdir(ctx, &metapb.MkdirRequest{Caller: root, Parent: parent, Name: name, Mode: 0o777})
		if err != nil {
			t.Fatal(err)
		}
		return r.Attr.Ino
	}
	projects := mkdir(core.RootIno, "projects")
	a := mkdir(projects, "a")
	sub := mkdir(a, "sub")
	other := mkdir(core.RootIno, "other")
	secretFile, err := full.Create(ctx, &metapb.CreateRequest{Caller: root, Parent: other, Name: "payroll", Mode: 0o644})
	if err != nil {
		t.Fatal(err)
	}
	inside, err := full.Create(ctx, &metapb.CreateRequest{Caller: root, Parent: sub, Name: "notes", Mode: 0o666})
	if err != nil {
		t.Fatal(err)
	}

	dialToken := func(tok auth.Token, secret string) *client.Client {
		t.Helper()
		id, _ := auth.NewTokenID()
		tok.ID = id
		s, err := auth.IssueToken(secret, tok)
		if err != nil {
			t.Fatal(err)
		}
		file := t.TempDir() + "/token"
		writePrivate(t, file, s)
		mt, err := auth.ReadTokenFile(file)
		if err != nil {
			t.Fatal(err)
		}
		c, err := client.DialToken(m.Addr, mt.Grant, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	errno := func(err error) syscall.Errno { return client.Errno(err) }

	rw := dialToken(auth.Token{Subdir: "/projects/a", SquashRoot: true}, m.Secret)
	sess, err := rw.StartSession(ctx, "token test", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close(ctx)
	if sess.RootIno() != a {
		t.Fatalf("session root %d, want the token's subdirectory %d", sess.RootIno(), a)
	}
	// Inside: lookups, reads and creates work; root is squashed.
	if _, err := rw.Lookup(ctx, &metapb.LookupRequest{Caller: root, Parent: a, Name: "sub"}); err != nil {
		t.Fatalf("lookup inside: %v", err)
	}
	if _, err := rw.GetAttr(ctx, &metapb.GetAttrRequest{Ino: inside.Attr.Ino}); err != nil {
		t.Fatalf("getattr of a file below the subdirectory: %v", err)
	}
	made, err := rw.Create(ctx, &metapb.CreateRequest{Caller: root, Parent: sub, Name: "by-root", Mode: 0o644})
	if err != nil {
		t.Fatalf("create inside: %v", err)
	}
	if made.Attr.Uid != auth.Squashed || made.Attr.Gid != auth.Squashed {
		t.Fatalf("root's file owned by %d:%d on a root-squashing token, want %d", made.Attr.Uid, made.Attr.Gid, auth.Squashed)
	}
	// Outside: by inode number and by the parent of the subdirectory.
	for name, err := range map[string]error{
		"getattr of the root":          second(rw.GetAttr(ctx, &metapb.GetAttrRequest{Ino: core.RootIno})),
		"lookup in the parent":         second(rw.Lookup(ctx, &metapb.LookupRequest{Caller: root, Parent: projects, Name: "a"})),
		"getattr of a file outside":    second(rw.GetAttr(ctx, &metapb.GetAttrRequest{Ino: secretFile.Attr.Ino})),
		"readdir outside":              second(rw.ReadDir(ctx, &metapb.ReadDirRequest{Caller: root, Ino: other})),
		"rename out of the subdir":     second(rw.Rename(ctx, &metapb.RenameRequest{Caller: root, Parent: sub, Name: "notes", NewParent: other, NewName: "x"})),
		"open a file outside by inode": second(rw.Open(ctx, &metapb.OpenRequest{Caller: root, Ino: secretFile.Attr.Ino, SessionId: sess.ID()})),
	} {
		if errno(err) != syscall.EACCES {
			t.Errorf("%s: %v, want EACCES", name, err)
		}
	}
	// A call without a caller acts as root: on a squashing token, as nobody.
	if _, err := rw.SetAttr(ctx, &metapb.SetAttrRequest{Ino: inside.Attr.Ino, SetMode: true, Mode: 0o4755}); errno(err) != syscall.EPERM {
		t.Errorf("setattr without a caller on a root-squashing token: %v, want EPERM (nobody does not own the file)", err)
	}
	// Sessions of others: the full client's session may not be named.
	victim, err := full.StartSession(ctx, "victim", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer victim.Close(ctx)
	for name, err := range map[string]error{
		"close another's session":       second(rw.CloseSession(ctx, &metapb.CloseSessionRequest{SessionId: victim.ID()})),
		"keep another's session alive":  second(rw.KeepAlive(ctx, &metapb.KeepAliveRequest{SessionId: victim.ID()})),
		"release in another's session":  second(rw.Release(ctx, &metapb.ReleaseRequest{Ino: inside.Attr.Ino, SessionId: victim.ID()})),
		"truncate in another's session": second(rw.SetAttr(ctx, &metapb.SetAttrRequest{Caller: root, Ino: inside.Attr.Ino, SetSize: true, SessionId: victim.ID()})),
		"lock in another's session": second(rw.Lock(ctx, &metapb.LockRequest{Ino: inside.Attr.Ino,
			Lock: &metapb.FileLock{Session: victim.ID(), Owner: 1, Type: metapb.LockType_LOCK_UNLOCK}})),
		"release an inode outside": second(rw.Release(ctx, &metapb.ReleaseRequest{Ino: inside.Attr.Ino, SessionId: sess.ID(),
			More: []uint64{secretFile.Attr.Ino}})),
	} {
		if errno(err) != syscall.EACCES {
			t.Errorf("%s: %v, want EACCES", name, err)
		}
	}
	if _, err := full.KeepAlive(ctx, &metapb.KeepAliveRequest{SessionId: victim.ID()}); err != nil {
		t.Fatalf("the victim's session after the token's attempts: %v", err)
	}
	// File data needs an open in one of the token's sessions (for writing, an
	// open for writing): data calls carry no caller to check.
	if _, err := rw.GetStripes(ctx, &metapb.GetStripesRequest{Ino: inside.Attr.Ino}); errno(err) != syscall.EACCES {
		t.Errorf("stripes of a file the token has not opened: %v, want EACCES", err)
	}
	if _, err := rw.Open(ctx, &metapb.OpenRequest{Caller: root, Ino: inside.Attr.Ino, SessionId: sess.ID(), Flags: syscall.O_RDONLY}); err != nil {
		t.Fatal(err)
	}
	if _, err := rw.GetStripes(ctx, &metapb.GetStripesRequest{Ino: inside.Attr.Ino}); err != nil {
		t.Errorf("stripes of a file open in the token's session: %v", err)
	}
	if _, err := rw.GrantWrite(ctx, &metapb.GrantWriteRequest{Ino: inside.Attr.Ino}); errno(err) != syscall.EACCES {
		t.Errorf("write grant on a file opened only for reading: %v, want EACCES", err)
	}
	// Not a mount's business.
	if _, err := rw.Status(ctx, &metapb.StatusRequest{}); errno(err) != syscall.EPERM {
		t.Errorf("status with a token: %v, want EPERM", err)
	}
	if _, err := rw.Register(ctx, &metapb.RegisterRequest{}); errno(err) != syscall.EPERM {
		t.Errorf("register a chunkserver with a token: %v, want EPERM", err)
	}

	ro := dialToken(auth.Token{Subdir: "/projects/a", ReadOnly: true}, m.Secret)
	if _, err := ro.Lookup(ctx, &metapb.LookupRequest{Caller: root, Parent: a, Name: "sub"}); err != nil {
		t.Fatalf("lookup with a read-only token: %v", err)
	}
	roSess, err := ro.StartSession(ctx, "read-only", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer roSess.Close(ctx)
	if _, err := ro.Open(ctx, &metapb.OpenRequest{Caller: root, Ino: inside.Attr.Ino, SessionId: roSess.ID(), Flags: syscall.O_RDONLY}); err != nil {
		t.Fatalf("open for reading with a read-only token: %v", err)
	}
	for name, err := range map[string]error{
		"write lock": second(ro.Lock(ctx, &metapb.LockRequest{Ino: inside.Attr.Ino,
			Lock: &metapb.FileLock{Session: roSess.ID(), Owner: 1, Type: metapb.LockType_LOCK_WRITE, End: 100}})),
		"create":           second(ro.Create(ctx, &metapb.CreateRequest{Caller: root, Parent: sub, Name: "no", Mode: 0o644})),
		"unlink":           second(ro.Unlink(ctx, &metapb.UnlinkRequest{Caller: root, Parent: sub, Name: "notes"})),
		"setattr":          second(ro.SetAttr(ctx, &metapb.SetAttrRequest{Caller: root, Ino: inside.Attr.Ino, SetMode: true, Mode: 0o600})),
		"open for writing": second(ro.Open(ctx, &metapb.OpenRequest{Caller: root, Ino: inside.Attr.Ino, SessionId: roSess.ID(), Flags: syscall.O_WRONLY})),
		"grant a write":    second(ro.GrantWrite(ctx, &metapb.GrantWriteRequest{Ino: inside.Attr.Ino})),
	} {
		if errno(err) != syscall.EROFS {
			t.Errorf("%s with a read-only token: %v, want EROFS", name, err)
		}
	}

	forged := dialToken(auth.Token{Subdir: "/"}, "another cluster's secret, long enough")
	if _, err := forged.GetAttr(ctx, &metapb.GetAttrRequest{Ino: core.RootIno}); err == nil {
		t.Fatal("a token made with another secret was accepted")
	}
}

func second[T any](_ T, err error) error { return err }

// writePrivate writes s to a new file at path with mode 0600.
func writePrivate(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
}
