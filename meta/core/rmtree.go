package core

import (
	"context"
	"syscall"

	"google.golang.org/protobuf/proto"

	"github.com/rdmafs/rdmafs/meta/keys"
	"github.com/rdmafs/rdmafs/meta/kv"
	"github.com/rdmafs/rdmafs/meta/metaerr"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// removal is what one RemoveTree call removes: entries of one directory,
// all files or one empty directory.
type removal struct {
	parent uint64
	names  []string
	inos   []uint64
	dir    bool
	root   bool // the entry is the tree's root: the tree is gone after it
}

// RemoveTree implements metapb.MetaServer (see metapb.RemoveTreeRequest).
// Each call finds the work of one batch in a read (the files of the first
// directory, depth first, whose first entries hold files, or an empty
// directory), then removes it in one transaction with the checks of unlink
// and rmdir; entries changed in between are left to the next call.
func (s *Service) RemoveTree(ctx context.Context, req *metapb.RemoveTreeRequest) (*metapb.RemoveTreeReply, error) {
	c := caller(req.Caller)
	if req.Name == "." || req.Name == ".." {
		return nil, metaerr.New(syscall.EINVAL, "rmr of %q", req.Name)
	}
	if err := checkName(req.Name); err != nil {
		return nil, err
	}
	var work removal
	if err := s.view(ctx, func(r kv.Reader) error {
		var err error
		work, err = planRemoval(r, req.Parent, req.Name, treeBatch(req.Batch))
		return err
	}); err != nil {
		return nil, err
	}
	if err := s.awaitDir(ctx, 0, work.parent); err != nil {
		return nil, err
	}
	if work.dir {
		if err := s.awaitDir(ctx, 0, work.inos[0]); err != nil {
			return nil, err
		}
	}
	out := &metapb.RemoveTreeReply{}
	var purged int64
	_, err := updateOnce(s, ctx, &out, func(t kv.Txn) error {
		out = &metapb.RemoveTreeReply{}
		purged = 0
		now := s.now().UnixNano()
		for i, name := range work.names {
			_, n, err := s.removeTxn(t, c, work.parent, name, work.dir, work.inos[i], now)
			switch metaerr.Errno(err) {
			case 0:
			case syscall.ENOENT, syscall.ENOTEMPTY, syscall.ENOTDIR, syscall.EISDIR:
				continue // changed since the plan: the next call sees it
			default:
				return err
			}
			purged += n
			if work.dir {
				out.Dirs++
			} else {
				out.Files++
			}
			out.Done = work.root
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	s.inodes.Add(-purged)
	return out, nil
}

// planRemoval finds the next batch of RemoveTree's work below parent/name.
func planRemoval(r kv.Reader, parent uint64, name string, batch int) (removal, error) {
	d, ok, err := getDentry(r, parent, name)
	if err != nil {
		return removal{}, err
	}
	if !ok {
		return removal{}, metaerr.New(syscall.ENOENT, "%q not found in directory %d", name, parent)
	}
	if d.Type != syscall.S_IFDIR {
		return removal{parent: parent, names: []string{name}, inos: []uint64{d.Ino}, root: true}, nil
	}
	root := true
	for depth := 0; depth < maxDepth; depth++ {
		files := removal{parent: d.Ino}
		var sub *metapb.DentryRecord
		var subName string
		prefix := keys.DentryPrefix(d.Ino)
		if err := r.Scan(prefix, kv.PrefixEnd(prefix), batch, func(k, v []byte) error {
			_, n, err := keys.ParseDentry(k)
			if err != nil {
				return err
			}
			e := &metapb.DentryRecord{}
			if err := proto.Unmarshal(v, e); err != nil {
				return err
			}
			if e.Type != syscall.S_IFDIR {
				files.names = append(files.names, n)
				files.inos = append(files.inos, e.Ino)
			} else if sub == nil {
				sub, subName = e, n
			}
			return nil
		}); err != nil {
			return removal{}, err
		}
		switch {
		case len(files.names) > 0:
			return files, nil
		case sub == nil:
			return removal{parent: parent, names: []string{name}, inos: []uint64{d.Ino}, dir: true, root: root}, nil
		}
		parent, name, d, root = d.Ino, subName, sub, false
	}
	return removal{}, metaerr.New(syscall.ELOOP, "rmr: tree deeper than %d directories", maxDepth)
}
