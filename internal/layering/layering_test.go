// Package layering holds the test of DESIGN.md's layering: arrows point
// down, and the trees listed in rules depend on nothing of the project
// outside what each may use, tests included.
package layering_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

const module = "github.com/rdmafs/rdmafs"

// rule says that the packages of tree (and everything in their dependency
// closure, tests included) import no package of the module under one of
// forbidden; why is the message of a violation.
type rule struct {
	tree      string
	forbidden []string // module-relative roots; "" is the whole module
	allowed   []string // module-relative roots exempt from forbidden
	why       string
}

var rules = []rule{
	{tree: "rdma", forbidden: []string{""}, allowed: []string{"rdma"},
		why: "the rdma tree must import nothing of the project outside rdma/"},
	// What chunkd needs of the metadata service it states as interfaces
	// (Membership, RepairPlanner); the adapter to meta's protobufs lives
	// with the command (cmd/chunkd/metamember).
	{tree: "chunkserver", forbidden: []string{"meta", "fs", "cmd", "tests"},
		why: "the chunkserver tree must not depend on meta/, fs/, cmd/ or tests/"},
	// meta and chunkserver are siblings: what both need of stripes (the
	// layout, shard lengths) lives in internal/stripe.
	{tree: "meta", forbidden: []string{"chunkserver", "fs", "cmd", "tests"},
		why: "the meta tree must not depend on chunkserver/, fs/, cmd/ or tests/"},
}

// listedPackage is the part of `go list -json` output the test reads.
type listedPackage struct {
	ImportPath string
	Imports    []string
}

func TestLayering(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go tool to list packages with: %v", err)
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	// The default build and the verbs tag select different files.
	for _, tags := range []string{"", "verbs"} {
		for _, r := range rules {
			pkgs, err := listPackages(goTool, filepath.Join(root, r.tree), tags)
			if err != nil {
				t.Fatalf("%s, tags %q: %v", r.tree, tags, err)
			}
			if len(pkgs) == 0 {
				t.Fatalf("%s, tags %q: go list found no packages", r.tree, tags)
			}
			for _, v := range r.violations(pkgs) {
				t.Errorf("tags %q: %s: %s", tags, v, r.why)
			}
		}
	}
}

// violations lists, sorted and once each, the packages of the closure that
// are forbidden and the imports of forbidden packages. A direct import is
// enough to check: everything in the closure from this module is either
// allowed (and its imports checked) or itself a violation.
func (r rule) violations(pkgs []listedPackage) []string {
	bad := map[string]bool{}
	for _, p := range pkgs {
		path := basePath(p.ImportPath)
		if r.forbids(path) {
			bad[path+" is in the dependency closure of "+r.tree+"/..."] = true
			continue
		}
		for _, imp := range p.Imports {
			if imp = basePath(imp); r.forbids(imp) {
				bad[path+" imports "+imp] = true
			}
		}
	}
	out := make([]string, 0, len(bad))
	for b := range bad {
		out = append(out, b)
	}
	sort.Strings(out)
	return out
}

// forbids reports whether the rule forbids the package path.
func (r rule) forbids(path string) bool {
	return inAny(path, r.forbidden) && !inAny(path, r.allowed)
}

// inAny reports whether path is one of the module-relative roots or a
// package below one; "" stands for the whole module.
func inAny(path string, roots []string) bool {
	for _, root := range roots {
		full := module
		if root != "" {
			full += "/" + root
		}
		if path == full || strings.HasPrefix(path, full+"/") {
			return true
		}
	}
	return false
}

// listPackages runs `go list -deps -test -json` over the packages below dir
// with the given build tags (none when empty) and decodes its output.
func listPackages(goTool, dir, tags string) ([]listedPackage, error) {
	args := []string{"list", "-deps", "-test", "-json=ImportPath,Imports"}
	if tags != "" {
		args = append(args, "-tags="+tags)
	}
	args = append(args, "./...")
	cmd := exec.Command(goTool, args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go %s: %w: %s", strings.Join(args, " "), err, stderr.Bytes())
	}
	var pkgs []listedPackage
	for dec := json.NewDecoder(bytes.NewReader(out)); ; {
		var p listedPackage
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			return pkgs, nil
		} else if err != nil {
			return nil, fmt.Errorf("decode go list output: %w", err)
		}
		pkgs = append(pkgs, p)
	}
}

// basePath returns the package a go list -test entry belongs to: it strips
// the " [pkg.test]" suffix of a package compiled for a test, the ".test"
// suffix of a test's generated main package and the "_test" suffix of an
// external test package.
func basePath(importPath string) string {
	if i := strings.IndexByte(importPath, ' '); i >= 0 {
		importPath = importPath[:i]
	}
	importPath = strings.TrimSuffix(importPath, ".test")
	return strings.TrimSuffix(importPath, "_test")
}
