package core

import (
	"context"
	"fmt"
	"syscall"

	"google.golang.org/protobuf/proto"

	"github.com/rdmafs/rdmafs/meta/keys"
	"github.com/rdmafs/rdmafs/meta/kv"
	"github.com/rdmafs/rdmafs/meta/metaerr"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// maxProblems bounds the violations one check reports.
const maxProblems = 1000

// lostFound is the directory under the root where check's repair links the
// inodes no entry names.
const lostFound = "lost+found"

// finding is a violation the check found; fix, when set, is its safe
// repair: one transaction that first verifies that what the check saw has
// not changed since (a file's ctime, its link count), and says what it did.
type finding struct {
	text string
	fix  func(ctx context.Context) (string, error)
}

// Check implements metapb.MetaServer: it verifies the invariants that tie
// the namespace records together, in one consistent snapshot, and reports
// every violation (none means consistent): every entry points to an
// existing inode of its type and has its readdir index record; link counts
// match the entries (2 + subdirectories for directories); every directory
// but the root has exactly one entry and records its parent; inodes
// without links are open orphans; stripes belong to existing regular
// files, whose stored bytes are their stripes' lengths. With Repair it then
// applies the safe fixes: link counts set to the entries, inodes no entry
// names linked into /lost+found, entries of missing inodes removed,
// unopened inodes without links deleted, stripes of missing files deleted
// (their chunks collected), stored byte counts recomputed, chunk versions
// the chunkservers store (their lists after scrub passes) that nothing
// references queued for deletion.
func (s *Service) Check(ctx context.Context, req *metapb.CheckRequest) (*metapb.CheckReply, error) {
	found, notes, truncated, err := s.check(ctx)
	if err != nil {
		return nil, err
	}
	out := &metapb.CheckReply{Truncated: truncated, Notes: notes}
	for _, f := range found {
		out.Problems = append(out.Problems, f.text)
	}
	if !req.Repair {
		return out, nil
	}
	for _, f := range found {
		if f.fix == nil {
			continue
		}
		did, err := f.fix(ctx)
		if err != nil {
			return nil, fmt.Errorf("repair of %q: %w", f.text, err)
		}
		if did != "" {
			out.Repaired = append(out.Repaired, did)
			s.log.Warn("check: repaired", "problem", f.text, "repair", did)
		}
	}
	return out, nil
}

// check runs the checks of Check and returns what it found, notes on what
// it could not check, and whether it found more than maxProblems.
func (s *Service) check(ctx context.Context) ([]finding, []string, bool, error) {
	var problems []finding
	var notes []string
	// What repairs build, and the time, before the snapshot (see
	// inventoryFindings).
	began := s.now()
	s.repMu.Lock()
	repairs := s.repairChunksLocked()
	s.repMu.Unlock()
	truncated := false
	report := func(fix func(ctx context.Context) (string, error), format string, args ...any) {
		if len(problems) < maxProblems {
			problems = append(problems, finding{fmt.Sprintf(format, args...), fix})
		} else {
			truncated = true
		}
	}
	err := s.view(ctx, func(r kv.Reader) error {
		problems, truncated = problems[:0], false
		referenced := map[chunkRef]bool{}
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
				report(nil, "inode key %d holds attributes of inode %d", ino, rec.GetAttr().GetIno())
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
				report(nil, "entry %q in %d: parent is not an existing directory", name, parent)
			}
			child, ok := inodes[d.Ino]
			if !ok {
				report(s.fixDanglingEntry(parent, name, d), "entry %q in %d: inode %d does not exist", name, parent, d.Ino)
				return nil
			}
			if fileType(child.Attr.Mode) != d.Type {
				report(nil, "entry %q in %d: type %o, inode %d has %o", name, parent, d.Type, d.Ino, fileType(child.Attr.Mode))
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
				report(nil, "entry %q in %d: readdir record of cookie %d is %v", name, parent, d.Cookie, cr)
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
			report(nil, "%d readdir records for %d entries", cookies, entries)
		}
		for ino, rec := range inodes {
			a := rec.Attr
			if isDir(a) {
				if ino == RootIno {
					if links[ino] != 0 {
						report(nil, "root directory has %d entries naming it", links[ino])
					}
				} else if a.Nlink > 0 && (links[ino] != 1 || parentOf[ino] != rec.Parent) {
					var fix func(context.Context) (string, error)
					if links[ino] == 0 {
						fix = s.fixUnnamed(ino, a)
					}
					report(fix, "directory %d: %d entries name it, parent %d recorded %d", ino, links[ino], parentOf[ino], rec.Parent)
				}
				if a.Nlink > 0 && a.Nlink != 2+subdirs[ino] {
					report(s.fixNlink(ino, a, 2+subdirs[ino]), "directory %d: nlink %d with %d subdirectories", ino, a.Nlink, subdirs[ino])
				}
				if mc := maxCookie[ino]; mc != 0 && rec.NextCookie <= mc {
					report(nil, "directory %d: next cookie %d not above %d", ino, rec.NextCookie, mc)
				}
			} else if a.Nlink != links[ino] {
				fix := s.fixNlink(ino, a, links[ino])
				if links[ino] == 0 {
					fix = s.fixUnnamed(ino, a)
				}
				report(fix, "inode %d: nlink %d with %d entries", ino, a.Nlink, links[ino])
			}
			_, trashed, err := r.Get(keys.Trash(ino))
			if err != nil {
				return err
			}
			if a.Nlink == 0 && !trashed { // the trash keeps files with no links
				_, orphan, err := r.Get(keys.Orphan(ino))
				if err != nil {
					return err
				}
				open, err := isOpen(r, ino)
				if err != nil {
					return err
				}
				if !orphan || !open {
					report(s.fixUnlinked(ino, a), "inode %d has no links but orphan=%v open=%v", ino, orphan, open)
				}
			}
		}
		stored := map[uint64]uint64{}
		if err := r.Scan([]byte{keys.PrefixStripe}, []byte{keys.PrefixStripe + 1}, 0, func(k, v []byte) error {
			ino, stripe, err := keys.ParseStripe(k)
			if err != nil {
				return err
			}
			if rec, ok := inodes[ino]; !ok {
				report(s.fixStrayStripe(ino, stripe), "stripe %d of inode %d: no such inode", stripe, ino)
			} else if fileType(rec.Attr.Mode) != syscall.S_IFREG {
				report(nil, "stripe %d of inode %d: not a regular file", stripe, ino)
			}
			st := &metapb.StripeRecord{}
			if err := proto.Unmarshal(v, st); err != nil {
				return fmt.Errorf("stripe %d of inode %d: %w", stripe, ino, err)
			}
			if st.Version > 0 {
				stored[ino] += st.Length
				for _, sh := range st.Shards {
					referenced[chunkRef{sh.ServerId, sh.ChunkId, st.Version}] = true
				}
			}
			return nil
		}); err != nil {
			return err
		}
		for ino, rec := range inodes {
			if a := rec.Attr; a.StoredKnown && a.Stored != stored[ino] {
				report(s.fixStored(ino), "inode %d records %d bytes stored, its stripes hold %d", ino, a.Stored, stored[ino])
			}
		}
		var err error
		notes, err = s.inventoryFindings(r, referenced, repairs, began, report)
		return err
	})
	if err != nil {
		return nil, nil, false, err
	}
	return problems, notes, truncated, nil
}

