package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/rdmafs/rdmafs/chunkserver/chunk"
	"github.com/rdmafs/rdmafs/chunkserver/chunktest"
	"github.com/rdmafs/rdmafs/meta/keys"
	"github.com/rdmafs/rdmafs/meta/kv"
	"github.com/rdmafs/rdmafs/meta/kv/bolt"
	"github.com/rdmafs/rdmafs/meta/metapb"
	"golang.org/x/sys/unix"
)

// infoJSON is what `rdmafs info --json` prints, as far as the tests read it.
type infoJSON []struct {
	Path string `json:"path"`
	Info struct {
		Attr struct {
			Ino  string `json:"ino"`
			Size string `json:"size"`
		} `json:"attr"`
		Layout struct {
			K int `json:"k"`
			M int `json:"m"`
		} `json:"layout"`
		Stripes []struct {
			Stripe string `json:"stripe"`
			Health string `json:"health"`
			Shards []struct {
				ChunkID  string `json:"chunkId"`
				ServerID string `json:"serverId"`
				Address  string `json:"address"`
				State    string `json:"state"`
			} `json:"shards"`
		} `json:"stripes"`
		Totals struct {
			Files    string `json:"files"`
			Bytes    string `json:"bytes"`
			Stripes  string `json:"stripes"`
			Degraded string `json:"degraded"`
		} `json:"totals"`
	} `json:"info"`
}

