package main

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/rdmafs/rdmafs/meta/metatest"
)

// TestMetaFlags runs the commands that call a meta server through
// metaFlags against an in-process one: a missing --secret-file is refused,
// an unreadable one names the server, and status and admin repair (with
// and without --wait) answer; $RDMAFS_META and $RDMAFS_SECRET_FILE stand
// in for the address and --secret-file, and status --json prints JSON.
func TestMetaFlags(t *testing.T) {
	m := metatest.Start(t, metatest.Options{})
	run := func(cmd *cobra.Command, args ...string) (string, error) {
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs(args)
		err := cmd.ExecuteContext(context.Background())
		return out.String(), err
	}
	t.Setenv(metaEnv, "")
	t.Setenv(secretEnv, "")
	if _, err := run(newStatusCommand(), m.Addr); err == nil || !strings.Contains(err.Error(), "secret-file") {
		t.Fatalf("status without --secret-file: %v, want it required", err)
	}
	missing := filepath.Join(t.TempDir(), "none")
	if _, err := run(newStatusCommand(), m.Addr, "--secret-file", missing); err == nil || !strings.Contains(err.Error(), m.Addr) {
		t.Fatalf("status with a missing secret file: %v, want an error naming %s", err, m.Addr)
	}
	out, err := run(newStatusCommand(), m.Addr, "--secret-file", m.SecretFile, "--timeout", "0")
	if err != nil || !strings.Contains(out, "chunkservers: 0 registered") {
		t.Fatalf("status: %v\n%s", err, out)
	}
	out, err = run(newAdminRepairCommand(), m.Addr, "--secret-file", m.SecretFile, "--timeout", "10s")
	if err != nil || !strings.Contains(out, "stripes:") {
		t.Fatalf("admin repair: %v\n%s", err, out)
	}
	out, err = run(newAdminRepairCommand(), m.Addr, "--secret-file", m.SecretFile, "--timeout", "10s", "--wait", "--interval", "10ms")
	if err != nil || !strings.Contains(out, "full redundancy") {
		t.Fatalf("admin repair --wait: %v\n%s", err, out)
	}
	if _, err := run(newStatusCommand(), "--secret-file", m.SecretFile); err == nil || !strings.Contains(err.Error(), metaEnv) {
		t.Fatalf("status without an address: %v, want an error naming $%s", err, metaEnv)
	}

	t.Setenv(metaEnv, m.Addr)
	t.Setenv(secretEnv, m.SecretFile)
	out, err = run(newStatusCommand(), "--json")
	var st struct {
		ClusterID    string `json:"clusterId"`
		Chunkservers []any  `json:"chunkservers"`
	}
	if err != nil || json.Unmarshal([]byte(out), &st) != nil || st.ClusterID == "" || st.Chunkservers == nil {
		t.Fatalf("status --json from the environment: %v\n%s", err, out)
	}
	// drain's one argument is the chunkserver: the server names it unknown.
	if _, err := run(newAdminDrainCommand(), "no-such-server"); err == nil || !strings.Contains(err.Error(), "no-such-server") {
		t.Fatalf("admin drain ID from the environment: %v, want the server's refusal of no-such-server", err)
	}
}

// TestMetaFlagsTimeout checks that dial bounds the context by --timeout
// when it is positive and leaves it unbounded at 0.
func TestMetaFlagsTimeout(t *testing.T) {
	m := metatest.Start(t, metatest.Options{})
	for _, timeout := range []time.Duration{0, time.Minute} {
		f := metaFlags{secretFile: m.SecretFile, timeout: timeout}
		cmd := &cobra.Command{}
		cmd.SetContext(context.Background())
		c, ctx, done, err := f.dial(cmd, m.Addr)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := ctx.Deadline(); ok != (timeout > 0) {
			t.Errorf("--timeout %v: context has a deadline: %v", timeout, ok)
		}
		if c == nil {
			t.Fatal("dial returned no client")
		}
		done()
		if timeout > 0 && ctx.Err() == nil {
			t.Errorf("--timeout %v: done did not cancel the context", timeout)
		}
	}
}
