package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"syscall"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/rdmafs/rdmafs/fs"
	"github.com/rdmafs/rdmafs/meta/client"
	"github.com/rdmafs/rdmafs/meta/core"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// newInfoCommand is `rdmafs info PATH...`: where a file's data is, or a
// directory's layout and totals.
func newInfoCommand() *cobra.Command {
	var mf metaFlags
	var asJSON bool
	var meta string
	cmd := &cobra.Command{
		Use:   "info PATH...",
		Short: "Show where files' data is (stripes, shards, chunkservers) and directories' layouts and totals",
		Long: "For a file: its inode, layout and size, and each committed stripe with its version, length\n" +
			"and health, and for each shard the chunkserver id, address, zone and state. For a directory:\n" +
			"the layout new files below it get, and the totals of the tree below it (files, bytes, stripes,\n" +
			"degraded and lost stripes). PATH is a path on a mounted rdmafs, read through the mount; with\n" +
			"--meta (or $RDMAFS_META for a PATH not on a mount) it is a path inside the file system, asked of\n" +
			"the meta server with the cluster secret.",
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var c *client.Client
			var ctx context.Context
			var done func()
			defer func() {
				if done != nil {
					done()
				}
			}()
			getInfo := func(p string) ([]*metapb.InfoReply, error) {
				if !cmd.Flags().Changed("meta") {
					pages, err := infoFromMount(p)
					if !errors.Is(err, errNotMounted) {
						return pages, err
					}
					if meta == "" {
						return nil, fmt.Errorf("%s: not on an rdmafs mount; give --meta ADDR (or $%s) to ask the meta server", p, metaEnv)
					}
				}
				if c == nil {
					var err error
					if c, ctx, done, err = mf.dial(cmd, meta); err != nil {
						return nil, err
					}
				}
				return infoFromMeta(ctx, c, p)
			}
			var all []map[string]any
			w := cmd.OutOrStdout()
			for _, p := range args {
				pages, err := getInfo(p)
				if err != nil {
					return err
				}
				r := mergeInfo(pages)
				if asJSON {
					b, err := protojson.Marshal(r)
					if err != nil {
						return err
					}
					all = append(all, map[string]any{"path": p, "info": json.RawMessage(b)})
					continue
				}
				printInfo(w, p, r)
			}
			if asJSON {
				enc := json.NewEncoder(w)
				enc.SetIndent("", "  ")
				return enc.Encode(all)
			}
			return nil
		},
	}
	mf.register(cmd, 0, 0)
	cmd.Args = cobra.MinimumNArgs(1)
	cmd.Flags().StringVar(&meta, "meta", os.Getenv(metaEnv), "ask this meta server (default $"+metaEnv+" for paths not on a mount); PATH is then a path inside the file system")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON: a list of {path, info} with info as metapb.InfoReply")
	return cmd
}

// errNotMounted says a path is not on an rdmafs mount.
var errNotMounted = errors.New("not on an rdmafs mount")

