package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/rdmafs/rdmafs/fs"
	"github.com/rdmafs/rdmafs/meta/client"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// trashCaller reaches the trash through a mount (a path on it, as the
// calling user) or the meta server (--meta, as root with the cluster secret).
type trashCaller struct {
	mf    metaFlags
	meta  string
	mount string
}

func (tc *trashCaller) register(cmd *cobra.Command) {
	tc.mf.register(cmd, 0, 0)
	cmd.Flags().StringVar(&tc.meta, "meta", "", "ask this meta server as root with the cluster secret instead of a mount (default $"+metaEnv+" when --mount is not given)")
	cmd.Flags().StringVar(&tc.mount, "mount", ".", "a path on the rdmafs mount to go through (as the calling user)")
}

// call runs req through the mount or the meta server.
func (tc *trashCaller) call(cmd *cobra.Command, req *metapb.TrashRequest) (*metapb.TrashReply, error) {
	meta := tc.meta
	if meta == "" && !cmd.Flags().Changed("mount") && !onMount(tc.mount) {
		meta = os.Getenv(metaEnv)
	}
	if meta == "" {
		return trashViaMount(tc.mount, req)
	}
	c, ctx, done, err := tc.mf.dial(cmd, meta)
	if err != nil {
		return nil, err
	}
	defer done()
	return trashViaMeta(ctx, c, req)
}

func trashViaMeta(ctx context.Context, c *client.Client, req *metapb.TrashRequest) (*metapb.TrashReply, error) {
	if req.Op != metapb.TrashRequest_LIST {
		return c.Trash(ctx, req)
	}
	out := &metapb.TrashReply{}
	for {
		r, err := c.Trash(ctx, req)
		if err != nil {
			return nil, err
		}
		out.Entries = append(out.Entries, r.Entries...)
		if r.Next == 0 {
			return out, nil
		}
		req.After = r.Next
	}
}

func trashViaMount(p string, req *metapb.TrashRequest) (*metapb.TrashReply, error) {
	if req.Op != metapb.TrashRequest_LIST {
		v, err := protojson.Marshal(req)
		if err != nil {
			return nil, err
		}
		if err := unix.Setxattr(p, fs.TrashXattr, v, 0); err != nil {
			return nil, mountErr(p, err)
		}
		return &metapb.TrashReply{Done: uint64(len(req.Inos))}, nil
	}
	out := &metapb.TrashReply{}
	attr := fs.TrashXattr
	buf := make([]byte, 64<<10)
	for {
		n, err := unix.Getxattr(p, attr, buf)
		if err != nil {
			return nil, mountErr(p, err)
		}
		r := &metapb.TrashReply{}
		if err := protojson.Unmarshal(buf[:n], r); err != nil {
			return nil, fmt.Errorf("%s: %w", attr, err)
		}
		out.Entries = append(out.Entries, r.Entries...)
		if r.Next == 0 {
			return out, nil
		}
		attr = fmt.Sprintf("%s.%d", fs.TrashXattr, r.Next)
	}
}

func mountErr(p string, err error) error {
	if errors.Is(err, syscall.ENOTSUP) {
		return fmt.Errorf("%s: not on an rdmafs mount (give --mount PATH on one, or --meta ADDR)", p)
	}
	return fmt.Errorf("%s: %w", p, err)
}

