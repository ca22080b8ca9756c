package main

import (
	"slices"
	"strings"
	"testing"
)

// TestMountHelperArgs: mount(8)'s helper call becomes `rdmafs mount
// --background` with each -o option a flag, the generic fstab options
// dropped and SPEC's :/SUBDIR a --subdir.
func TestMountHelperArgs(t *testing.T) {
	tests := []struct {
		argv    []string
		want    string
		fake    bool
		wantErr string
	}{
		{[]string{"10.0.0.1:7400,10.0.0.2:7400:/data/x", "/mnt/x", "-o", "rw,_netdev,secret-file=/etc/rdmafs/secret,transport=tcp,x-systemd.automount,wsync"},
			"mount --background --subdir=/data/x --secret-file=/etc/rdmafs/secret --transport=tcp --wsync 10.0.0.1:7400,10.0.0.2:7400 /mnt/x", false, ""},
		{[]string{"meta:7400", "/mnt/y", "-sfn", "-odefaults,mem=1GiB", "-t", "rdmafs"},
			"mount --background --mem=1GiB meta:7400 /mnt/y", true, ""},
		{[]string{"meta:7400:/", "/mnt/z"}, "mount --background meta:7400 /mnt/z", false, ""},
		{[]string{"meta:7400", "/mnt/z", "-o", "ro"}, "", false, "read-only"},
		{[]string{"meta:7400"}, "", false, "usage"},
		{[]string{"meta:7400", "/mnt/z", "-q"}, "", false, "unknown option"},
	}
	for _, tt := range tests {
		args, fake, _, err := mountHelperArgs(tt.argv)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%q: error %v, want one about %q", tt.argv, err, tt.wantErr)
			}
			continue
		}
		if err != nil || strings.Join(args, " ") != tt.want || fake != tt.fake {
			t.Errorf("%q:\n got %q (fake %v, %v)\nwant %q (fake %v)", tt.argv, strings.Join(args, " "), fake, err, tt.want, tt.fake)
		}
		// Every flag it makes is one rdmafs mount has.
		cmd := newMountCommand()
		for _, a := range args[2:] {
			if name, ok := strings.CutPrefix(a, "--"); ok {
				name, _, _ = strings.Cut(name, "=")
				if cmd.Flags().Lookup(name) == nil && !slices.Contains([]string{"background"}, name) {
					t.Errorf("%q: rdmafs mount has no flag --%s", tt.argv, name)
				}
			}
		}
	}
}