// infoFromMount reads the pages of p's InfoXattr through its mount.
func infoFromMount(p string) ([]*metapb.InfoReply, error) {
	var pages []*metapb.InfoReply
	attr := fs.InfoXattr
	buf := make([]byte, 64<<10)
	for {
		n, err := unix.Getxattr(p, attr, buf)
		if errors.Is(err, syscall.ENOTSUP) {
			return nil, errNotMounted
		}
		if errors.Is(err, syscall.ENODATA) {
			return nil, fmt.Errorf("%s: its mount does not offer %s (an older rdmafs?): ask the meta server with --meta", p, attr)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		r := &metapb.InfoReply{}
		if err := protojson.Unmarshal(buf[:n], r); err != nil {
			return nil, fmt.Errorf("%s: the mount's %s: %w", p, attr, err)
		}
		pages = append(pages, r)
		if r.Next == 0 {
			return pages, nil
		}
		attr = fmt.Sprintf("%s.%d", fs.InfoXattr, r.Next)
	}
}

// resolvePath looks up p, a path inside the file system, from its root.
func resolvePath(ctx context.Context, c *client.Client, p string) (uint64, error) {
	ino := uint64(core.RootIno)
	for _, name := range strings.Split(path.Clean("/"+p), "/") {
		if name == "" {
			continue
		}
		r, err := c.Lookup(ctx, &metapb.LookupRequest{Parent: ino, Name: name})
		if err != nil {
			return 0, fmt.Errorf("%s: %q: %w", p, name, err)
		}
		ino = r.Attr.Ino
	}
	return ino, nil
}

// infoFromMeta resolves p from the file system's root and reads its Info
// pages from meta.
func infoFromMeta(ctx context.Context, c *client.Client, p string) ([]*metapb.InfoReply, error) {
	ino, err := resolvePath(ctx, c, p)
	if err != nil {
		return nil, err
	}
	var pages []*metapb.InfoReply
	first := uint64(0)
	for {
		r, err := c.Info(ctx, &metapb.InfoRequest{Ino: ino, First: first, Totals: first == 0})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		pages = append(pages, r)
		if r.Next == 0 {
			return pages, nil
		}
		first = r.Next
	}
}

// mergeInfo joins the pages of one Info into one reply.
func mergeInfo(pages []*metapb.InfoReply) *metapb.InfoReply {
	r := pages[0]
	for _, p := range pages[1:] {
		r.Stripes = append(r.Stripes, p.Stripes...)
	}
	r.Next = 0
	return r
}

// printInfo prints r for people.
func printInfo(w io.Writer, p string, r *metapb.InfoReply) {
	a := r.Attr
	l := r.Layout.Stripe()
	switch {
	case a.Mode&syscall.S_IFMT == syscall.S_IFDIR:
		fmt.Fprintf(w, "%s: directory, inode %d\n  layout of new files: %s\n", p, a.Ino, describeLayout(l))
		if t := r.Totals; t != nil {
			fmt.Fprintf(w, "  files %d  directories %d  others %d  bytes %s (%d)  stripes %d  degraded %d  lost %d\n",
				t.Files, t.Directories, t.Others, humanBytes(t.Bytes), t.Bytes, t.Stripes, t.Degraded, t.Lost)
			if t.SharedBytes > 0 {
				fmt.Fprintf(w, "  shared with snapshots: %s in stripes shared (copy-on-write), %s not\n", humanBytes(t.SharedBytes), humanBytes(max(t.Bytes, t.SharedBytes)-t.SharedBytes))
			}
		}
		if q := r.Quota; q != nil {
			fmt.Fprintf(w, "  quota: ")
			printQuotaLine(w, q)
		}
		return
	case a.Mode&syscall.S_IFMT != syscall.S_IFREG:
		fmt.Fprintf(w, "%s: not a regular file or directory, inode %d\n", p, a.Ino)
		return
	}
	fmt.Fprintf(w, "%s: file, inode %d, size %s (%d), %d stripes\n  layout: %s\n", p, a.Ino, humanBytes(a.Size), a.Size, len(r.Stripes), describeLayout(l))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, st := range r.Stripes {
		if st.Inline {
			fmt.Fprintf(tw, "  stripe %d\tversion %d\tlength %d\tinline (in metadata)\n", st.Stripe, st.Version, st.Length)
			continue
		}
		shared := ""
		if st.Shared {
			shared = ", shared with a snapshot"
		}
		fmt.Fprintf(tw, "  stripe %d\tversion %d\tlength %d\t%s%s\n", st.Stripe, st.Version, st.Length, st.Health, shared)
		for i, sh := range st.Shards {
			kind := "data"
			if i >= int(st.Layout.GetK()) {
				kind = "parity"
			}
			zone := sh.Zone
			if zone == "" {
				zone = "-"
			}
			addr := sh.Address
			if addr == "" {
				addr = "(unknown chunkserver)"
			}
			fmt.Fprintf(tw, "    shard %d %s\tchunk %d\t%s\t%s\tzone %s\t%s\n", i, kind, sh.ChunkId, sh.ServerId, addr, zone, sh.State)
		}
	}
	tw.Flush()
}
