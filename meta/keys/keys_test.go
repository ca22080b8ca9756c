package keys

import (
	"bytes"
	"errors"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	p, n, err := ParseDentry(Dentry(7, "hello"))
	if err != nil || p != 7 || n != "hello" {
		t.Fatalf("dentry: %d %q %v", p, n, err)
	}
	i, x, err := ParseXattr(Xattr(9, "user.a"))
	if err != nil || i != 9 || x != "user.a" {
		t.Fatalf("xattr: %d %q %v", i, x, err)
	}
	a, b, err := ParseStripe(Stripe(3, 1<<40))
	if err != nil || a != 3 || b != 1<<40 {
		t.Fatalf("stripe: %d %d %v", a, b, err)
	}
	id, c, v, err := ParseGC(GC("cs-1", 5, 6))
	if err != nil || id != "cs-1" || c != 5 || v != 6 {
		t.Fatalf("gc: %q %d %d %v", id, c, v, err)
	}
	gi, gs, gv, err := ParseGrant(Grant(1, 2, 3))
	if err != nil || gi != 1 || gs != 2 || gv != 3 {
		t.Fatalf("grant: %v", err)
	}
	if !bytes.HasPrefix(Cookie(4, 5), CookiePrefix(4)) || !bytes.HasPrefix(GC("a", 1, 1), GCPrefix("a")) {
		t.Fatal("prefix mismatch")
	}
	// Entries of directory 1 sort before those of directory 2, whatever the names.
	if bytes.Compare(Dentry(1, "\xff\xff"), Dentry(2, "")) >= 0 {
		t.Fatal("dentries of different parents interleave")
	}
	// A chunkserver id that is a prefix of another gets a distinct GC prefix.
	if bytes.HasPrefix(GC("ab", 1, 1), GCPrefix("a")) {
		t.Fatal("gc prefixes of different ids overlap")
	}
}

func TestMalformed(t *testing.T) {
	tests := []struct {
		name string
		err  error
	}{
		{"short dentry", func() error { _, _, err := ParseDentry([]byte{PrefixDentry, 1}); return err }()},
		{"wrong prefix", func() error { _, _, err := ParseStripe(Inode(1)[:1]); return err }()},
		{"long stripe", func() error { _, _, err := ParseStripe(append(Stripe(1, 2), 0)); return err }()},
		{"gc length", func() error { _, _, _, err := ParseGC([]byte{PrefixGC, 0, 9, 'a'}); return err }()},
		{"counter", func() error { _, err := DecodeUint64([]byte{1, 2}); return err }()},
	}
	for _, tt := range tests {
		if !errors.Is(tt.err, ErrMalformed) {
			t.Errorf("%s: got %v, want ErrMalformed", tt.name, tt.err)
		}
	}
}

