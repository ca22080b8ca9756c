package etcdproc

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestStartStop starts a server, checks that it answers and runs as the
// process it names, and stops it twice: the process is gone and the temporary
// data directory removed, and the second Stop returns the first one's result.
func TestStartStop(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := Start(ctx, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !s.healthy(ctx) {
		t.Fatalf("etcd on %s is not healthy after Start", s.Endpoint())
	}
	if got, want := s.URL("p"), "etcd://"+s.Endpoint()+"/p"; got != want {
		t.Errorf("URL = %q, want %q", got, want)
	}
	if err := syscall.Kill(s.PID(), 0); err != nil {
		t.Fatalf("pid %d: %v", s.PID(), err)
	}
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(s.dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("data directory %s after Stop: %v, want it removed", s.dir, err)
	}
	if err := s.Stop(); err != nil {
		t.Errorf("second Stop: %v", err)
	}
}

// TestShutdownKills checks that Shutdown with a context already done kills
// the server at once and keeps a data directory it did not make.
func TestShutdownKills(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := Start(ctx, Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	done, stop := context.WithCancel(context.Background())
	stop()
	start := time.Now()
	if err := s.Shutdown(done); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("Shutdown with a done context took %v", d)
	}
	select {
	case <-s.waited:
	default:
		t.Fatal("the process was not reaped")
	}
	if _, err := os.Stat(filepath.Join(dir, "etcd")); err != nil {
		t.Errorf("the caller's data directory: %v, want it kept", err)
	}
}

// TestStartBadBinary checks that a missing binary named by EnvBinary fails
// Start with an error naming the variable.
func TestStartBadBinary(t *testing.T) {
	t.Setenv(EnvBinary, filepath.Join(t.TempDir(), "no-etcd"))
	_, err := Start(context.Background(), Options{})
	if err == nil || !strings.Contains(err.Error(), EnvBinary) {
		t.Fatalf("Start = %v, want an error naming %s", err, EnvBinary)
	}
}

// TestStartExits checks that a binary that exits at once fails Start with
// its output, and leaves no temporary directory behind.
func TestStartExits(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "etcd")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\necho no such flag >&2\nexit 2\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	t.Setenv(EnvBinary, bin)
	t.Setenv("TMPDIR", t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := Start(ctx, Options{})
	if err == nil || !strings.Contains(err.Error(), "exited during startup") || !strings.Contains(err.Error(), "no such flag") {
		t.Fatalf("Start = %v, want an exit during startup with the output", err)
	}
	left, err := os.ReadDir(os.Getenv("TMPDIR"))
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 0 {
		t.Errorf("left behind in TMPDIR: %v", left)
	}
}

// TestTailBuffer checks that the buffer keeps the last max bytes.
func TestTailBuffer(t *testing.T) {
	b := &tailBuffer{max: 4}
	for _, s := range []string{"ab", "cd", "ef"} {
		if n, err := b.Write([]byte(s)); n != len(s) || err != nil {
			t.Fatalf("Write(%q) = %d, %v", s, n, err)
		}
	}
	if got := b.String(); got != "cdef" {
		t.Errorf("String = %q, want %q", got, "cdef")
	}
}
