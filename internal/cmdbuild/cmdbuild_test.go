package cmdbuild

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestModuleRoot(t *testing.T) {
	root, err := ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil || !strings.Contains(string(b), "module github.com/rdmafs/rdmafs\n") {
		t.Fatalf("ModuleRoot = %s: go.mod %v:\n%.200s", root, err, b)
	}
}

// TestBuild builds chunkd (the smaller command, with ForTest) and runs it,
// and checks that a package that does not exist fails with the go
// command's words.
func TestBuild(t *testing.T) {
	dir := ForTest(t, "./cmd/chunkd")
	if out, err := exec.Command(filepath.Join(dir, "chunkd"), "--help").CombinedOutput(); err != nil || !strings.Contains(string(out), "--metrics") {
		t.Fatalf("chunkd --help: %v\n%s", err, out)
	}
	err := Build(dir, "./cmd/nonexistent")
	if err == nil || !strings.Contains(err.Error(), "nonexistent") {
		t.Fatalf("Build of a missing package: %v", err)
	}
}