// fixed runs fn in a transaction and returns what it says it did.
func (s *Service) fixed(ctx context.Context, fn func(t kv.Txn) (string, error)) (string, error) {
	var did string
	err := s.update(ctx, func(t kv.Txn) error {
		var err error
		did, err = fn(t)
		return err
	})
	return did, err
}

// unchangedInode returns ino's record if it has the link count and ctime
// the check saw, nil if it changed or is gone since.
func unchangedInode(t kv.Txn, ino uint64, seen *metapb.Attr) (*metapb.InodeRecord, error) {
	rec, err := getInode(t, ino)
	if metaerr.Errno(err) == syscall.ENOENT {
		return nil, nil
	}
	if err != nil || rec.Attr.Nlink != seen.Nlink || rec.Attr.CtimeNs != seen.CtimeNs {
		return nil, err
	}
	return rec, nil
}

// fixNlink sets ino's link count to want.
func (s *Service) fixNlink(ino uint64, seen *metapb.Attr, want uint32) func(context.Context) (string, error) {
	return func(ctx context.Context) (string, error) {
		if isDir(seen) {
			if err := s.awaitLease(ctx, 0, ino); err != nil { // a holder answers getattr itself
				return "", err
			}
		}
		return s.fixed(ctx, func(t kv.Txn) (string, error) {
			rec, err := unchangedInode(t, ino, seen)
			if rec == nil || err != nil {
				return "", err
			}
			rec.Attr.Nlink, rec.Attr.CtimeNs = want, s.now().UnixNano()
			return fmt.Sprintf("inode %d: nlink %d set to %d", ino, seen.Nlink, want), s.putInode(t, rec)
		})
	}
}

