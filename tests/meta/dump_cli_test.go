package meta_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/meta/client"
	"github.com/rdmafs/rdmafs/meta/core"
	"github.com/rdmafs/rdmafs/meta/dump"
	"github.com/rdmafs/rdmafs/meta/kv/etcdkv/etcdtest"
	"github.com/rdmafs/rdmafs/meta/metapb"
	"github.com/rdmafs/rdmafs/meta/metatest"
)

// pairs reads the key/value pairs of a dump file.
func pairs(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	d, err := dump.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for {
		k, v, err := d.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out[string(k)] = string(v)
	}
}

// TestDumpLoadCommands moves a file system from bbolt to etcd and back with
// the real `rdmafs admin dump` and `rdmafs admin load`, and serves it from
// etcd with `rdmafs meta --kv` in between.
func TestDumpLoadCommands(t *testing.T) {
	bin := metatest.BuildRdmafs(t)
	etcd := etcdtest.StartT(t)
	tmp := t.TempDir()
	run := func(args ...string) (string, error) {
		out, err := exec.Command(bin, args...).CombinedOutput()
		return string(out), err
	}
	ctx := context.Background()
	dir := filepath.Join(tmp, "meta")
	p := metatest.StartProcess(t, bin, metatest.Options{DataDir: dir})
	c := p.Client(t)
	d, err := c.Mkdir(ctx, &metapb.MkdirRequest{Parent: core.RootIno, Name: "d", Mode: 0o755})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 50; i++ {
		if _, err := c.Create(ctx, &metapb.CreateRequest{Parent: d.Attr.Ino, Name: fmt.Sprintf("f%d", i), Mode: 0o644}); err != nil {
			t.Fatal(err)
		}
	}
	c.Close()
	if err := p.Terminate(t); err != nil {
		t.Fatal(err)
	}

	bad := []struct {
		name string
		args []string
		want string
	}{
		{"dump needs a store", []string{"admin", "dump"}, "exactly one of --data"},
		{"dump with both stores", []string{"admin", "dump", "--data", dir, "--kv", etcd.URL("x")}, "exactly one of --data"},
		{"bad url", []string{"admin", "dump", "--kv", "http://x"}, "not an etcd:// URL"},
		{"load garbage", []string{"admin", "load", "--data", filepath.Join(tmp, "g"), "-i", "/etc/hostname"}, "not an rdmafs metadata dump"},
	}
	for _, b := range bad {
		if out, err := run(b.args...); err == nil || !strings.Contains(out, b.want) {
			t.Fatalf("%s: %v\n%s", b.name, err, out)
		}
	}

	f1 := filepath.Join(tmp, "bolt.dump")
	if out, err := run("admin", "dump", "--data", dir, "-o", f1); err != nil {
		t.Fatalf("dump: %v\n%s", err, out)
	}
	url := etcd.URL("moved")
	if out, err := run("admin", "load", "--kv", url, "-i", f1); err != nil {
		t.Fatalf("load into etcd: %v\n%s", err, out)
	}
	if out, err := run("admin", "load", "--kv", url, "-i", f1); err == nil || !strings.Contains(out, "not empty") {
		t.Fatalf("second load into the same prefix: %v\n%s", err, out)
	}
	// Serve it from etcd.
	addr := metatest.FreeAddr(t)
	cmd := exec.Command(bin, "meta", "--kv", url, "--listen", addr, "--secret-file", p.SecretFile)
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		syscall.Kill(cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
	}()
	mc, err := client.Dial(addr, p.Secret)
	if err != nil {
		t.Fatal(err)
	}
	defer mc.Close()
	var names int
	deadline := time.Now().Add(20 * time.Second)
	for {
		e, err := mc.Lookup(ctx, &metapb.LookupRequest{Parent: core.RootIno, Name: "d"})
		if err == nil {
			r, err := mc.ReadDir(ctx, &metapb.ReadDirRequest{Ino: e.Attr.Ino, Limit: 1000})
			if err != nil {
				t.Fatal(err)
			}
			names = len(r.Entries)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("meta on etcd does not serve the loaded file system: %v\n%s", err, log.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if names != 50 {
		t.Fatalf("%d entries served from etcd, want 50", names)
	}
	syscall.Kill(cmd.Process.Pid, syscall.SIGTERM)
	cmd.Wait()

	// And back to bbolt: the same records.
	f2 := filepath.Join(tmp, "etcd.dump")
	if out, err := run("admin", "dump", "--kv", url, "-o", f2); err != nil {
		t.Fatalf("dump from etcd: %v\n%s", err, out)
	}
	back := filepath.Join(tmp, "back")
	if out, err := run("admin", "load", "--data", back, "-i", f2); err != nil {
		t.Fatalf("load into bbolt: %v\n%s", err, out)
	}
	f3 := filepath.Join(tmp, "back.dump")
	if out, err := run("admin", "dump", "--data", back, "-o", f3); err != nil {
		t.Fatalf("dump of the round trip: %v\n%s", err, out)
	}
	a, b := pairs(t, f1), pairs(t, f3)
	if len(a) != len(b) {
		t.Fatalf("round trip bbolt -> etcd -> bbolt: %d records, then %d", len(a), len(b))
	}
	for k, v := range a {
		if b[k] != v {
			// The server on etcd only answered reads, so nothing may
			// differ.
			t.Fatalf("record %q changed in the round trip", k)
		}
	}
}
