// Package buildinfo describes the running binary: its version, the commit
// it was built from, the Go version and the build tags (verbs: the RDMA
// verbs transport compiled in), for the commands' --version.
package buildinfo

import (
	"fmt"
	"runtime/debug"
	"strings"
)

// Info is what the binary knows of its build.
type Info struct {
	Version   string // module version ("(devel)" for a build from a checkout)
	Commit    string // VCS revision, "" when unknown
	Time      string // VCS commit time (RFC 3339), "" when unknown
	Modified  bool   // built from a tree with uncommitted changes
	GoVersion string
	Tags      []string // build tags (-tags)
}

// commit and commitTime are set by the Makefile's build (-ldflags -X) from
// git, for builds without the Go toolchain's VCS stamping (-buildvcs=false).
var commit, commitTime string

// Read returns the build information of the running binary.
func Read() Info {
	in := Info{Version: "unknown"}
	if bi, ok := debug.ReadBuildInfo(); ok {
		in = fromBuildInfo(bi)
	}
	if in.Commit == "" {
		in.Commit, in.Time = commit, commitTime
	}
	return in
}

func fromBuildInfo(bi *debug.BuildInfo) Info {
	in := Info{Version: bi.Main.Version, GoVersion: bi.GoVersion}
	if in.Version == "" {
		in.Version = "(devel)"
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			in.Commit = s.Value
		case "vcs.time":
			in.Time = s.Value
		case "vcs.modified":
			in.Modified = s.Value == "true"
		case "-tags":
			for _, t := range strings.Split(s.Value, ",") {
				if t = strings.TrimSpace(t); t != "" {
					in.Tags = append(in.Tags, t)
				}
			}
		}
	}
	return in
}

// String formats the information on one line, as --version prints it:
// "v1.2.3 commit 0b87fb7 (2026-11-26T06:00:00Z), go1.26.8, tags: verbs".
func (in Info) String() string {
	var b strings.Builder
	b.WriteString(in.Version)
	if in.Commit != "" {
		c := in.Commit
		if len(c) > 12 {
			c = c[:12]
		}
		fmt.Fprintf(&b, " commit %s", c)
		if in.Modified {
			b.WriteString("+modified")
		}
		if in.Time != "" {
			fmt.Fprintf(&b, " (%s)", in.Time)
		}
	}
	fmt.Fprintf(&b, ", %s", in.GoVersion)
	if len(in.Tags) == 0 {
		b.WriteString(", tags: none")
	} else {
		fmt.Fprintf(&b, ", tags: %s", strings.Join(in.Tags, ","))
	}
	return b.String()
}
