package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/rdmafs/rdmafs/fs"
	"github.com/rdmafs/rdmafs/internal/bytesize"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// quotaTarget is what a quota command names: a directory (a path on a mount,
// or inside the file system with --meta) or a user or group.
type quotaTarget struct {
	tt       treeTarget
	uid, gid int64
}

func (q *quotaTarget) register(cmd *cobra.Command) {
	q.tt.register(cmd)
	cmd.Flags().Int64Var(&q.uid, "uid", -1, "the quota of this user in the whole file system (PATH: any path on the mount)")
	cmd.Flags().Int64Var(&q.gid, "gid", -1, "the quota of this group in the whole file system (PATH: any path on the mount)")
}

// call sends req about PATH (args[0], default ".") through its mount, or
// to the meta server, and returns the reply (through a mount, the quotas
// read back after a change).
func (q *quotaTarget) call(cmd *cobra.Command, args []string, req *metapb.QuotaRequest) (*metapb.QuotaReply, error) {
	p := "."
	if len(args) > 0 {
		p = args[0]
	}
	switch {
	case q.uid >= 0 && q.gid >= 0:
		return nil, fmt.Errorf("give --uid or --gid, not both")
	case q.uid >= 0:
		req.ByUid, req.Id = true, uint32(q.uid)
	case q.gid >= 0:
		req.ByGid, req.Id = true, uint32(q.gid)
	}
	meta, err := q.tt.viaMeta(cmd, p)
	if err != nil {
		return nil, err
	}
	if meta {
		c, ctx, done, err := q.tt.mf.dial(cmd, q.tt.meta)
		if err != nil {
			return nil, err
		}
		defer done()
		if !req.ByUid && !req.ByGid && (req.Op != metapb.QuotaRequest_LIST && req.Op != metapb.QuotaRequest_CHECK || len(args) > 0) {
			if req.Ino, err = resolvePath(ctx, c, p); err != nil {
				return nil, err
			}
		}
		return c.Quota(ctx, req)
	}
	read := func(attr string) (*metapb.QuotaReply, error) {
		buf := make([]byte, 64<<10)
		n, err := unix.Getxattr(p, attr, buf)
		if err != nil {
			if err == unix.ENODATA {
				return nil, fmt.Errorf("%s: no quota", p)
			}
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		r := &metapb.QuotaReply{}
		return r, protojson.Unmarshal(buf[:n], r)
	}
	switch req.Op {
	case metapb.QuotaRequest_LIST:
		return read(fs.QuotaListXattr)
	case metapb.QuotaRequest_GET:
		if req.ByUid || req.ByGid {
			r, err := read(fs.QuotaListXattr)
			if err != nil {
				return nil, err
			}
			for _, qi := range r.Quotas {
				if qi.ByUid == req.ByUid && qi.ByGid == req.ByGid && qi.Id == req.Id {
					return &metapb.QuotaReply{Quotas: []*metapb.QuotaInfo{qi}}, nil
				}
			}
			return nil, fmt.Errorf("no such quota")
		}
		return read(fs.QuotaXattr)
	}
	if req.Op == metapb.QuotaRequest_CHECK && len(args) == 0 {
		req.Ino = 0 // every quota
	}
	v, err := protojson.Marshal(req)
	if err != nil {
		return nil, err
	}
	if err := unix.Setxattr(p, fs.QuotaXattr, v, 0); err != nil {
		return nil, mountErr(p, err)
	}
	if req.Op == metapb.QuotaRequest_DELETE {
		return &metapb.QuotaReply{}, nil
	}
	return read(fs.QuotaListXattr)
}

// newQuotaCommand is `rdmafs quota set|get|list|delete|check`.
func newQuotaCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "quota",
		Short: "Limit the space and inodes of a directory tree, a user or a group",
		Long: "A directory quota limits the bytes of file data and the inodes below a directory; --uid and\n" +
			"--gid quotas those of a user or group in the whole file system. Usage is kept by meta in the\n" +
			"same transactions that change it. Creates past an inode limit fail with EDQUOT; writes past a\n" +
			"space limit fail with EDQUOT (at close or fsync: data is written back) once the grants already\n" +
			"held are used. df inside a directory with a quota shows the quota as the size. A directory is\n" +
			"not renamed across directory quotas (EXDEV; mv copies). A file counts where it was created or\n" +
			"last renamed into, not again for other hard links. Changes need root.",
	}
	var setQ quotaTarget
	var space, inodes string
	set := &cobra.Command{
		Use:   "set [PATH] --space SIZE --inodes N",
		Short: "Set the limits of a quota (0 or absent: no limit of that kind)",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := &metapb.QuotaRequest{Op: metapb.QuotaRequest_SET}
			if space != "" {
				v, err := bytesize.Parse(space)
				if err != nil {
					return fmt.Errorf("--space: %w", err)
				}
				req.SpaceLimit = uint64(v)
			}
			if inodes != "" {
				v, err := parseCount(inodes)
				if err != nil {
					return fmt.Errorf("--inodes: %w", err)
				}
				req.InodeLimit = v
			}
			r, err := setQ.call(cmd, args, req)
			if err != nil {
				return err
			}
			printQuotas(cmd.OutOrStdout(), r.Quotas)
			return nil
		},
	}
	setQ.register(set)
	set.Args = cobra.MaximumNArgs(1)
	set.Flags().StringVar(&space, "space", "", "bytes of file data (e.g. 10GiB)")
	set.Flags().StringVar(&inodes, "inodes", "", "files, directories and others (e.g. 1M)")

	simple := func(use, short string, op metapb.QuotaRequest_Op) *cobra.Command {
		var q quotaTarget
		c := &cobra.Command{
			Use:   use,
			Short: short,
			RunE: func(cmd *cobra.Command, args []string) error {
				r, err := q.call(cmd, args, &metapb.QuotaRequest{Op: op})
				if err != nil {
					return err
				}
				for _, f := range r.Fixed {
					fmt.Fprintln(cmd.OutOrStdout(), "fixed:", f)
				}
				printQuotas(cmd.OutOrStdout(), r.Quotas)
				return nil
			},
		}
		q.register(c)
		c.Args = cobra.MaximumNArgs(1)
		return c
	}
	cmd.AddCommand(set,
		simple("get [PATH]", "Show a quota and its usage", metapb.QuotaRequest_GET),
		simple("list [PATH-ON-MOUNT]", "Show every quota and its usage", metapb.QuotaRequest_LIST),
		simple("delete [PATH]", "Remove a quota", metapb.QuotaRequest_DELETE),
		simple("check [PATH]", "Recount usage from the namespace (every quota, or PATH's) and fix drift", metapb.QuotaRequest_CHECK))
	return cmd
}