// TestInfo: `rdmafs info` on a mounted file lists each stripe with its six
// shards on six distinct chunkservers, all ok; on a directory the totals of
// the tree; the same through the meta server (--meta with a path inside the
// file system); and after a chunkserver is killed the stripes it held show
// degraded, with that shard down.
func TestInfo(t *testing.T) {
	needRoot(t)
	c := up(t)
	dir := filepath.Join(c.MountPoint, "d")
	if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(dir, "f")
	data := pattern(9<<20+123, 7) // three 4 MiB stripes of 4+2 with 1 MiB units
	if err := os.WriteFile(f, data, 0o644); err != nil {
		t.Fatal(err)
	}
	// A small file's data is committed behind its close: fsync waits for it.
	small, err := os.Create(filepath.Join(dir, "sub", "small"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := small.WriteString("hello"); err != nil {
		t.Fatal(err)
	}
	if err := small.Sync(); err != nil {
		t.Fatal(err)
	}
	small.Close()
	info := func(args ...string) infoJSON {
		t.Helper()
		out, err := rdmafsOn(t, c, append([]string{"info", "--json"}, args...)...)
		if err != nil {
			t.Fatalf("rdmafs info %v: %v\n%s", args, err, out)
		}
		var got infoJSON
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatalf("rdmafs info --json %v: %v\n%s", args, err, out)
		}
		return got
	}
	checkFile := func(how string, got infoJSON, wantDegraded int) {
		t.Helper()
		fi := got[0].Info
		if fi.Attr.Size != fmt.Sprint(len(data)) || fi.Layout.K != 4 || fi.Layout.M != 2 || len(fi.Stripes) != 3 {
			t.Fatalf("%s: size %s layout %d+%d, %d stripes; want %d, 4+2, 3", how, fi.Attr.Size, fi.Layout.K, fi.Layout.M, len(fi.Stripes), len(data))
		}
		degraded := 0
		for _, st := range fi.Stripes {
			servers := map[string]bool{}
			ok := 0
			for _, sh := range st.Shards {
				servers[sh.ServerID] = true
				if sh.State == "ok" && sh.Address != "" {
					ok++
				}
			}
			if len(st.Shards) != 6 || len(servers) != 6 {
				t.Fatalf("%s: stripe %s has %d shards on %d chunkservers, want 6 on 6", how, st.Stripe, len(st.Shards), len(servers))
			}
			if st.Health == "degraded" && ok == 5 {
				degraded++
			} else if st.Health != "healthy" || ok != 6 {
				t.Fatalf("%s: stripe %s is %s with %d shards ok", how, st.Stripe, st.Health, ok)
			}
		}
		if degraded != wantDegraded {
			t.Fatalf("%s: %d degraded stripes, want %d", how, degraded, wantDegraded)
		}
	}
	checkFile("info through the mount", info(f), 0)
	checkFile("info through meta", info("--meta", c.MetaAddr, "/d/f"), 0)
	d := info(dir)[0].Info.Totals
	if d.Files != "2" || d.Bytes != fmt.Sprint(len(data)+5) || d.Stripes != "4" || d.Degraded != "" {
		t.Fatalf("info of the directory: totals %+v; want 2 files, %d bytes, 4 stripes (one inline), none degraded", d, len(data)+5)
	}
	out, err := rdmafsOn(t, c, "info", f, dir)
	if err != nil || !strings.Contains(out, "stripe 2") || !strings.Contains(out, "shard 5 parity") || !strings.Contains(out, "files 2  directories 2") {
		t.Fatalf("rdmafs info: %v\n%s", err, out)
	}
	t.Logf("rdmafs info %s %s:\n%s", f, dir, out)

	// Kill a chunkserver holding a shard of every stripe (4+2 on 6 or 7: at
	// least one holds a shard of stripe 0); its stripes show degraded.
	first := info(f)[0].Info.Stripes[0].Shards[0]
	victim := first.ServerID
	held := 0
	for _, st := range info(f)[0].Info.Stripes {
		for _, sh := range st.Shards {
			if sh.ServerID == victim {
				held++
			}
		}
	}
	killed := false
	for i, ch := range c.Chunk {
		if ch.Addr == first.Address {
			if err := c.KillChunkd(i); err != nil {
				t.Fatal(err)
			}
			killed = true
		}
	}
	if !killed {
		t.Fatalf("chunkserver %s not in the cluster", victim)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := info(f)
		n := 0
		for _, st := range got[0].Info.Stripes {
			if st.Health == "degraded" {
				n++
			}
		}
		if n == held {
			checkFile("info after a chunkserver died", got, held)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d stripes degraded 30s after their chunkserver was killed", n, held)
		}
		time.Sleep(200 * time.Millisecond) // heartbeats time out: nothing to wait on
	}
}

// TestCheckOnLiveCluster damages the metadata of a stopped meta server (a
// file's entry removed: an inode no entry names; another's link count
// raised) and plants a chunk version nothing references on a chunkserver,
// starts them again and runs `rdmafs admin check`: it reports all three
// and exits non-zero; with --repair it fixes them (the unnamed file is in
// /lost+found with its bytes, the chunk is deleted) and exits zero, and a
// plain check then finds nothing.
func TestCheckOnLiveCluster(t *testing.T) {
	needRoot(t)
	c := up(t)
	for _, name := range []string{"orphan", "linked"} {
		if err := os.WriteFile(filepath.Join(c.MountPoint, name), []byte("bytes of "+name), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// A file with a shard on every chunkserver (4+2 on six).
	if err := os.WriteFile(filepath.Join(c.MountPoint, "big"), pattern(4<<20, 5), 0o644); err != nil {
		t.Fatal(err)
	}
	var bigChunk uint64 // its shard on chunkserver 0
	out, err := rdmafsOn(t, c, "info", "--json", filepath.Join(c.MountPoint, "big"))
	var bigInfo infoJSON
	if err != nil || json.Unmarshal([]byte(out), &bigInfo) != nil {
		t.Fatalf("rdmafs info big: %v\n%s", err, out)
	}
	for _, sh := range bigInfo[0].Info.Stripes[0].Shards {
		if sh.Address == c.Chunk[0].Addr {
			bigChunk, _ = strconv.ParseUint(sh.ChunkID, 10, 64)
		}
	}
	if out, err := rdmafsOn(t, c, "admin", "check", c.MetaAddr); err != nil || !strings.Contains(out, "no problems") {
		t.Fatalf("check of a sound cluster: %v\n%s", err, out)
	}
	if err := c.Unmount(); err != nil {
		t.Fatal(err)
	}
	if err := c.KillMeta(0); err != nil {
		t.Fatal(err)
	}
	st, err := bolt.Open(c.Meta.Data, bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var orphan, linked uint64
	err = st.Update(ctx, func(tx kv.Txn) error {
		entry := func(name string) *metapb.DentryRecord {
			v, _, _ := tx.Get(keys.Dentry(1, name))
			d := &metapb.DentryRecord{}
			if err := proto.Unmarshal(v, d); err != nil || d.Ino == 0 {
				t.Fatalf("entry %q: %v", name, err)
			}
			return d
		}
		d := entry("orphan")
		orphan = d.Ino
		if err := tx.Delete(keys.Dentry(1, "orphan")); err != nil {
			return err
		}
		if err := tx.Delete(keys.Cookie(1, d.Cookie)); err != nil {
			return err
		}
		linked = entry("linked").Ino
		v, _, err := tx.Get(keys.Inode(linked))
		if err != nil {
			return err
		}
		rec := &metapb.InodeRecord{}
		if err := proto.Unmarshal(v, rec); err != nil {
			return err
		}
		rec.Attr.Nlink = 3
		b, err := proto.Marshal(rec)
		if err != nil {
			return err
		}
		return tx.Put(keys.Inode(linked), b)
	})
	if cerr := st.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := c.RestartMeta(ctx, 0); err != nil {
		t.Fatal(err)
	}
	// A chunk version no stripe references, on chunkserver 0: a copy of
	// one of its slot files under a new chunk id.
	if err := c.KillChunkd(0); err != nil {
		t.Fatal(err)
	}
	big := chunktest.SlotFile(c.Chunk[0].Data, chunk.Key{Chunk: bigChunk})
	if big == "" {
		t.Fatalf("chunkserver 0 holds no shard of big")
	}
	chunktest.CopySlot(t, c.Chunk[0].Data, big, chunk.Key{Chunk: 999999, Version: 1})
	if err := c.RestartChunkd(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if out, err := rdmafsOn(t, c, "admin", "scrub", c.MetaAddr, "--wait", "--interval", "100ms", "--timeout", "2m"); err != nil {
		t.Fatalf("admin scrub --wait (the chunkservers' lists of chunks): %v\n%s", err, out)
	}
	out, err = rdmafsOn(t, c, "admin", "check", c.MetaAddr)
	if err == nil || !strings.Contains(out, fmt.Sprintf("inode %d: nlink 1 with 0 entries", orphan)) || !strings.Contains(out, fmt.Sprintf("inode %d: nlink 3 with 1 entries", linked)) ||
		!strings.Contains(out, "chunk 999999 version 1 on chunkserver") || strings.Contains(out, "note:") {
		t.Fatalf("check of a damaged cluster: %v, want a failure naming both inodes and the stray chunk, every chunkserver's list checked\n%s", err, out)
	}
	out, err = rdmafsOn(t, c, "admin", "check", c.MetaAddr, "--repair")
	if err != nil || !strings.Contains(out, "metadata consistent after 3 repairs") {
		t.Fatalf("check --repair: %v\n%s", err, out)
	}
	t.Logf("rdmafs admin check --repair:\n%s", out)
	if out, err := rdmafsOn(t, c, "admin", "check", c.MetaAddr); err != nil || !strings.Contains(out, "no problems") {
		t.Fatalf("check after the repair: %v\n%s", err, out)
	}
	if err := c.Remount(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(c.MountPoint, "lost+found", fmt.Sprintf("#%d", orphan)))
	if err != nil || string(got) != "bytes of orphan" {
		t.Fatalf("the unnamed file in lost+found: %q, %v", got, err)
	}
	var stat unix.Stat_t
	if err := unix.Stat(filepath.Join(c.MountPoint, "linked"), &stat); err != nil || stat.Nlink != 1 {
		t.Fatalf("the file whose link count was raised: nlink %d, %v; want 1", stat.Nlink, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for chunktest.SlotFile(c.Chunk[0].Data, chunk.Key{Chunk: 999999}) != "" {
		if time.Now().After(deadline) {
			t.Fatal("the stray chunk is still on its chunkserver 30s after the repair queued it for deletion")
		}
		time.Sleep(100 * time.Millisecond) // deleted at a heartbeat: nothing to wait on
	}
}

// How damage harms a chunk version's file.
const (
	flip   = iota // bytes inverted: its checksum no longer matches
	remove        // the file deleted
	forge         // bytes inverted and the checksums in its header made to match
)

// damage harms the file of a chunk version on a chunkserver's disk.
func damage(t *testing.T, chunkDir, chunkID string, how int) {
	t.Helper()
	id, err := strconv.ParseUint(chunkID, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	p := chunktest.SlotFile(chunkDir, chunk.Key{Chunk: id})
	if p == "" {
		t.Fatalf("no file of chunk %s under %s", chunkID, chunkDir)
	}
	if how == remove {
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
		return
	}
	chunktest.FlipData(t, p, how == forge)
}

// TestScrub damages three shards on disk (bytes flipped in two, one file
// deleted) and runs `rdmafs admin scrub --wait`: it finds exactly those
// three, repair rebuilds exactly those (new chunks for them, every other
// shard unchanged), and the file reads back whole. Then it flips bytes in
// one more shard of a chunkserver restarted (so nothing is cached): a read
// returns correct data at once, and the shard is rebuilt without a scrub.
func TestScrub(t *testing.T) {
	needRoot(t)
	c := up(t)
	f := filepath.Join(c.MountPoint, "f")
	data := pattern(9<<20+123, 9)
	fh, err := os.Create(f)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fh.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := fh.Sync(); err != nil {
		t.Fatal(err)
	}
	fh.Close()
	shards := func() infoJSON {
		t.Helper()
		out, err := rdmafsOn(t, c, "info", "--json", f)
		if err != nil {
			t.Fatalf("rdmafs info: %v\n%s", err, out)
		}
		var got infoJSON
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatal(err)
		}
		return got
	}
	dirOf := func(addr string) (int, string) {
		for i, ch := range c.Chunk {
			if ch.Addr == addr {
				return i, ch.Data
			}
		}
		t.Fatalf("no chunkserver at %s", addr)
		return 0, ""
	}
	readBack := func(what string) {
		t.Helper()
		h, err := os.Open(f)
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		if err := unix.Fadvise(int(h.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(h)
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("%s: read back %d bytes, %v, equal %v", what, len(got), err, bytes.Equal(got, data))
		}
	}
	before := shards()[0].Info.Stripes
	type pos struct{ stripe, shard int }
	damaged := map[pos]int{{0, 0}: flip, {1, 4}: flip, {2, 2}: remove}
	for p, how := range damaged {
		sh := before[p.stripe].Shards[p.shard]
		_, dir := dirOf(sh.Address)
		damage(t, dir, sh.ChunkID, how)
	}
	out, err := rdmafsOn(t, c, "admin", "scrub", c.MetaAddr, "--wait", "--interval", "100ms", "--timeout", "2m")
	if err != nil || !strings.Contains(out, "3 corrupt or missing chunk versions found") || !strings.Contains(out, "full redundancy") {
		t.Fatalf("admin scrub --wait: %v\n%s", err, out)
	}
	var summary []string
	for _, l := range strings.Split(out, "\n") {
		summary = append(summary, l[strings.LastIndex(l, "\r")+1:])
	}
	t.Logf("rdmafs admin scrub --wait (the progress bars' last states):\n%s", strings.Join(summary, "\n"))
	after := shards()[0].Info.Stripes
	for si, st := range after {
		for i, sh := range st.Shards {
			changed := sh.ChunkID != before[si].Shards[i].ChunkID
			if _, want := damaged[pos{si, i}]; changed != want {
				t.Errorf("stripe %d shard %d: chunk %s → %s; damaged: %v", si, i, before[si].Shards[i].ChunkID, sh.ChunkID, want)
			}
			if sh.State != "ok" {
				t.Errorf("stripe %d shard %d: %s after the repair", si, i, sh.State)
			}
		}
	}
	readBack("after scrub and repair")
	if out, err := rdmafsOn(t, c, "status", c.MetaAddr); err != nil || !strings.Contains(out, "3 corrupt or missing found") || !strings.Contains(out, "0 mismatched, 3 rebuilt") {
		t.Fatalf("status after the scrub: %v\n%s", err, out)
	}

	// A read meets a damaged shard before any scrub: right data, and the
	// shard is rebuilt.
	sh := after[1].Shards[1]
	i, dir := dirOf(sh.Address)
	if err := c.KillChunkd(i); err != nil { // restarted: nothing of it resident
		t.Fatal(err)
	}
	if err := c.RestartChunkd(context.Background(), i); err != nil {
		t.Fatal(err)
	}
	damage(t, dir, sh.ChunkID, flip)
	readBack("with a damaged shard")
	deadline := time.Now().Add(time.Minute)
	for shards()[0].Info.Stripes[1].Shards[1].ChunkID == sh.ChunkID {
		if time.Now().After(deadline) {
			t.Fatal("the shard a read found damaged was not rebuilt within a minute")
		}
		time.Sleep(200 * time.Millisecond) // repair polls: nothing to wait on
	}
	readBack("after the read-found damage was repaired")

	// A shard whose bytes are wrong but whose checksums match (as a bug
	// writing the wrong data would leave it): the chunk scrub would pass
	// it, the parity check finds it.
	now := shards()[0].Info.Stripes
	sh = now[0].Shards[3]
	i, dir = dirOf(sh.Address)
	if err := c.KillChunkd(i); err != nil {
		t.Fatal(err)
	}
	damage(t, dir, sh.ChunkID, forge)
	if err := c.RestartChunkd(context.Background(), i); err != nil {
		t.Fatal(err)
	}
	// Only this file's stripes: --path.
	out, err = rdmafsOn(t, c, "admin", "scrub", c.MetaAddr, "--path", "/f", "--wait", "--interval", "100ms", "--timeout", "2m")
	if err != nil || !strings.Contains(out, "3 stripes' parity verified") || !strings.Contains(out, "1 with a shard that disagrees") {
		t.Fatalf("admin scrub --path /f --wait with a forged shard: %v\n%s", err, out)
	}
	for si, st := range shards()[0].Info.Stripes {
		for j, s := range st.Shards {
			if changed := s.ChunkID != now[si].Shards[j].ChunkID; changed != (si == 0 && j == 3) {
				t.Errorf("after the parity check: stripe %d shard %d: chunk %s → %s", si, j, now[si].Shards[j].ChunkID, s.ChunkID)
			}
		}
	}
	readBack("after the forged shard was rebuilt")
}