// FuzzParse checks that no key parser panics and that every key that parses
// encodes back to the same bytes.
func FuzzParse(f *testing.F) {
	for _, s := range [][]byte{Dentry(1, "x"), Xattr(2, "user.y"), Stripe(3, 4), Grant(5, 6, 7), GC("cs", 8, 9),
		Cookie(1, 2), Session(3), SessionOpen(8, 9), Open(4, 5), Orphan(6), Relayout(11), Inode(7), Chunkserver("cs-0"), EncodeUint64(10), {}, {PrefixGC, 0xff, 0xff},
		Shared(1, 2), SnapTask(3, 4), Trash(5), TrashTime(6, 7), DirQuota(8), IDQuota(QuotaUID, 9), IDQuota(QuotaGID, 10)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, k []byte) {
		if c, v, err := ParseShared(k); err == nil && !bytes.Equal(Shared(c, v), k) {
			t.Fatalf("shared round trip: %x", k)
		}
		if d, s, err := ParseSnapTask(k); err == nil && !bytes.Equal(SnapTask(d, s), k) {
			t.Fatalf("snapshot task round trip: %x", k)
		}
		if i, err := ParseTrash(k); err == nil && !bytes.Equal(Trash(i), k) {
			t.Fatalf("trash round trip: %x", k)
		}
		if n, i, err := ParseTrashTime(k); err == nil && !bytes.Equal(TrashTime(n, i), k) {
			t.Fatalf("trash time round trip: %x", k)
		}
		if i, err := ParseDirQuota(k); err == nil && !bytes.Equal(DirQuota(i), k) {
			t.Fatalf("directory quota round trip: %x", k)
		}
		if kind, id, err := ParseIDQuota(k); err == nil && !bytes.Equal(IDQuota(kind, id), k) {
			t.Fatalf("id quota round trip: %x", k)
		}
		if p, n, err := ParseDentry(k); err == nil && !bytes.Equal(Dentry(p, n), k) {
			t.Fatalf("dentry round trip: %x", k)
		}
		if i, n, err := ParseXattr(k); err == nil && !bytes.Equal(Xattr(i, n), k) {
			t.Fatalf("xattr round trip: %x", k)
		}
		if i, s, err := ParseStripe(k); err == nil && !bytes.Equal(Stripe(i, s), k) {
			t.Fatalf("stripe round trip: %x", k)
		}
		if i, s, v, err := ParseGrant(k); err == nil && !bytes.Equal(Grant(i, s, v), k) {
			t.Fatalf("grant round trip: %x", k)
		}
		if id, c, v, err := ParseGC(k); err == nil && !bytes.Equal(GC(id, c, v), k) {
			t.Fatalf("gc round trip: %x", k)
		}
		if p, c, err := ParseCookie(k); err == nil && !bytes.Equal(Cookie(p, c), k) {
			t.Fatalf("cookie round trip: %x", k)
		}
		if s, err := ParseSession(k); err == nil && !bytes.Equal(Session(s), k) {
			t.Fatalf("session round trip: %x", k)
		}
		if i, s, err := ParseOpen(k); err == nil && !bytes.Equal(Open(i, s), k) {
			t.Fatalf("open round trip: %x", k)
		}
		if a, b, err := ParseSessionOpen(k); err == nil && !bytes.Equal(SessionOpen(a, b), k) {
			t.Fatalf("session open round trip: %x", k)
		}
		if i, err := ParseRelayout(k); err == nil && !bytes.Equal(Relayout(i), k) {
			t.Fatalf("relayout key %x round trip", k)
		}
		if i, err := ParseOrphan(k); err == nil && !bytes.Equal(Orphan(i), k) {
			t.Fatalf("orphan round trip: %x", k)
		}
		if i, err := ParseInode(k); err == nil && !bytes.Equal(Inode(i), k) {
			t.Fatalf("inode round trip: %x", k)
		}
		if id, err := ParseChunkserver(k); err == nil && !bytes.Equal(Chunkserver(id), k) {
			t.Fatalf("chunkserver round trip: %x", k)
		}
		if v, err := DecodeUint64(k); err == nil && !bytes.Equal(EncodeUint64(v), k) {
			t.Fatalf("counter round trip: %x", k)
		}
	})
}

// TestRequestOrder checks that request records sort by the time of the first
// attempt before the client, so that records of concurrent clients written
// together are adjacent, and that RequestsBefore splits by that time.
func TestRequestOrder(t *testing.T) {
	if bytes.Compare(Request(1000, ^uint64(0), 9), Request(1001, 0, 1)) >= 0 {
		t.Fatal("request records of different clients are not ordered by time")
	}
	if end := RequestsBefore(1001); bytes.Compare(Request(1000, ^uint64(0), ^uint64(0)), end) >= 0 ||
		bytes.Compare(Request(1001, 0, 0), end) < 0 || !bytes.HasPrefix(end, RequestPrefix()) {
		t.Fatal("RequestsBefore does not split at the time")
	}
}
