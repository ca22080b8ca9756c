package main

import (
	"fmt"
	"strings"
)

// mountHelperName is the name under which rdmafs is the mount(8) helper:
// `make install` links /sbin/mount.rdmafs to it, so that `mount -t rdmafs`
// and fstab lines of type rdmafs work.
const mountHelperName = "mount.rdmafs"

// ignoredMountOptions are the generic mount(8) and fstab options that mean
// nothing to an rdmafs mount (or were handled by mount(8) itself).
var ignoredMountOptions = map[string]bool{
	"defaults": true, "rw": true, "auto": true, "noauto": true, "user": true, "nouser": true, "users": true,
	"_netdev": true, "nofail": true, "exec": true, "noexec": true, "suid": true, "nosuid": true,
	"dev": true, "nodev": true, "async": true, "relatime": true, "noatime": true, "atime": true,
	"nodiratime": true, "diratime": true, "owner": true, "group": true,
}

// mountHelperArgs translates a mount(8) helper call,
// `mount.rdmafs SPEC DIR [-sfnv] [-o OPTIONS] [-t TYPE]`, into the
// arguments of `rdmafs mount --background`: SPEC is META[:/SUBDIR] (META
// one meta address or several, comma-separated), each OPTION NAME=VALUE is
// the flag --NAME=VALUE and a bare NAME the flag --NAME. It reports whether
// mount(8) asked for a dry run (-f) and verbosity (-v).
func mountHelperArgs(argv []string) (args []string, fake, verbose bool, err error) {
	var pos, opts []string
	for i := 0; i < len(argv); i++ {
		a := argv[i]
		switch {
		case a == "-o" || a == "-t":
			if i+1 == len(argv) {
				return nil, false, false, fmt.Errorf("%s: %s needs a value", mountHelperName, a)
			}
			if a == "-o" {
				opts = append(opts, strings.Split(argv[i+1], ",")...)
			}
			i++
		case strings.HasPrefix(a, "-o"):
			opts = append(opts, strings.Split(a[2:], ",")...)
		case strings.HasPrefix(a, "-") && len(a) > 1:
			for _, c := range a[1:] {
				switch c {
				case 'f':
					fake = true
				case 'v':
					verbose = true
				case 's', 'n':
					// sloppy (unknown options are errors anyway), no mtab
				default:
					return nil, false, false, fmt.Errorf("%s: unknown option -%c", mountHelperName, c)
				}
			}
		default:
			pos = append(pos, a)
		}
	}
	if len(pos) != 2 {
		return nil, false, false, fmt.Errorf("usage: %s META[,META...][:/SUBDIR] MOUNTPOINT [-o OPTIONS]", mountHelperName)
	}
	meta, subdir := pos[0], ""
	if i := strings.Index(meta, ":/"); i >= 0 {
		meta, subdir = meta[:i], meta[i+1:]
	}
	args = []string{"mount", "--background"}
	if subdir != "" && subdir != "/" {
		args = append(args, "--subdir="+subdir)
	}
	for _, o := range opts {
		name, _, _ := strings.Cut(o, "=")
		switch {
		case o == "":
		case ignoredMountOptions[name] || strings.HasPrefix(name, "x-") || name == "comment":
		case o == "ro":
			return nil, false, false, fmt.Errorf("%s: read-only mounts are made with a read-only mount token (-o token-file=FILE)", mountHelperName)
		default:
			args = append(args, "--"+o)
		}
	}
	return append(args, meta, pos[1]), fake, verbose, nil
}
