package rdma_test

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

// module is the project's module path; rdmaTree is the part of it the rdma
// tree may import.
const (
	module   = "github.com/rdmafs/rdmafs"
	rdmaTree = module + "/rdma"
)

// listedPackage is the part of `go list -json` output the layering test reads.
type listedPackage struct {
	ImportPath string
	Imports    []string
}

// TestImportsNothingOfTheProject checks the layering rule of DESIGN.md: the
// rdma tree imports nothing of the project outside rdma/. It lists every
// package under rdma/ with its tests and dependencies, once per build tag set
// that selects different files (the default build and the verbs tag), and
// fails naming each rdma package that imports a project package outside the
// tree. A direct import is enough to check: a dependency outside the tree that
// is reached only transitively must be imported directly by some package in
// the closure, and everything in the closure from this module is either in
// the tree (checked) or itself a violation.
func TestImportsNothingOfTheProject(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go tool to list packages with: %v", err)
	}
	for _, tags := range []string{"", "verbs"} {
		pkgs, err := listPackages(goTool, tags)
		if err != nil {
			t.Fatalf("tags %q: %v", tags, err)
		}
		if len(pkgs) == 0 {
			t.Fatalf("tags %q: go list found no packages", tags)
		}
		bad := make(map[string]bool) // one line per violation, whatever the variant
		for _, p := range pkgs {
			path := basePath(p.ImportPath)
			if !inTree(path, module) {
				continue
			}
			if !inTree(path, rdmaTree) {
				bad[path+" is in the dependency closure of rdma/..."] = true
				continue
			}
			for _, imp := range p.Imports {
				imp = basePath(imp)
				if inTree(imp, module) && !inTree(imp, rdmaTree) {
					bad[path+" imports "+imp] = true
				}
			}
		}
		lines := make([]string, 0, len(bad))
		for b := range bad {
			lines = append(lines, b)
		}
		sort.Strings(lines)
		for _, b := range lines {
			t.Errorf("tags %q: %s: the rdma tree must import nothing of the project outside rdma/", tags, b)
		}
	}
}

// listPackages runs `go list -deps -test -json` over rdma/... with the given
// build tags (none when empty) and decodes its stream of package objects.
func listPackages(goTool, tags string) ([]listedPackage, error) {
	args := []string{"list", "-deps", "-test", "-json=ImportPath,Imports"}
	if tags != "" {
		args = append(args, "-tags="+tags)
	}
	args = append(args, "./...")
	cmd := exec.Command(goTool, args...)
	cmd.Dir = "." // the rdma package directory: ./... is the rdma tree
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go %s: %w: %s", strings.Join(args, " "), err, stderr.Bytes())
	}
	var pkgs []listedPackage
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p listedPackage
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			return pkgs, nil
		} else if err != nil {
			return nil, fmt.Errorf("decode go list output: %w", err)
		}
		pkgs = append(pkgs, p)
	}
}

// basePath returns the package directory a go list -test entry belongs to:
// it strips the " [pkg.test]" suffix of a package variant compiled for a
// test, the ".test" suffix of a test's generated main package and the "_test"
// suffix of an external test package.
func basePath(importPath string) string {
	if i := strings.IndexByte(importPath, ' '); i >= 0 {
		importPath = importPath[:i]
	}
	importPath = strings.TrimSuffix(importPath, ".test")
	return strings.TrimSuffix(importPath, "_test")
}

// inTree reports whether path is root or a package below it.
func inTree(path, root string) bool {
	return path == root || strings.HasPrefix(path, root+"/")
}
