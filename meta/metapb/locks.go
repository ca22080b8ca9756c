package metapb

import (
	"slices"

	"google.golang.org/protobuf/proto"
)

// LockToEOF is the end of a FileLock that runs to the end of the file (the
// kernel's OFFSET_MAX); ends past it mean the same.
const LockToEOF = 1<<63 - 1

// LockOwner identifies the holder of locks: an owner of a session, and the
// kind of lock (record locks and flocks do not interact).
type LockOwner struct {
	Session, Owner uint64
	Flock          bool
}

// OwnerOf returns the holder of l.
func OwnerOf(l *FileLock) LockOwner {
	return LockOwner{l.Session, l.Owner, l.Flock}
}

// NormalLock returns a copy of l as locks are kept: an end past LockToEOF
// is LockToEOF, and a flock covers the whole file.
func NormalLock(l *FileLock) *FileLock {
	n := proto.CloneOf(l)
	n.End = min(n.End, LockToEOF)
	if n.Flock {
		n.Start, n.End = 0, LockToEOF
	}
	return n
}

// LockConflicts reports whether held, another owner's lock, is in the way
// of l.
func LockConflicts(held, l *FileLock) bool {
	return OwnerOf(held) != OwnerOf(l) && held.Flock == l.Flock &&
		(held.Type == LockType_LOCK_WRITE || l.Type == LockType_LOCK_WRITE) &&
		held.Start <= l.End && l.Start <= held.End
}

// ConflictingLock returns the first of locks in the way of l, or nil.
func ConflictingLock(locks []*FileLock, l *FileLock) *FileLock {
	for _, c := range locks {
		if LockConflicts(c, l) {
			return c
		}
	}
	return nil
}

// SetLock returns locks with l's owner's locks over l's range replaced by l
// (removed, for an unlock): the owner's locks are split where l's range
// cuts them, and adjacent or overlapping locks of the same type merged. l
// is normal (NormalLock); locks is not changed.
func SetLock(locks []*FileLock, l *FileLock) []*FileLock {
	me := OwnerOf(l)
	var out, mine []*FileLock
	for _, c := range locks {
		if OwnerOf(c) != me {
			out = append(out, c)
			continue
		}
		if c.End < l.Start || c.Start > l.End {
			mine = append(mine, c)
			continue
		}
		if c.Start < l.Start {
			left := proto.CloneOf(c)
			left.End = l.Start - 1
			mine = append(mine, left)
		}
		if c.End > l.End {
			right := proto.CloneOf(c)
			right.Start = l.End + 1
			mine = append(mine, right)
		}
	}
	if l.Type != LockType_LOCK_UNLOCK {
		mine = append(mine, proto.CloneOf(l))
	}
	slices.SortFunc(mine, func(a, b *FileLock) int {
		switch {
		case a.Start < b.Start:
			return -1
		case a.Start > b.Start:
			return 1
		}
		return 0
	})
	var merged []*FileLock
	for _, c := range mine {
		if n := len(merged); n > 0 {
			last := merged[n-1]
			if last.Type == c.Type && last.End != LockToEOF && last.End+1 >= c.Start {
				last.End = max(last.End, c.End)
				continue
			}
		}
		merged = append(merged, c)
	}
	return append(out, merged...)
}
