package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

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
// raised), starts it again and runs `rdmafs admin check`: it reports both
// and exits non-zero; with --repair it fixes both (the unnamed file is in
// /lost+found with its bytes) and exits zero, and a plain check then finds
// nothing.
func TestCheckOnLiveCluster(t *testing.T) {
	needRoot(t)
	c := up(t)
	for _, name := range []string{"orphan", "linked"} {
		if err := os.WriteFile(filepath.Join(c.MountPoint, name), []byte("bytes of "+name), 0o644); err != nil {
			t.Fatal(err)
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
	out, err := rdmafsOn(t, c, "admin", "check", c.MetaAddr)
	if err == nil || !strings.Contains(out, fmt.Sprintf("inode %d: nlink 1 with 0 entries", orphan)) || !strings.Contains(out, fmt.Sprintf("inode %d: nlink 3 with 1 entries", linked)) {
		t.Fatalf("check of a damaged cluster: %v, want a failure naming both inodes\n%s", err, out)
	}
	out, err = rdmafsOn(t, c, "admin", "check", c.MetaAddr, "--repair")
	if err != nil || !strings.Contains(out, "metadata consistent after 2 repairs") {
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
}
