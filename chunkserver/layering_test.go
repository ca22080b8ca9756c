package chunkserver_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"sort"
	"strings"
	"testing"
)

// TestImportsNothingAbove checks that the chunkserver tree, tests included,
// depends on no package of the metadata service, the FUSE client, the
// commands or the end-to-end tests: what chunkd needs of the metadata service
// it states as interfaces (Membership, RepairPlanner), and the adapter to
// meta's protobufs lives with the command (cmd/chunkd/metamember).
func TestImportsNothingAbove(t *testing.T) {
	const module = "github.com/rdmafs/rdmafs"
	forbidden := []string{module + "/meta", module + "/fs", module + "/cmd", module + "/tests"}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go tool to list packages with: %v", err)
	}
	args := []string{"list", "-deps", "-test", "-json=ImportPath,Imports", "./..."}
	cmd := exec.Command(goTool, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go %s: %v: %s", strings.Join(args, " "), err, stderr.Bytes())
	}
	bad := make(map[string]bool) // one line per violation, whatever the variant
	n := 0
	for dec := json.NewDecoder(bytes.NewReader(out)); ; n++ {
		var p struct {
			ImportPath string
			Imports    []string
		}
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decode go list output: %v", err)
		}
		path, _, _ := strings.Cut(p.ImportPath, " ") // "p [q.test]": p compiled for q's test
		if inAny(path, forbidden) {
			bad[path+" is in the dependency closure of chunkserver/..."] = true
			continue
		}
		for _, imp := range p.Imports {
			if imp, _, _ = strings.Cut(imp, " "); inAny(imp, forbidden) {
				bad[fmt.Sprintf("%s imports %s", path, imp)] = true
			}
		}
	}
	if n == 0 {
		t.Fatal("go list found no packages")
	}
	lines := make([]string, 0, len(bad))
	for b := range bad {
		lines = append(lines, b)
	}
	sort.Strings(lines)
	for _, b := range lines {
		t.Errorf("%s: the chunkserver tree must not depend on meta/, fs/, cmd/ or tests/", b)
	}
}

// inAny reports whether path is one of roots or a package below one of them.
func inAny(path string, roots []string) bool {
	for _, r := range roots {
		if path == r || strings.HasPrefix(path, r+"/") {
			return true
		}
	}
	return false
}