// newTrashCommand is `rdmafs trash list|restore|purge`.
func newTrashCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "trash",
		Short: "List, restore or purge deleted files kept in the trash",
		Long: "With the trash on (rdmafs config set trash-days N; a day by default), a file that loses its\n" +
			"last name (rm, or replaced by mv) is kept, with its data, for N days in the trash before meta\n" +
			"purges it. The trash is also seen as the directory .trash at the root of a mount, which ls\n" +
			"of the root does not show: its entries are INO|NAME, root sees every file and other users the\n" +
			"files they owned; rm of an entry purges it, and df .trash shows the space the trash holds.\n" +
			"Through a mount (--mount, default the current directory) the command acts as the calling user;\n" +
			"with --meta as root.",
	}
	var tc trashCaller
	var asJSON bool
	list := &cobra.Command{
		Use:   "list",
		Short: "List the files in the trash: inode, size, deletion time, purge time and where they were",
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := tc.call(cmd, &metapb.TrashRequest{Op: metapb.TrashRequest_LIST})
			if err != nil {
				return err
			}
			if asJSON {
				b, err := protojson.MarshalOptions{Multiline: true}.Marshal(r)
				if err != nil {
					return err
				}
				_, err = cmd.OutOrStdout().Write(append(b, '\n'))
				return err
			}
			printTrash(cmd.OutOrStdout(), r.Entries)
			return nil
		},
	}
	tc.register(list)
	list.Args = cobra.NoArgs
	list.Flags().BoolVar(&asJSON, "json", false, "print metapb.TrashReply as JSON")
	var tcR trashCaller
	restore := &cobra.Command{
		Use:   "restore INO...",
		Short: "Put files of the trash back where they were deleted from (INO from trash list)",
		RunE: func(cmd *cobra.Command, args []string) error {
			inos, err := parseInos(args)
			if err != nil {
				return err
			}
			if _, err := tcR.call(cmd, &metapb.TrashRequest{Op: metapb.TrashRequest_RESTORE, Inos: inos}); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "restored %d files\n", len(inos))
			return nil
		},
	}
	tcR.register(restore)
	restore.Args = cobra.MinimumNArgs(1)
	var tcP trashCaller
	var all bool
	purge := &cobra.Command{
		Use:   "purge INO... | --all",
		Short: "Delete files of the trash now, freeing their space",
		RunE: func(cmd *cobra.Command, args []string) error {
			inos, err := parseInos(args)
			if err != nil {
				return err
			}
			if all == (len(inos) > 0) {
				return errors.New("give INO... or --all")
			}
			r, err := tcP.call(cmd, &metapb.TrashRequest{Op: metapb.TrashRequest_PURGE, Inos: inos, All: all})
			if err != nil {
				return err
			}
			if all && r.Done == 0 {
				fmt.Fprintln(cmd.OutOrStdout(), "purged the trash")
				return nil
			}
			fmt.Fprintf(cmd.OutOrStdout(), "purged %d files\n", r.Done)
			return nil
		},
	}
	tcP.register(purge)
	purge.Args = cobra.ArbitraryArgs
	purge.Flags().BoolVar(&all, "all", false, "purge every file of the trash you may see")
	cmd.AddCommand(list, restore, purge)
	return cmd
}

func parseInos(args []string) ([]uint64, error) {
	var inos []uint64
	for _, a := range args {
		num, _, _ := strings.Cut(a, "|") // an entry name of .trash works too
		ino, err := strconv.ParseUint(num, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%q is not an inode number", a)
		}
		inos = append(inos, ino)
	}
	return inos, nil
}

func printTrash(w io.Writer, entries []*metapb.TrashEntry) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "INO\tSIZE\tUID\tDELETED\tPURGED AFTER\tPATH")
	for _, e := range entries {
		fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%s\t%s\n", e.Ino, humanBytes(e.Bytes), e.Uid,
			time.Unix(0, e.DeletedNs).Format(time.DateTime), time.Unix(0, e.ExpiresNs).Format(time.DateTime), e.Path)
	}
	tw.Flush()
}

// newConfigCommand is `rdmafs config get|set`.
func newConfigCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Read or change cluster settings (trash-days)",
	}
	var mfG, mfS metaFlags
	get := &cobra.Command{
		Use:   "get [META-ADDR] [NAME]",
		Short: "Print cluster settings",
		RunE: func(cmd *cobra.Command, args []string) error {
			addr, rest, err := mfG.address(args)
			if len(args) == 2 {
				addr, rest, err = args[0], args[1:], nil
			}
			if err != nil {
				return err
			}
			c, ctx, done, err := mfG.dial(cmd, addr)
			if err != nil {
				return err
			}
			defer done()
			req := &metapb.ConfigRequest{}
			if len(rest) > 0 {
				req.Name = rest[0]
			}
			r, err := c.Config(ctx, req)
			if err != nil {
				return err
			}
			for _, it := range r.Items {
				fmt.Fprintf(cmd.OutOrStdout(), "%s = %s\t# %s\n", it.Name, it.Value, it.About)
			}
			return nil
		},
	}
	mfG.register(get, 30*time.Second, 0)
	get.Args = cobra.MaximumNArgs(2)
	set := &cobra.Command{
		Use:   "set [META-ADDR] NAME VALUE",
		Short: "Change a cluster setting",
		RunE: func(cmd *cobra.Command, args []string) error {
			addr, rest, err := mfS.address(args)
			if err != nil {
				return err
			}
			c, ctx, done, err := mfS.dial(cmd, addr)
			if err != nil {
				return err
			}
			defer done()
			r, err := c.Config(ctx, &metapb.ConfigRequest{Name: rest[0], Value: rest[1], Set: true})
			if err != nil {
				return err
			}
			for _, it := range r.Items {
				fmt.Fprintf(cmd.OutOrStdout(), "%s = %s\n", it.Name, it.Value)
			}
			return nil
		},
	}
	mfS.register(set, 30*time.Second, 2)
	cmd.AddCommand(get, set)
	return cmd
}
