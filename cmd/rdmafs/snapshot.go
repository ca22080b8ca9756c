package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/rdmafs/rdmafs/fs"
	"github.com/rdmafs/rdmafs/meta/client"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// treeTarget is how a tree command reaches the file system: through the
// mount its paths are on, or, with --meta (or $RDMAFS_META for paths not on
// a mount), as paths inside the file system asked of the meta server.
type treeTarget struct {
	mf   metaFlags
	meta string
}

func (tt *treeTarget) register(cmd *cobra.Command) {
	tt.mf.register(cmd, 0, 0)
	cmd.Flags().StringVar(&tt.meta, "meta", os.Getenv(metaEnv), "ask this meta server (default $"+metaEnv+" for paths not on a mount); paths are then inside the file system")
}

// viaMeta reports whether the command's paths go to the meta server: --meta
// was given, or p is not on an rdmafs mount and a meta server is known.
func (tt *treeTarget) viaMeta(cmd *cobra.Command, p string) (bool, error) {
	if cmd.Flags().Changed("meta") {
		return true, nil
	}
	if onMount(p) {
		return false, nil
	}
	if tt.meta == "" {
		return false, fmt.Errorf("%s: not on an rdmafs mount; give --meta ADDR (or $%s) to ask the meta server", p, metaEnv)
	}
	return true, nil
}

// onMount reports whether the existing path p (or its directory) is on an
// rdmafs mount: every rdmafs node answers fs.MetricsXattr.
func onMount(p string) bool {
	for _, q := range []string{p, filepath.Dir(p)} {
		_, err := unix.Getxattr(q, fs.MetricsXattr, nil)
		if err == nil || errors.Is(err, syscall.ERANGE) {
			return true
		}
		if !errors.Is(err, syscall.ENOENT) {
			return false
		}
	}
	return false
}

// newSnapshotCommand is `rdmafs snapshot SRC DST`.
func newSnapshotCommand() *cobra.Command {
	var tt treeTarget
	var quiet bool
	cmd := &cobra.Command{
		Use:   "snapshot SRC DST",
		Short: "Copy a file or a directory tree instantly, sharing its data until either side writes",
		Long: "Copies SRC, a file or a directory tree, to DST, a new path in the same file system. Only\n" +
			"metadata is copied: the copy's stripes share the source's chunk versions, and the first write\n" +
			"to either side after the snapshot writes new versions of the stripes it touches (copy-on-write);\n" +
			"space grows only by what is rewritten. Owners, modes, times, extended attributes and hard links\n" +
			"within the tree are kept; it needs root (or the cluster secret with --meta).\n\n" +
			"Each file is copied as it was last committed (data still being written on other mounts is\n" +
			"not in it; this mount's is committed first). A tree is copied directory by directory in\n" +
			"batches, not atomically: files created or removed in SRC while it runs may or may not be in\n" +
			"DST. An interrupted snapshot goes on where it stopped when the same command is run again.\n" +
			"Remove a snapshot with rm -rf or rdmafs rmr.",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			src, dst := args[0], args[1]
			meta, err := tt.viaMeta(cmd, src)
			if err != nil {
				return err
			}
			quiet = quiet || !isTerminal(cmd.ErrOrStderr())
			progress := func(r *metapb.SnapshotReply) {}
			if !quiet {
				progress = func(r *metapb.SnapshotReply) {
					fmt.Fprintf(cmd.ErrOrStderr(), "\r%s: %d files, %d directories, %s shared ", dst, r.Files, r.Dirs, humanBytes(r.Bytes))
				}
			}
			start := time.Now()
			var r *metapb.SnapshotReply
			if meta {
				r, err = snapshotViaMeta(cmd, &tt, src, dst, progress)
			} else {
				r, err = snapshotViaMount(cmd.Context(), src, dst, progress)
			}
			if !quiet {
				fmt.Fprintln(cmd.ErrOrStderr())
			}
			if err != nil {
				return err
			}
			took := time.Since(start).Round(time.Millisecond)
			if r.Dirs == 0 {
				fmt.Fprintf(cmd.OutOrStdout(), "snapshot %s of %s: a file of %s, in %s\n", dst, src, humanBytes(r.Bytes), took)
				return nil
			}
			fmt.Fprintf(cmd.OutOrStdout(), "snapshot %s of %s: %d files, %d directories, %s shared in %d stripes, in %s\n",
				dst, src, r.Files, r.Dirs, humanBytes(r.Bytes), r.SharedStripes, took)
			return nil
		},
	}
	tt.register(cmd)
	cmd.Args = cobra.ExactArgs(2)
	cmd.Flags().BoolVarP(&quiet, "quiet", "q", false, "print no progress")
	return cmd
}

