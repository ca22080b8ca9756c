package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/rdmafs/rdmafs/internal/bytesize"
	"github.com/rdmafs/rdmafs/internal/devcluster"
	"github.com/rdmafs/rdmafs/internal/fiorun"
	"github.com/rdmafs/rdmafs/internal/fuseceiling"
)

func newBenchFSCommand() *cobra.Command {
	var (
		size, jobs, transport, clusterDir, data string
		runtime, rounds, inserts                int
		permCeiling                             bool
	)
	c := &cobra.Command{
		Use:   "fs",
		Short: "fio against rdmafs and against the FUSE ceiling (go-fuse loopback over tmpfs, no passthrough), same run",
		Long: `Brings up a local cluster (meta + 6 chunkd on 127.0.0.1, EC 4+2), mounts it,
mounts go-fuse's loopback file system over a tmpfs directory with kernel
passthrough off (every byte through the daemon: the FUSE ceiling on this machine),
runs the same fio job file against both and prints both with their ratio.

--data says where the cluster keeps its data: "memory" (the default) puts it
on tmpfs under /dev/shm, like the ceiling's, so that the ratio measures the file
systems and not the storage under them; "disk" puts it under $TMPDIR, where
durable writes are bound by the disk (every commit is synced, and EC 4+2 writes
1.5 bytes per byte of file data).

Each round runs the job set twice per file system, in the order rdmafs, ceiling,
ceiling, rdmafs, and a figure is the median of a file system's runs (all are
printed): on a shared machine a run's speed depends on what ran just before it,
and now and then on a neighbour that takes the CPU for a few seconds.

The reference of a fio job is the FUSE ceiling. sqlite's inserts are timed on
rdmafs, on the ceiling and on the machine's local disk ($TMPDIR), and compared
with each: the ceiling does no durable writes at all, so it bounds what any
FUSE file system can reach against the local disk.

--ceiling-permissions also runs the fio jobs on a second ceiling mounted with
default_permissions, as rdmafs is (the kernel checks permissions, and asks for
a directory's attributes again after each create or unlink in it), and prints
rdmafs against it too: the like-for-like reference for metadata jobs.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if rounds < 1 {
				return fmt.Errorf("bench fs: --rounds %d: at least 1", rounds)
			}
			base, err := benchDataBase(data)
			if err != nil {
				return err
			}
			if clusterDir != "" && cmd.Flags().Changed("data") {
				return fmt.Errorf("bench fs: --dir and --data: give one")
			}
			dataDir := clusterDir
			if dataDir == "" {
				dataDir = base
			}
			if err := checkRoom(dataDir, size); err != nil {
				return err
			}
			return runBenchFS(cmd.Context(), cmd.OutOrStdout(), benchFSConfig{jobs: strings.Split(jobs, ","), size: size, runtime: runtime,
				rounds: rounds, inserts: inserts, transport: transport, clusterDir: clusterDir, base: base, permCeiling: permCeiling})
		},
	}
	fl := c.Flags()
	fl.StringVar(&size, "size", "512M", "fio file size")
	fl.IntVar(&runtime, "runtime", 10, "seconds of each timed job")
	fl.IntVar(&rounds, "rounds", 2, "rounds of four runs (rdmafs, ceiling, ceiling, rdmafs; six with --ceiling-permissions)")
	fl.StringVar(&jobs, "jobs", "bench/jobs.fio,bench/small.fio,bench/small-stat.fio", "fio job files, comma-separated (they use DIR, SIZE, RUNTIME)")
	fl.IntVar(&inserts, "sqlite-inserts", 300, "sqlite rollback-journal inserts (one transaction each) timed on rdmafs, the ceiling and local disk ($TMPDIR); 0: skip")
	fl.StringVar(&transport, "transport", "auto", "rdma transport")
	fl.BoolVar(&permCeiling, "ceiling-permissions", false, "also run the fio jobs on a ceiling mounted with default_permissions, as rdmafs is")
	fl.StringVar(&clusterDir, "dir", "", "cluster directory (default: a new one where --data says, removed after)")
	fl.StringVar(&data, "data", "memory", `where the cluster keeps its data: "memory" (tmpfs, like the ceiling) or "disk"`)
	return c
}

// benchDataBase returns the directory under which --data puts the cluster.
func benchDataBase(data string) (string, error) {
	switch data {
	case "memory":
		return "/dev/shm", nil
	case "disk":
		return os.TempDir(), nil
	}
	return "", fmt.Errorf(`bench fs: --data %q: "memory" or "disk"`, data)
}

// checkRoom fails early, with advice, when /dev/shm cannot hold a run: the
// ceiling's copy of the file and, when the cluster's data (dataDir) is on the
// same file system, the rdmafs file under EC 4+2 (1.5 times its size) and the
// slots of deleted versions each chunkd keeps for reuse (up to 256 MiB each).
func checkRoom(dataDir, size string) error {
	n, err := bytesize.Parse(size)
	if err != nil {
		return fmt.Errorf("bench fs: --size: %w", err)
	}
	const shm = "/dev/shm"
	need := n
	if sameFS(dataDir, shm) {
		need += n*3/2 + 6*(256<<20)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(shm, &st); err != nil {
		return fmt.Errorf("bench fs: %s: %w", shm, err)
	}
	if free := int64(st.Bavail) * st.Bsize; st.Type == unix.TMPFS_MAGIC && free < need {
		return fmt.Errorf("bench fs: %s has %d MiB free, a %s run needs about %d MiB there: use --data disk, a smaller --size, or a larger %s",
			shm, free>>20, size, need>>20, shm)
	}
	return nil
}

// sameFS reports whether dir, or its nearest existing ancestor, is on the
// file system of other.
func sameFS(dir, other string) bool {
	var a, b unix.Stat_t
	if unix.Stat(other, &b) != nil {
		return false
	}
	for dir = filepath.Clean(dir); unix.Stat(dir, &a) != nil; dir = filepath.Dir(dir) {
		if dir == filepath.Dir(dir) {
			return false
		}
	}
	return a.Dev == b.Dev
}

// storageOf describes the file system under dir for the report.
func storageOf(dir string) string {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err == nil && st.Type == unix.TMPFS_MAGIC {
		return "data in memory (tmpfs, like the ceiling's)"
	}
	return "data on disk (" + dir + ")"
}

// benchFSConfig is what `bench fs` runs.
type benchFSConfig struct {
	jobs             []string // fio job files, run in order
	size             string
	runtime, rounds  int
	inserts          int  // sqlite inserts per run (0: none)
	permCeiling      bool // also a ceiling with default_permissions (fio jobs only)
	transport        string
	clusterDir, base string
}

func runBenchFS(ctx context.Context, w io.Writer, cfg benchFSConfig) error {
	jobs, size, runtime, rounds, transport, clusterDir, base := cfg.jobs, cfg.size, cfg.runtime, cfg.rounds, cfg.transport, cfg.clusterDir, cfg.base
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	if clusterDir == "" {
		if clusterDir, err = os.MkdirTemp(base, "rdmafs-bench-"); err != nil {
			return fmt.Errorf("bench fs: cluster directory: %w", err)
		}
		defer os.RemoveAll(clusterDir)
	}
	cl, err := devcluster.Up(ctx, devcluster.Config{Dir: clusterDir, Bin: filepath.Dir(exe), Transport: transport, Mount: true})
	if err != nil {
		return fmt.Errorf("bench fs: %w", err)
	}
	defer cl.Down(context.Background())
	// The ceiling: tmpfs under /dev/shm, looped back through go-fuse.
	backing, err := os.MkdirTemp("/dev/shm", "rdmafs-ceiling-")
	if err != nil {
		return fmt.Errorf("bench fs: tmpfs directory: %w", err)
	}
	defer os.RemoveAll(backing)
	ceilMnt, err := os.MkdirTemp("", "rdmafs-ceiling-mnt-")
	if err != nil {
		return err
	}
	defer os.Remove(ceilMnt)
	// The ceiling is served by this process: with the processors a mount
	// gets, so that both daemons run under the same scheduler settings.
	useMountProcs()
	unmount, err := mountCeiling(backing, ceilMnt, false)
	if err != nil {
		return err
	}
	defer unmount()
	var permMnt string
	if cfg.permCeiling {
		permBacking, err := os.MkdirTemp("/dev/shm", "rdmafs-ceiling-perm-")
		if err != nil {
			return fmt.Errorf("bench fs: tmpfs directory: %w", err)
		}
		defer os.RemoveAll(permBacking)
		if permMnt, err = os.MkdirTemp("", "rdmafs-ceiling-perm-mnt-"); err != nil {
			return err
		}
		defer os.Remove(permMnt)
		unmount, err := mountCeiling(permBacking, permMnt, true)
		if err != nil {
			return err
		}
		defer unmount()
	}
	env := func(dir string) []string {
		return []string{"DIR=" + dir, "SIZE=" + size, fmt.Sprintf("RUNTIME=%d", runtime)}
	}
	fmt.Fprintf(w, "fio %s, %s file, %ds timed jobs, median of %d runs each; rdmafs: EC 4+2 over %d chunkd on 127.0.0.1 (%s transport), %s\n",
		strings.Join(jobs, " "), size, runtime, 2*rounds, len(cl.Chunk), transport, storageOf(clusterDir))
	// Each round runs both job sets twice, in the order rdmafs, ceiling,
	// ceiling, rdmafs, each in a fresh directory removed afterwards, and a
	// figure is the median of a file system's runs: a run's speed depends on
	// what ran just before it, which the order evens out, and now and then
	// on a neighbour taking the CPU, which the median shrugs off where a mean
	// does not (docs/performance.md).
	type target struct {
		name, mnt string
		runs      [][]fiorun.Result
		sqlite    [len(sqliteDatabases)][]float64 // inserts/s per run, per database
	}
	ours := &target{name: "rdmafs", mnt: cl.MountPoint}
	ceil := &target{name: "ceiling", mnt: ceilMnt}
	perm := &target{name: "ceiling with default_permissions", mnt: permMnt} // fio only
	local := &target{name: "local disk"}                                    // sqlite only
	var order []*target
	for range rounds {
		if cfg.permCeiling {
			order = append(order, ours, ceil, perm, perm, ceil, ours)
		} else {
			order = append(order, ours, ceil, ceil, ours)
		}
	}
	for i, t := range order {
		dir := filepath.Join(t.mnt, fmt.Sprintf("bench-%d", i))
		if err := os.Mkdir(dir, 0o755); err != nil {
			return fmt.Errorf("bench fs: %s: %w", t.name, err)
		}
		var res []fiorun.Result
		for _, jf := range jobs {
			r, err := fiorun.Run(ctx, jf, env(dir)...)
			if err != nil {
				os.RemoveAll(dir)
				return fmt.Errorf("bench fs: %s: %w", t.name, err)
			}
			res = append(res, r...)
		}
		if cfg.inserts > 0 && t != perm {
			if err := sqliteRuns(ctx, dir, cfg.inserts, &t.sqlite); err != nil {
				os.RemoveAll(dir)
				return fmt.Errorf("bench fs: %s: %w", t.name, err)
			}
		}
		if err := os.RemoveAll(dir); err != nil {
			return fmt.Errorf("bench fs: %s: %w", t.name, err)
		}
		t.runs = append(t.runs, res)
		if t == ceil && cfg.inserts > 0 {
			// sqlite's other reference is the machine's local disk, in
			// the ceiling's turn.
			dir, err := os.MkdirTemp("", "rdmafs-sqlite-")
			if err != nil {
				return err
			}
			err = sqliteRuns(ctx, dir, cfg.inserts, &local.sqlite)
			os.RemoveAll(dir)
			if err != nil {
				return fmt.Errorf("bench fs: local disk: %w", err)
			}
		}
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "job\trdmafs\treference\tratio\trdmafs runs\treference runs\t")
	for i, r := range ours.runs[0] {
		a, unit, aok := figures(ours.runs, i)
		b, _, bok := figures(ceil.runs, i)
		if !aok || !bok {
			return fmt.Errorf("bench fs: job %s is missing from a run", r.Name)
		}
		fmt.Fprintf(tw, "%s\t%.0f %s\t%.0f %s\t%.2f\t%s\t%s\t\n", r.Name, median(a), unit, median(b), unit, median(a)/median(b), joinFigures(a), joinFigures(b))
		if cfg.permCeiling {
			c, _, cok := figures(perm.runs, i)
			if !cok {
				return fmt.Errorf("bench fs: job %s is missing from a run", r.Name)
			}
			fmt.Fprintf(tw, "%s (vs %s)\t%.0f %s\t%.0f %s\t%.2f\t%s\t%s\t\n", r.Name, perm.name, median(a), unit, median(c), unit, median(a)/median(c), joinFigures(a), joinFigures(c))
		}
	}
	for j, db := range sqliteDatabases {
		for _, ref := range []*target{local, ceil} {
			a, b := ours.sqlite[j], ref.sqlite[j]
			if len(a) == 0 || len(b) == 0 {
				continue
			}
			fmt.Fprintf(tw, "%s (vs %s)\t%.0f %s\t%.0f %s\t%.2f\t%s\t%s\t\n", db.name, ref.name, median(a), "txn/s", median(b), "txn/s", median(a)/median(b), joinFigures(a), joinFigures(b))
		}
	}
	return tw.Flush()
}

// mountCeiling mounts the FUSE ceiling of backing at mnt (with permissions:
// default_permissions) and returns its unmount.
func mountCeiling(backing, mnt string, permissions bool) (func(), error) {
	srv, err := fuseceiling.Mount(backing, mnt, permissions)
	if err != nil {
		return nil, fmt.Errorf("bench fs: %w", err)
	}
	return func() {
		for i := 0; i < 50 && srv.Unmount() != nil; i++ {
			time.Sleep(100 * time.Millisecond)
		}
	}, nil
}

// figures returns job i's figure from each run — IOPS for the 4 KiB random
// reads, otherwise bandwidth in MiB/s — and its unit; ok is false when a run
// lacks the job.
func figures(runs [][]fiorun.Result, i int) (v []float64, unit string, ok bool) {
	for _, run := range runs {
		if i >= len(run) {
			return nil, "", false
		}
		r := run[i]
		switch {
		case strings.HasPrefix(r.Name, "randread-4k"):
			v, unit = append(v, r.ReadIOPS), "IOPS"
		case strings.HasPrefix(r.Name, "randwrite-4k"):
			v, unit = append(v, r.WriteIOPS), "IOPS"
		case r.Name == "create" || r.Name == "stat" || r.Name == "delete":
			v, unit = append(v, r.ReadIOPS), "files/s" // fio's file engines count an operation as a read
		case strings.HasPrefix(r.Name, "smallfile"):
			v, unit = append(v, r.WriteIOPS), "files/s"
		case r.WriteBW > 0:
			v, unit = append(v, r.WriteBW/(1<<20)), "MiB/s"
		default:
			v, unit = append(v, r.ReadBW/(1<<20)), "MiB/s"
		}
	}
	return v, unit, true
}

// median returns the median of v (the mean of the middle two when len(v) is
// even); v is not modified.
func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

func joinFigures(v []float64) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = fmt.Sprintf("%.0f", x)
	}
	return strings.Join(s, ", ")
}

// sqliteDatabases are the databases sqliteRun times inserts into: a new one,
// which stays within the layout's inline size (64 KiB) and so lives in
// metadata, and one filled with rows beforehand to about 1 MiB, whose
// stripes are on the chunkservers, as a real database's are.
var sqliteDatabases = [2]struct {
	name string
	rows int // rows filled in before the timed inserts
}{
	{"sqlite-insert", 0},
	{"sqlite-insert, 1 MiB db", 8000},
}

// sqliteRuns times n inserts into each of sqliteDatabases in dir and
// appends the figures to per.
func sqliteRuns(ctx context.Context, dir string, n int, per *[len(sqliteDatabases)][]float64) error {
	for j, db := range sqliteDatabases {
		r, err := sqliteRun(ctx, dir, n, db.rows)
		if err != nil {
			return err
		}
		per[j] = append(per[j], r)
	}
	return nil
}

// sqliteRun times n inserts into a new sqlite database in dir, filled with
// rows rows first, each insert its own transaction in rollback-journal mode
// with synchronous=FULL (the journal is created, written and synced, the
// database written and synced, the journal deleted: the small-file and fsync
// path applications exercise most), and returns inserts per second.
func sqliteRun(ctx context.Context, dir string, n, rows int) (float64, error) {
	db := filepath.Join(dir, "bench.sqlite")
	if err := os.Remove(db); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return 0, err
	}
	setup := "PRAGMA journal_mode=DELETE;\nPRAGMA synchronous=FULL;\nCREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT);\n"
	if rows > 0 {
		setup += fmt.Sprintf("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x < %d) INSERT INTO t(v) SELECT x || ' ' || hex(zeroblob(50)) FROM c;\n", rows)
	}
	var script strings.Builder
	script.WriteString("PRAGMA synchronous=FULL;\n")
	pad := strings.Repeat("x", 100)
	for i := range n {
		fmt.Fprintf(&script, "INSERT INTO t(v) VALUES('%d %s');\n", i, pad)
	}
	if err := sqliteExec(ctx, db, setup); err != nil {
		return 0, err
	}
	start := time.Now()
	if err := sqliteExec(ctx, db, script.String()); err != nil {
		return 0, err
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

func sqliteExec(ctx context.Context, db, script string) error {
	cmd := exec.CommandContext(ctx, "sqlite3", "-bail", db)
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("sqlite3 %s: %v: %s", db, err, out)
	}
	return nil
}
