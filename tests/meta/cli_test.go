package meta_test

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/meta/core"
	"github.com/rdmafs/rdmafs/meta/metapb"
	"github.com/rdmafs/rdmafs/meta/metatest"
)

// TestCommands drives format, meta, status and a SIGTERM shutdown through the
// real binary.
func TestCommands(t *testing.T) {
	bin := metatest.BuildRdmafs(t)
	dir := filepath.Join(t.TempDir(), "meta")
	run := func(args ...string) (string, error) {
		out, err := exec.Command(bin, args...).CombinedOutput()
		return string(out), err
	}
	formats := []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"bad ec", []string{"format", dir, "--ec", "4-2"}, "want k+m"},
		{"bad unit", []string{"format", dir, "--ec", "4+2", "--unit", "1000"}, "multiple of 4096"},
		{"ok", []string{"format", dir, "--ec", "2+1", "--unit", "64KiB"}, ""},
		{"twice", []string{"format", dir}, "already formatted"},
	}
	for _, f := range formats {
		out, err := run(f.args...)
		if f.wantErr == "" && err != nil || f.wantErr != "" && (err == nil || !strings.Contains(out, f.wantErr)) {
			t.Fatalf("%s: %v\n%s", f.name, err, out)
		}
	}
	p := metatest.StartProcess(t, bin, metatest.Options{DataDir: dir})
	c := p.Client(t)
	ctx := context.Background()
	lr, err := c.GetLayout(ctx, &metapb.GetLayoutRequest{Ino: core.RootIno})
	if err != nil || lr.Layout.K != 2 || lr.Layout.M != 1 || lr.Layout.Unit != 64<<10 {
		t.Fatalf("layout after format --ec 2+1 --unit 64KiB: %v %v", lr, err)
	}
	metatest.FakeChunkservers(t, c, 3, 100*time.Millisecond, "zone-a", "zone-b")
	out, err := run("status", p.Addr, "--secret-file", p.SecretFile)
	if err != nil {
		t.Fatalf("status: %v\n%s", err, out)
	}
	for _, want := range []string{"default layout 2+1", "3 registered, 3 up", "STATE", "zone-a", "cs2", "1.0TiB"} {
		if !strings.Contains(out, want) {
			t.Fatalf("status output lacks %q:\n%s", want, out)
		}
	}
	out, err = run("status", p.Addr, "--secret-file", filepath.Join(t.TempDir(), "nope"))
	if err == nil || !strings.Contains(out, "secret file") {
		t.Fatalf("status without a secret file: %v\n%s", err, out)
	}
	if err := p.Terminate(t); err != nil {
		t.Fatalf("SIGTERM: exit %v", err)
	}
	if ws := p.Cmd.ProcessState.Sys().(syscall.WaitStatus); !ws.Exited() || ws.ExitStatus() != 0 {
		t.Fatalf("meta did not exit cleanly on SIGTERM: %v", p.Cmd.ProcessState)
	}
}