// parseCount parses a count with an optional K, M or G (powers of 1000).
func parseCount(s string) (uint64, error) {
	mult := uint64(1)
	switch {
	case strings.HasSuffix(s, "K") || strings.HasSuffix(s, "k"):
		mult = 1e3
	case strings.HasSuffix(s, "M"):
		mult = 1e6
	case strings.HasSuffix(s, "G"):
		mult = 1e9
	}
	if mult > 1 {
		s = s[:len(s)-1]
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q is not a count (e.g. 1000, 10K, 1M)", s)
	}
	return v * mult, nil
}

// quotaLabel names a quota: its directory's path, or its user or group.
func quotaLabel(q *metapb.QuotaInfo) string {
	switch {
	case q.ByUid:
		return fmt.Sprintf("uid %d", q.Id)
	case q.ByGid:
		return fmt.Sprintf("gid %d", q.Id)
	}
	return q.Path
}

// printQuotaLine prints one quota's usage and limits on a line.
func printQuotaLine(w io.Writer, q *metapb.QuotaInfo) {
	lim := func(v uint64, f func(uint64) string) string {
		if v == 0 {
			return "no limit"
		}
		return f(v)
	}
	fmt.Fprintf(w, "space %s of %s, inodes %d of %s\n", humanBytes(q.SpaceUsed), lim(q.SpaceLimit, humanBytes),
		q.InodesUsed, lim(q.InodeLimit, func(v uint64) string { return strconv.FormatUint(v, 10) }))
}

func printQuotas(w io.Writer, qs []*metapb.QuotaInfo) {
	if len(qs) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "QUOTA\tSPACE USED\tSPACE LIMIT\tINODES USED\tINODE LIMIT")
	limit := func(v uint64, f func(uint64) string) string {
		if v == 0 {
			return "-"
		}
		return f(v)
	}
	count := func(v uint64) string { return strconv.FormatUint(v, 10) }
	for _, q := range qs {
		name := quotaLabel(q)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\n", name, humanBytes(q.SpaceUsed), limit(q.SpaceLimit, humanBytes), q.InodesUsed, limit(q.InodeLimit, count))
	}
	tw.Flush()
}
