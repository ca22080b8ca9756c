package meta_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/meta/core"
	"github.com/rdmafs/rdmafs/meta/kv/bolt"
	"github.com/rdmafs/rdmafs/meta/metapb"
	"github.com/rdmafs/rdmafs/meta/metatest"
)

// TestWALRecoverCommand damages the first record of the bbolt store's log,
// which later records follow: the real `rdmafs meta` refuses to start,
// naming the damage and `rdmafs admin wal-recover`; the command's dry run
// reports it and writes nothing; the command cuts the log, and the server
// starts with every directory made before.
func TestWALRecoverCommand(t *testing.T) {
	bin := metatest.BuildRdmafs(t)
	p := metatest.StartProcess(t, bin, metatest.Options{})
	c := p.Client(t)
	ctx := context.Background()
	const dirs = 5
	for i := 0; i < dirs; i++ {
		if _, err := c.Mkdir(ctx, &metapb.MkdirRequest{Parent: core.RootIno, Name: fmt.Sprintf("d%d", i), Mode: 0o755}); err != nil {
			t.Fatal(err)
		}
	}
	c.Close() // before the SIGTERM
	if err := p.Terminate(t); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
	// The server's records start at the beginning of the first segment;
	// damage the payload of the first one.
	seg := filepath.Join(p.DataDir, bolt.LogFile0)
	b, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) < 64 || binary.BigEndian.Uint32(b) != 0x5244574c || binary.BigEndian.Uint32(b[4:]) < 8 {
		t.Fatalf("%s does not start with a record", seg)
	}
	b[32+4] ^= 0xff
	if err := os.WriteFile(seg, b, 0o600); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
		return string(out), err
	}
	out, err := run("meta", "--data", p.DataDir, "--listen", metatest.FreeAddr(t), "--secret-file", p.SecretFile)
	recoverCmd := "rdmafs admin wal-recover --data " + p.DataDir
	for _, want := range []string{"damaged in the middle", seg + " at byte offset 0", "LSN", recoverCmd} {
		if err == nil || !strings.Contains(out, want) {
			t.Fatalf("meta on a log damaged in the middle: %v, output lacks %q:\n%s", err, want, out)
		}
	}
	before, _ := os.ReadFile(seg)
	out, err = run("admin", "wal-recover", "--data", p.DataDir, "--dry-run")
	if err != nil || !strings.Contains(out, "damaged: "+seg+" at byte offset 0") || !strings.Contains(out, "would drop no record") {
		t.Fatalf("wal-recover --dry-run: %v\n%s", err, out)
	}
	if after, _ := os.ReadFile(seg); string(after) != string(before) {
		t.Fatal("wal-recover --dry-run changed the log")
	}
	out, err = run("admin", "wal-recover", "--data", p.DataDir)
	if err != nil || !strings.Contains(out, "dropped no record") {
		t.Fatalf("wal-recover: %v\n%s", err, out)
	}
	t.Logf("wal-recover:\n%s", out)
	p.Restart(t)
	c = p.Client(t)
	for i := 0; i < dirs; i++ {
		if _, err := c.Lookup(ctx, &metapb.LookupRequest{Parent: core.RootIno, Name: fmt.Sprintf("d%d", i)}); err != nil {
			t.Fatalf("d%d after recovery: %v", i, err)
		}
	}
}