// fixUnnamed links an inode no entry names into /lost+found as "#INO".
func (s *Service) fixUnnamed(ino uint64, seen *metapb.Attr) func(context.Context) (string, error) {
	return func(ctx context.Context) (string, error) {
		lf, err := s.lostFoundDir(ctx)
		if err != nil {
			return "", err
		}
		if err := s.awaitLease(ctx, 0, lf); err != nil { // a holder answers lookups there itself
			return "", err
		}
		return s.fixed(ctx, func(t kv.Txn) (string, error) {
			rec, err := unchangedInode(t, ino, seen)
			if rec == nil || err != nil {
				return "", err
			}
			p, err := getDir(t, lf)
			if err != nil {
				return "", err
			}
			name := fmt.Sprintf("#%d", ino)
			if _, ok, err := getDentry(t, lf, name); err != nil || ok {
				return "", err
			}
			if _, err := addEntry(t, p, name, ino, fileType(rec.Attr.Mode)); err != nil {
				return "", err
			}
			now := s.now().UnixNano()
			rec.Parent = lf
			if isDir(rec.Attr) {
				p.Attr.Nlink++
			} else {
				rec.Attr.Nlink = 1
			}
			rec.Attr.CtimeNs = now
			p.Attr.MtimeNs, p.Attr.CtimeNs = now, now
			if err := t.Delete(keys.Orphan(ino)); err != nil {
				return "", err
			}
			if err := s.putInode(t, rec); err != nil {
				return "", err
			}
			return fmt.Sprintf("inode %d: linked as /%s/%s", ino, lostFound, name), s.putInode(t, p)
		})
	}
}

// lostFoundDir returns the inode of /lost+found, making it if needed.
func (s *Service) lostFoundDir(ctx context.Context) (uint64, error) {
	root := &metapb.Caller{}
	r, err := s.Mkdir(ctx, &metapb.MkdirRequest{Caller: root, Parent: RootIno, Name: lostFound, Mode: 0o700})
	if err == nil {
		return r.Attr.Ino, nil
	}
	if metaerr.Errno(err) != syscall.EEXIST {
		return 0, fmt.Errorf("make /%s: %w", lostFound, err)
	}
	r, err = s.Lookup(ctx, &metapb.LookupRequest{Caller: root, Parent: RootIno, Name: lostFound})
	if err != nil {
		return 0, fmt.Errorf("look up /%s: %w", lostFound, err)
	}
	if !isDir(r.Attr) {
		return 0, metaerr.New(syscall.ENOTDIR, "/%s is not a directory", lostFound)
	}
	return r.Attr.Ino, nil
}

