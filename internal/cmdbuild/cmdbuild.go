// Package cmdbuild builds the module's commands (rdmafs, chunkd) for tests
// that run them as processes: the one place tests call `go build`.
package cmdbuild

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// ModuleRoot returns the directory holding the module's go.mod: found from
// this package's source file, else asked of the go command (run in the
// current directory, which must then lie inside the module).
func ModuleRoot() (string, error) {
	if _, file, _, ok := runtime.Caller(0); ok {
		root := filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
		if _, err := os.Stat(filepath.Join(root, "go.mod")); err == nil {
			return root, nil
		}
	}
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("cmdbuild: find the module root: go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("cmdbuild: find the module root: not inside the module")
	}
	return filepath.Dir(gomod), nil
}

// Build compiles pkgs, package patterns relative to the module root such as
// "./cmd/chunkd" or "./cmd/...", with `go build -o dir/` run in the module
// root: each command's binary lands in dir (which must exist) under its
// name. A failed build returns an error holding the go command's output.
func Build(dir string, pkgs ...string) error {
	root, err := ModuleRoot()
	if err != nil {
		return err
	}
	args := append([]string{"build", "-o", dir + string(filepath.Separator)}, pkgs...)
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("cmdbuild: go build %s: %w\n%s", strings.Join(pkgs, " "), err, out)
	}
	return nil
}

// Temp builds every command of the module (./cmd/...: rdmafs and chunkd)
// into a new temporary directory and returns it with remove, which deletes
// it. On error nothing is left behind.
func Temp() (dir string, remove func(), err error) {
	dir, err = os.MkdirTemp("", "rdmafs-bin-")
	if err != nil {
		return "", nil, fmt.Errorf("cmdbuild: %w", err)
	}
	remove = func() { os.RemoveAll(dir) }
	if err := Build(dir, "./cmd/..."); err != nil {
		remove()
		return "", nil, err
	}
	return dir, remove, nil
}

// ForTest builds pkgs (as Build) for a test that runs them as processes,
// into a temporary directory of t that is removed when the test ends, and
// returns that directory. In -short mode it skips the test instead: a build
// takes seconds. A failed build fails the test.
func ForTest(t testing.TB, pkgs ...string) string {
	t.Helper()
	if testing.Short() {
		t.Skipf("builds %s (not in -short mode)", strings.Join(pkgs, " "))
	}
	dir := t.TempDir()
	if err := Build(dir, pkgs...); err != nil {
		t.Fatal(err)
	}
	return dir
}
