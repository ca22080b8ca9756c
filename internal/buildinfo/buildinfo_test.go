package buildinfo

import (
	"runtime/debug"
	"testing"
)

func TestString(t *testing.T) {
	bi := &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v0.3.0"}, Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "0b87fb7a1b2c3d4e5f60718293a4b5c6d7e8f901"},
		{Key: "vcs.time", Value: "2026-11-26T06:00:00Z"},
		{Key: "vcs.modified", Value: "true"},
		{Key: "-tags", Value: "verbs, netgo"},
	}}
	const want = "v0.3.0 commit 0b87fb7a1b2c+modified (2026-11-26T06:00:00Z), go1.26.8, tags: verbs,netgo"
	if got := fromBuildInfo(bi).String(); got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	plain := fromBuildInfo(&debug.BuildInfo{GoVersion: "go1.26.8"})
	if got, want := plain.String(), "(devel), go1.26.8, tags: none"; got != want {
		t.Errorf("String() without VCS data = %q, want %q", got, want)
	}
}
