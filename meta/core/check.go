package core

import (
	"context"
	"fmt"
	"syscall"

	"google.golang.org/protobuf/proto"

	"github.com/rdmafs/rdmafs/meta/keys"
	"github.com/rdmafs/rdmafs/meta/kv"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// Check verifies the invariants that tie the namespace records together, in
// one consistent snapshot, and returns a description of every violation
// (none means consistent): every entry points to an existing inode of its
// type and has its readdir index record; link counts match the entries
// (2 + subdirectories for directories); every directory but the root has
// exactly one entry and records its parent; inodes without links are open
// orphans; stripes belong to existing regular files, whose stored bytes
// are their stripes' lengths.
func (s *Service) Check(ctx context.Context) ([]string, error) {
	var problems []string
	report := func(format string, args ...any) {
		if len(problems) < 1000 {
			problems = append(problems, fmt.Sprintf(format, args...))
		}
	}
	err := s.view(ctx, func(r kv.Reader) error {
		problems = problems[:0]
		inodes := map[uint64]*metapb.InodeRecord{}
		if err := r.Scan(keys.InodePrefix(), []byte{keys.PrefixInode + 1}, 0, func(k, v []byte) error {
			ino, err := keys.ParseInode(k)
			if err != nil {
				return err
			}
			rec := &metapb.InodeRecord{}
			if err := proto.Unmarshal(v, rec); err != nil {
				return fmt.Errorf("inode %d: %w", ino, err)
			}
			if rec.Attr == nil || rec.Attr.Ino != ino {
				report("inode key %d holds attributes of inode %d", ino, rec.GetAttr().GetIno())
				return nil
			}
			inodes[ino] = rec
			return nil
		}); err != nil {
			return err
		}
		links := map[uint64]uint32{}
		subdirs := map[uint64]uint32{}
		parentOf := map[uint64]uint64{}
		maxCookie := map[uint64]uint64{}
		if err := r.Scan([]byte{keys.PrefixDentry}, []byte{keys.PrefixDentry + 1}, 0, func(k, v []byte) error {
			parent, name, err := keys.ParseDentry(k)
			if err != nil {
				return err
			}
			d := &metapb.DentryRecord{}
			if err := proto.Unmarshal(v, d); err != nil {
				return fmt.Errorf("entry %d/%q: %w", parent, name, err)
			}
			p, ok := inodes[parent]
			if !ok || !isDir(p.Attr) {
				report("entry %q in %d: parent is not an existing directory", name, parent)
			}
			child, ok := inodes[d.Ino]
			if !ok {
				report("entry %q in %d: inode %d does not exist", name, parent, d.Ino)
				return nil
			}
			if fileType(child.Attr.Mode) != d.Type {
				report("entry %q in %d: type %o, inode %d has %o", name, parent, d.Type, d.Ino, fileType(child.Attr.Mode))
			}
			links[d.Ino]++
			if isDir(child.Attr) {
				subdirs[parent]++
				parentOf[d.Ino] = parent
			}
			maxCookie[parent] = max(maxCookie[parent], d.Cookie)
			cr := &metapb.CookieRecord{}
			if ok, err := getMsg(r, keys.Cookie(parent, d.Cookie), cr); err != nil {
				return err
			} else if !ok || cr.Name != name || cr.Ino != d.Ino || cr.Type != d.Type {
				report("entry %q in %d: readdir record of cookie %d is %v", name, parent, d.Cookie, cr)
			}
			return nil
		}); err != nil {
			return err
		}
		cookies := 0
		if err := r.Scan([]byte{keys.PrefixCookie}, []byte{keys.PrefixCookie + 1}, 0, func(k, v []byte) error {
			cookies++
			return nil
		}); err != nil {
			return err
		}
		entries := 0
		for _, n := range links {
			entries += int(n)
		}
		if cookies != entries {
			report("%d readdir records for %d entries", cookies, entries)
		}
		for ino, rec := range inodes {
			a := rec.Attr
			if isDir(a) {
				if ino == RootIno {
					if links[ino] != 0 {
						report("root directory has %d entries naming it", links[ino])
					}
				} else if a.Nlink > 0 && (links[ino] != 1 || parentOf[ino] != rec.Parent) {
					report("directory %d: %d entries name it, parent %d recorded %d", ino, links[ino], parentOf[ino], rec.Parent)
				}
				if a.Nlink > 0 && a.Nlink != 2+subdirs[ino] {
					report("directory %d: nlink %d with %d subdirectories", ino, a.Nlink, subdirs[ino])
				}
				if mc := maxCookie[ino]; mc != 0 && rec.NextCookie <= mc {
					report("directory %d: next cookie %d not above %d", ino, rec.NextCookie, mc)
				}
			} else if a.Nlink != links[ino] {
				report("inode %d: nlink %d with %d entries", ino, a.Nlink, links[ino])
			}
			if a.Nlink == 0 {
				_, orphan, err := r.Get(keys.Orphan(ino))
				if err != nil {
					return err
				}
				open, err := isOpen(r, ino)
				if err != nil {
					return err
				}
				if !orphan || !open {
					report("inode %d has no links but orphan=%v open=%v", ino, orphan, open)
				}
			}
		}
		stored := map[uint64]uint64{}
		if err := r.Scan([]byte{keys.PrefixStripe}, []byte{keys.PrefixStripe + 1}, 0, func(k, v []byte) error {
			ino, stripe, err := keys.ParseStripe(k)
			if err != nil {
				return err
			}
			if rec, ok := inodes[ino]; !ok || fileType(rec.Attr.Mode) != syscall.S_IFREG {
				report("stripe %d of inode %d: not an existing regular file", stripe, ino)
			}
			st := &metapb.StripeRecord{}
			if err := proto.Unmarshal(v, st); err != nil {
				return fmt.Errorf("stripe %d of inode %d: %w", stripe, ino, err)
			}
			if st.Version > 0 {
				stored[ino] += st.Length
			}
			return nil
		}); err != nil {
			return err
		}
		for ino, rec := range inodes {
			if a := rec.Attr; a.StoredKnown && a.Stored != stored[ino] {
				report("inode %d records %d bytes stored, its stripes hold %d", ino, a.Stored, stored[ino])
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return problems, nil
}