// snapshotViaMount asks src's mount for the snapshot, reading its progress
// while it runs.
func snapshotViaMount(ctx context.Context, src, dst string, progress func(*metapb.SnapshotReply)) (*metapb.SnapshotReply, error) {
	var st, pst unix.Stat_t
	if err := unix.Lstat(src, &st); err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	parent, name := filepath.Dir(dst), filepath.Base(dst)
	if err := unix.Stat(parent, &pst); err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	if st.Dev != pst.Dev {
		return nil, fmt.Errorf("snapshot: %s and %s are not on the same rdmafs mount", src, parent)
	}
	spec, err := json.Marshal(fs.SnapshotSpec{Src: st.Ino, Name: name})
	if err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- unix.Setxattr(parent, fs.SnapshotXattr, spec, 0) }()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			if err != nil {
				return nil, fmt.Errorf("snapshot %s to %s: %w", src, dst, err)
			}
			r, err := snapshotProgress(parent, name)
			if err == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
				r.Files, r.Bytes = 1, uint64(st.Size) // a file's snapshot keeps no record
			}
			// The mount drops the kernel's cached entry for dst just after
			// its reply: wait until the new entry shows.
			settle(func() bool { return unix.Lstat(dst, new(unix.Stat_t)) == nil })
			return r, err
		case <-tick.C:
			if r, err := snapshotProgress(parent, name); err == nil {
				progress(r)
			}
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// snapshotProgress reads the progress of snapshot name in directory parent
// through its mount.
func snapshotProgress(parent, name string) (*metapb.SnapshotReply, error) {
	buf := make([]byte, 4096)
	n, err := unix.Getxattr(parent, fs.SnapshotXattr+"."+name, buf)
	if err != nil {
		return nil, err
	}
	r := &metapb.SnapshotReply{}
	return r, protojson.Unmarshal(buf[:n], r)
}

// snapshotViaMeta makes the snapshot with calls to the meta server.
func snapshotViaMeta(cmd *cobra.Command, tt *treeTarget, src, dst string, progress func(*metapb.SnapshotReply)) (*metapb.SnapshotReply, error) {
	c, ctx, done, err := tt.mf.dial(cmd, tt.meta)
	if err != nil {
		return nil, err
	}
	defer done()
	srcIno, err := resolvePath(ctx, c, src)
	if err != nil {
		return nil, err
	}
	parent, err := resolvePath(ctx, c, filepath.Dir(filepath.Clean("/"+dst)))
	if err != nil {
		return nil, err
	}
	req := &metapb.SnapshotRequest{Src: srcIno, DstParent: parent, Name: filepath.Base(dst)}
	for {
		r, err := c.Snapshot(ctx, req)
		if err != nil {
			return nil, fmt.Errorf("snapshot %s to %s: %w", src, dst, err)
		}
		progress(r)
		if r.Done {
			return r, nil
		}
	}
}