// fixUnlinked deletes an inode without links that no session has open, or
// marks one still open an orphan, to be deleted at its last close.
func (s *Service) fixUnlinked(ino uint64, seen *metapb.Attr) func(context.Context) (string, error) {
	return func(ctx context.Context) (string, error) {
		purged := false
		did, err := s.fixed(ctx, func(t kv.Txn) (string, error) {
			purged = false
			rec, err := unchangedInode(t, ino, seen)
			if rec == nil || err != nil || rec.Attr.Nlink != 0 {
				return "", err
			}
			if open, err := isOpen(t, ino); err != nil {
				return "", err
			} else if open {
				return fmt.Sprintf("inode %d: marked orphan (open, no links)", ino), t.Put(keys.Orphan(ino), nil)
			}
			purged = true
			return fmt.Sprintf("inode %d: deleted (no links, not open)", ino), s.purgeInode(t, rec)
		})
		if err == nil && purged {
			s.inodes.Add(-1)
		}
		return did, err
	}
}

// fixDanglingEntry removes the entry name of parent if it still names the
// missing inode d.Ino.
func (s *Service) fixDanglingEntry(parent uint64, name string, d *metapb.DentryRecord) func(context.Context) (string, error) {
	return func(ctx context.Context) (string, error) {
		if err := s.awaitLease(ctx, 0, parent); err != nil { // a holder answers lookups there itself
			return "", err
		}
		return s.fixed(ctx, func(t kv.Txn) (string, error) {
			cur, ok, err := getDentry(t, parent, name)
			if err != nil || !ok || cur.Ino != d.Ino || cur.Cookie != d.Cookie {
				return "", err
			}
			if _, err := getInode(t, d.Ino); metaerr.Errno(err) != syscall.ENOENT {
				return "", err
			}
			return fmt.Sprintf("entry %q in %d: removed (its inode %d does not exist)", name, parent, d.Ino), removeEntry(t, parent, name, cur)
		})
	}
}

// fixStrayStripe deletes a stripe of an inode that does not exist and
// queues its chunks for collection.
func (s *Service) fixStrayStripe(ino, stripe uint64) func(context.Context) (string, error) {
	return func(ctx context.Context) (string, error) {
		return s.fixed(ctx, func(t kv.Txn) (string, error) {
			if _, err := getInode(t, ino); metaerr.Errno(err) != syscall.ENOENT {
				return "", err
			}
			st := &metapb.StripeRecord{}
			if ok, err := getMsg(t, keys.Stripe(ino, stripe), st); err != nil || !ok {
				return "", err
			}
			if st.Version > 0 {
				if err := dropVersion(t, st.Shards, st.Version, st.Shared); err != nil {
					return "", err
				}
			}
			return fmt.Sprintf("stripe %d of missing inode %d: deleted, %d chunks to collect", stripe, ino, len(st.Shards)), t.Delete(keys.Stripe(ino, stripe))
		})
	}
}

// fixStored recomputes the bytes ino's stripes hold.
func (s *Service) fixStored(ino uint64) func(context.Context) (string, error) {
	return func(ctx context.Context) (string, error) {
		return s.fixed(ctx, func(t kv.Txn) (string, error) {
			rec, err := getInode(t, ino)
			if metaerr.Errno(err) == syscall.ENOENT {
				return "", nil
			}
			if err != nil {
				return "", err
			}
			var stored uint64
			prefix := keys.StripePrefix(ino)
			if err := t.Scan(prefix, kv.PrefixEnd(prefix), 0, func(_, v []byte) error {
				st := &metapb.StripeRecord{}
				if err := proto.Unmarshal(v, st); err != nil {
					return err
				}
				if st.Version > 0 {
					stored += st.Length
				}
				return nil
			}); err != nil {
				return "", err
			}
			if rec.Attr.StoredKnown && rec.Attr.Stored == stored {
				return "", nil
			}
			old := rec.Attr.Stored
			rec.Attr.Stored, rec.Attr.StoredKnown = stored, true
			return fmt.Sprintf("inode %d: stored bytes %d set to %d", ino, old, stored), s.putInode(t, rec)
		})
	}
}
