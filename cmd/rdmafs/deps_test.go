package main

import (
	"bytes"
	"os/exec"
	"strings"
	"testing"
)

// TestCommandsDoNotLinkTesting checks that no command (cmd/...) links package
// testing, which test helpers import: a command that needs one of their
// services uses a non-test package (as bench meta uses etcdproc, not etcdtest).
func TestCommandsDoNotLinkTesting(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go tool to list packages with: %v", err)
	}
	const pattern = "github.com/rdmafs/rdmafs/cmd/..."
	for _, tags := range []string{"", "verbs"} {
		cmd := exec.Command(goTool, "list", "-deps", "-tags="+tags,
			"-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, pattern)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list -deps -tags=%q %s: %v: %s", tags, pattern, err, stderr.Bytes())
		}
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			pkg, imports, _ := strings.Cut(line, " ")
			for _, imp := range strings.Fields(imports) {
				if imp == "testing" {
					t.Errorf("tags %q: %s imports testing, so a command links it", tags, pkg)
				}
			}
		}
	}
}
