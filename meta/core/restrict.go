package core

import (
	"bytes"
	"context"
	"path"
	"strings"
	"sync"
	"syscall"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/rdmafs/rdmafs/meta/auth"
	"github.com/rdmafs/rdmafs/meta/keys"
	"github.com/rdmafs/rdmafs/meta/kv"
	"github.com/rdmafs/rdmafs/meta/metaerr"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// What a call made with a mount token may do, by method. Methods not listed
// (chunkserver membership, repair, administration, layouts) are refused.
type tokenRule uint8

const (
	tokenRead      tokenRule = iota + 1 // reads the namespace: inodes checked
	tokenWrite                          // changes it: inodes checked, refused read-only
	tokenSession                        // names no inode
	tokenData                           // file data: the inode must be open in one of the token's sessions
	tokenDataWrite                      // likewise, opened for writing; refused read-only
)

var tokenRules = map[string]tokenRule{
	"Lookup": tokenRead, "GetAttr": tokenRead, "Readlink": tokenRead, "ReadDir": tokenRead,
	"GetXattr": tokenRead, "ListXattr": tokenRead, "Open": tokenRead, "Release": tokenRead,
	"Lock": tokenRead, "GetLayout": tokenRead, "Info": tokenRead, "GetStripes": tokenData,
	"SetAttr": tokenWrite, "Create": tokenWrite, "Mknod": tokenWrite, "Mkdir": tokenWrite,
	"Symlink": tokenWrite, "Link": tokenWrite, "Unlink": tokenWrite, "Rmdir": tokenWrite,
	"Rename": tokenWrite, "SetXattr": tokenWrite, "RemoveXattr": tokenWrite,
	"Snapshot": tokenWrite, "RemoveTree": tokenWrite,
	"GrantWrite": tokenDataWrite, "CommitStripes": tokenDataWrite, "ReplaceShards": tokenDataWrite,
	"OpenSession": tokenSession, "KeepAlive": tokenSession, "CloseSession": tokenSession,
	"StatFS": tokenSession, "Sync": tokenSession,
}

// inodeFields are the request fields that name an inode a token's mount
// must be allowed to use.
var inodeFields = []protoreflect.Name{"ino", "parent", "new_parent", "src", "dst_parent"}

// maxDepth bounds the walk from an inode up to its token's subdirectory.
const maxDepth = 4096

// tokenStates is what the service keeps of each mount token seen: the inode
// of its subdirectory and the inodes its mounts may use. An inode is allowed
// once it is the subdirectory, lies below it (directories by their parent
// chain, files by the directory they were created in or last renamed into),
// or was returned to the token's mount by a call on an allowed inode
// (a lookup or readdir: how a hard link into the subtree is reached).
type tokenStates struct {
	mu sync.Mutex
	m  map[[8]byte]*tokenState
}

type tokenState struct {
	mu       sync.Mutex
	root     uint64 // 0 until resolved
	allowed  map[uint64]struct{}
	sessions map[uint64]struct{} // sessions known to be the token's
}

func (ts *tokenStates) get(id [8]byte) *tokenState {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if ts.m == nil {
		ts.m = make(map[[8]byte]*tokenState)
	}
	st := ts.m[id]
	if st == nil {
		st = &tokenState{allowed: make(map[uint64]struct{}), sessions: make(map[uint64]struct{})}
		ts.m[id] = st
	}
	return st
}

// Restrict enforces the mount token t on a call of method (the RPC's name)
// with req before it runs: methods outside a mount's fail with EPERM,
// changes under a read-only token with EROFS, inodes outside its
// subdirectory with EACCES; and root's uid and gid in the request's caller
// become Squashed under a root-squashing token. Admitted must follow a
// successful call.
func (s *Service) Restrict(ctx context.Context, t *auth.Token, method string, req proto.Message) error {
	rule := tokenRules[method]
	switch {
	case rule == 0:
		return metaerr.New(syscall.EPERM, "%s is not allowed with a mount token (token %x)", method, t.ID)
	case (rule == tokenWrite || rule == tokenDataWrite) && t.ReadOnly:
		return metaerr.New(syscall.EROFS, "mount token %x is read-only", t.ID)
	case method == "Open" && t.ReadOnly:
		if f := req.(*metapb.OpenRequest).Flags; f&syscall.O_ACCMODE != syscall.O_RDONLY || f&syscall.O_TRUNC != 0 {
			return metaerr.New(syscall.EROFS, "mount token %x is read-only", t.ID)
		}
	}
	m := req.ProtoReflect()
	if fd := m.Descriptor().Fields().ByName("caller"); fd != nil && t.SquashRoot {
		// A request without a caller acts as root: it gets nobody too.
		if !m.Has(fd) {
			m.Set(fd, protoreflect.ValueOfMessage((&metapb.Caller{}).ProtoReflect()))
		}
		squash(m.Get(fd).Message().Interface().(*metapb.Caller))
	}
	// A token's mount answers no create before meta (reserve.go): it holds
	// no names, and its calls are not those of a session holding some.
	if fd := m.Descriptor().Fields().ByName("caller"); fd != nil && m.Has(fd) {
		m.Get(fd).Message().Interface().(*metapb.Caller).Session = 0
	}
	if r, ok := req.(*metapb.LookupRequest); ok {
		r.Reserve, r.Lease = false, false
	}
	if r, ok := req.(*metapb.GetAttrRequest); ok {
		r.LeaseSession = 0
	}
	st := s.tokens.get(t.ID)
	if _, err := s.tokenRoot(ctx, t, st); err != nil {
		return err
	}
	for _, id := range sessionsOf(m) {
		if err := s.ownSession(ctx, t, st, id); err != nil {
			return err
		}
	}
	if rule == tokenSession {
		return nil
	}
	for _, name := range inodeFields {
		fd := m.Descriptor().Fields().ByName(name)
		if fd == nil || fd.Kind() != protoreflect.Uint64Kind {
			continue
		}
		if ino := m.Get(fd).Uint(); ino != 0 {
			if err := s.allow(ctx, t, st, ino); err != nil {
				return err
			}
		}
	}
	if r, ok := req.(*metapb.ReleaseRequest); ok {
		for _, ino := range r.More {
			if err := s.allow(ctx, t, st, ino); err != nil {
				return err
			}
		}
	}
	if rule == tokenData || rule == tokenDataWrite {
		// These calls carry no caller: the permission check is the open's,
		// made for the caller who opened the file.
		ino := m.Get(m.Descriptor().Fields().ByName("ino")).Uint()
		if err := s.openedByToken(ctx, t, st, ino, rule == tokenDataWrite); err != nil {
			return err
		}
	}
	if r, ok := req.(*metapb.LockRequest); ok && t.ReadOnly && r.GetLock().GetType() == metapb.LockType_LOCK_WRITE {
		return metaerr.New(syscall.EROFS, "mount token %x is read-only: no write locks", t.ID)
	}
	return nil
}

// openedByToken reports whether one of t's sessions has ino open (for
// writing if write).
func (s *Service) openedByToken(ctx context.Context, t *auth.Token, st *tokenState, ino uint64, write bool) error {
	found := false
	err := s.view(ctx, func(r kv.Reader) error {
		found = false
		return opensOf(r, ino, func(session uint64, w bool) error {
			if write && !w {
				return nil
			}
			_, owned, err := st.owns(r, t, session)
			if err == nil && owned {
				found = true
				return kv.ErrStop
			}
			return err
		})
	})
	if err != nil {
		return err
	}
	if !found {
		how := "open"
		if write {
			how = "open for writing"
		}
		return metaerr.New(syscall.EACCES, "inode %d is not %s in a session of mount token %x", ino, how, t.ID)
	}
	return nil
}

// owns reports whether session id exists and whether it was opened with t,
// from the sessions st knows or the session's record in r (remembered when
// it was).
func (st *tokenState) owns(r kv.Reader, t *auth.Token, id uint64) (exists, owned bool, err error) {
	st.mu.Lock()
	_, ok := st.sessions[id]
	st.mu.Unlock()
	if ok {
		return true, true, nil
	}
	var rec metapb.SessionRecord
	if exists, err = getMsg(r, keys.Session(id), &rec); err != nil || !exists {
		return exists, false, err
	}
	if !bytes.Equal(rec.TokenId, t.ID[:]) {
		return true, false, nil
	}
	st.mu.Lock()
	st.sessions[id] = struct{}{}
	st.mu.Unlock()
	return true, true, nil
}

// sessionsOf returns the session ids a request names: its session_id, and a
// lock's session.
func sessionsOf(m protoreflect.Message) []uint64 {
	var out []uint64
	if fd := m.Descriptor().Fields().ByName("session_id"); fd != nil && fd.Kind() == protoreflect.Uint64Kind {
		if id := m.Get(fd).Uint(); id != 0 {
			out = append(out, id)
		}
	}
	if r, ok := m.Interface().(*metapb.LockRequest); ok && r.GetLock().GetSession() != 0 {
		out = append(out, r.GetLock().GetSession())
	}
	return out
}

// ownSession reports whether session id was opened with token t: a token's
// calls may name only its own sessions (their opens, locks and lifetime).
func (s *Service) ownSession(ctx context.Context, t *auth.Token, st *tokenState, id uint64) error {
	st.mu.Lock()
	_, known := st.sessions[id]
	st.mu.Unlock()
	if known {
		return nil // no transaction for the common case
	}
	var exists, owned bool
	err := s.view(ctx, func(r kv.Reader) error {
		var err error
		exists, owned, err = st.owns(r, t, id)
		return err
	})
	switch {
	case err != nil:
		return err
	case !exists:
		return metaerr.New(syscall.ESTALE, "session %d expired or unknown", id)
	case !owned:
		return metaerr.New(syscall.EACCES, "session %d was not opened with mount token %x", id, t.ID)
	}
	return nil
}

// Admitted records the inodes a successful call under t returned (its
// reply's "ino" fields at any depth): they were reached from an allowed
// directory. For OpenSession it sets the reply's root inode.
func (s *Service) Admitted(t *auth.Token, reply proto.Message) {
	st := s.tokens.get(t.ID)
	st.mu.Lock()
	defer st.mu.Unlock()
	if r, ok := reply.(*metapb.OpenSessionReply); ok {
		r.RootIno = st.root
		return
	}
	collectInodes(reply.ProtoReflect(), st.rememberLocked)
}

// maxAllowed bounds a token's set of allowed inodes: past it the set starts
// again from the subdirectory. Inodes below it are allowed again by their
// parent chain; one reached through a hard link from outside needs a new
// lookup, which the kernel makes when its entry times out.
const maxAllowed = 1 << 20

// rememberLocked adds ino to the allowed set (st.mu held).
func (st *tokenState) rememberLocked(ino uint64) {
	if len(st.allowed) >= maxAllowed {
		clear(st.allowed)
		if st.root != 0 {
			st.allowed[st.root] = struct{}{}
		}
	}
	st.allowed[ino] = struct{}{}
}

// collectInodes calls remember with the "ino" field of every message in m.
func collectInodes(m protoreflect.Message, remember func(uint64)) {
	metapb.Walk(m, func(m protoreflect.Message) bool {
		if fd := m.Descriptor().Fields().ByName("ino"); fd != nil && fd.Kind() == protoreflect.Uint64Kind && !fd.IsList() && m.Has(fd) {
			remember(m.Get(fd).Uint())
		}
		return true
	})
}

func squash(c *metapb.Caller) {
	if c.Uid == 0 {
		c.Uid = auth.Squashed
	}
	if c.Gid == 0 {
		c.Gid = auth.Squashed
	}
	groups := c.Groups[:0]
	for _, g := range c.Groups {
		if g != 0 {
			groups = append(groups, g)
		}
	}
	c.Groups = groups
}

// tokenRoot returns the inode of t's subdirectory, resolving its path from
// the root the first time (a subdirectory renamed later stays the root, as an
// NFS export does).
func (s *Service) tokenRoot(ctx context.Context, t *auth.Token, st *tokenState) (uint64, error) {
	st.mu.Lock()
	root := st.root
	st.mu.Unlock()
	if root != 0 {
		return root, nil
	}
	ino := uint64(RootIno)
	err := s.view(ctx, func(r kv.Reader) error {
		for _, name := range strings.Split(strings.Trim(path.Clean(t.Subdir), "/"), "/") {
			if name == "" {
				continue
			}
			d, ok, err := getDentry(r, ino, name)
			if err != nil {
				return err
			}
			if !ok {
				return metaerr.New(syscall.ENOENT, "the subdirectory %s of mount token %x does not exist", t.Subdir, t.ID)
			}
			ino = d.Ino
		}
		rec, err := getInode(r, ino)
		if err != nil {
			return err
		}
		if !isDir(rec.Attr) {
			return metaerr.New(syscall.ENOTDIR, "the subdirectory %s of mount token %x is not a directory", t.Subdir, t.ID)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.root == 0 {
		st.root = ino
		st.allowed[ino] = struct{}{}
	}
	return st.root, nil
}

// allow reports whether t's mounts may use ino, and remembers a yes.
func (s *Service) allow(ctx context.Context, t *auth.Token, st *tokenState, ino uint64) error {
	st.mu.Lock()
	_, ok := st.allowed[ino]
	root := st.root
	st.mu.Unlock()
	if ok {
		return nil
	}
	below := false
	err := s.view(ctx, func(r kv.Reader) error {
		cur := ino
		for depth := 0; depth < maxDepth; depth++ {
			if cur == root {
				below = true
				return nil
			}
			if cur == RootIno || cur == 0 {
				return nil
			}
			rec, err := getInode(r, cur)
			if err != nil {
				return err
			}
			cur = rec.Parent
		}
		return nil
	})
	if err != nil {
		return err
	}
	if !below {
		return metaerr.New(syscall.EACCES, "inode %d is outside the subdirectory %s of mount token %x", ino, t.Subdir, t.ID)
	}
	st.mu.Lock()
	st.rememberLocked(ino)
	st.mu.Unlock()
	return nil
}