// newRmrCommand is `rdmafs rmr PATH...`.
func newRmrCommand() *cobra.Command {
	var tt treeTarget
	var quiet bool
	cmd := &cobra.Command{
		Use:   "rmr PATH...",
		Short: "Remove directory trees on the meta server, fast (rm -rf without a round trip per file)",
		Long: "Removes each PATH and everything below it. The meta server walks the tree and removes it in\n" +
			"batches of 128 entries per transaction, deepest first, with the permission checks rm -r\n" +
			"would meet for the calling user (through a mount) or as root (--meta with the cluster secret).\n" +
			"An interrupted rmr leaves part of the tree; run it again.",
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, p := range args {
				meta, err := tt.viaMeta(cmd, p)
				if err != nil {
					return err
				}
				start := time.Now()
				var files, dirs uint64
				if meta {
					files, dirs, err = rmrViaMeta(cmd, &tt, p, quiet)
				} else {
					err = rmrViaMount(p)
				}
				if err != nil {
					return fmt.Errorf("rmr %s: %w", p, err)
				}
				if meta {
					fmt.Fprintf(cmd.OutOrStdout(), "removed %s: %d files, %d directories in %s\n", p, files, dirs, time.Since(start).Round(time.Millisecond))
				} else if !quiet {
					fmt.Fprintf(cmd.OutOrStdout(), "removed %s in %s\n", p, time.Since(start).Round(time.Millisecond))
				}
			}
			return nil
		},
	}
	tt.register(cmd)
	cmd.Args = cobra.MinimumNArgs(1)
	cmd.Flags().BoolVarP(&quiet, "quiet", "q", false, "print nothing")
	return cmd
}

// rmrViaMount removes p through its mount: a directory tree on the meta
// server (rdmafs.rmr on its parent), anything else as rm does.
func rmrViaMount(p string) error {
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return os.Remove(p)
	}
	clean := filepath.Clean(p)
	if err := unix.Setxattr(filepath.Dir(clean), fs.RmrXattr, []byte(filepath.Base(clean)), 0); err != nil {
		return err
	}
	// The mount drops the kernel's cached entries of the tree just after its
	// reply: wait until they are gone.
	settle(func() bool { return errors.Is(unix.Lstat(p, new(unix.Stat_t)), unix.ENOENT) })
	return nil
}

// settle waits, at most a second, until done reports true.
func settle(done func() bool) {
	for deadline := time.Now().Add(time.Second); !done() && time.Now().Before(deadline); {
		time.Sleep(2 * time.Millisecond)
	}
}

// rmrViaMeta removes the tree p with calls to the meta server.
func rmrViaMeta(cmd *cobra.Command, tt *treeTarget, p string, quiet bool) (files, dirs uint64, err error) {
	c, ctx, done, err := tt.mf.dial(cmd, tt.meta)
	if err != nil {
		return 0, 0, err
	}
	defer done()
	clean := filepath.Clean("/" + p)
	if clean == "/" {
		return 0, 0, errors.New("refusing to remove the root")
	}
	parent, err := resolvePath(ctx, c, filepath.Dir(clean))
	if err != nil {
		return 0, 0, err
	}
	files, dirs, err = removeTree(ctx, c, &metapb.RemoveTreeRequest{Parent: parent, Name: filepath.Base(clean)}, progressTo(cmd.ErrOrStderr(), quiet))
	if !quiet && isTerminal(cmd.ErrOrStderr()) {
		fmt.Fprintln(cmd.ErrOrStderr())
	}
	return files, dirs, err
}

func progressTo(w io.Writer, quiet bool) func(files, dirs uint64) {
	if quiet || !isTerminal(w) {
		return func(uint64, uint64) {}
	}
	return func(files, dirs uint64) { fmt.Fprintf(w, "\r%d files, %d directories removed ", files, dirs) }
}

// isTerminal reports whether w is a terminal (progress is drawn only there).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// removeTree calls RemoveTree until the tree is gone.
func removeTree(ctx context.Context, c *client.Client, req *metapb.RemoveTreeRequest, progress func(files, dirs uint64)) (files, dirs uint64, err error) {
	for {
		r, err := c.RemoveTree(ctx, req)
		if err != nil {
			return files, dirs, err
		}
		files, dirs = files+r.Files, dirs+r.Dirs
		progress(files, dirs)
		if r.Done {
			return files, dirs, nil
		}
	}
}
