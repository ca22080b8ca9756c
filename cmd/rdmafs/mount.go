package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rdmafs/rdmafs/internal/sdnotify"

	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"

	chunkclient "github.com/rdmafs/rdmafs/chunkserver/client"
	"github.com/rdmafs/rdmafs/chunkserver/proto"
	"github.com/rdmafs/rdmafs/fs"
	"github.com/rdmafs/rdmafs/fs/fileio"
	"github.com/rdmafs/rdmafs/internal/bytesize"
	"github.com/rdmafs/rdmafs/internal/metricshttp"
	"github.com/rdmafs/rdmafs/internal/private"
	"github.com/rdmafs/rdmafs/internal/sched"
	"github.com/rdmafs/rdmafs/meta/auth"
	"github.com/rdmafs/rdmafs/meta/client"
	"github.com/rdmafs/rdmafs/meta/metapb"
	"github.com/rdmafs/rdmafs/rdma"
	"github.com/rdmafs/rdmafs/rdma/transport"
)

// mountReadyFD is the descriptor a --background child reports readiness on.
const mountReadyFD = 3

// mountChildEnv is set in the environment of a --background child, which
// mounts in the foreground and reports readiness on mountReadyFD.
const mountChildEnv = "RDMAFS_MOUNT_CHILD"

// mountFlags are the mount command's flags as given; config parses and checks
// them.
type mountFlags struct {
	subdir                                                string // --subdir
	secretFile, tokenFile, transport, memory, metrics     string
	logLevel, logFile                                     string
	dirtyLimit, readaheadMem, kernelReadahead, dropBehind string
	readaheadStripes, procs                               int
	attrTimeout, entryTimeout, ioTimeout, writeTimeout    time.Duration
	background, debug, schedBatch, wsync                  bool
	cpuProfile                                            string
	tls                                                   auth.TLSFiles
}

// mountConfig is what a mount runs with: its arguments and its flags, parsed
// and checked.
type mountConfig struct {
	metaAddr, mountpoint string
	secretFile           string
	tokenFile            string      // instead of secretFile: a mount token
	tls                  *tls.Config // nil: plaintext to meta
	transport            string
	memBytes             int   // --mem: positive
	dirtyLimit           int   // --dirty-limit; 0: the engine's default
	readaheadMem         int   // --readahead-mem; 0: the engine's default
	readaheadStripes     int   // --readahead-stripes; -1: no readahead
	kernelReadahead      int   // --kernel-readahead; 0: fs.Mount's default
	dropBehind           int64 // --drop-behind; 0: never
	procs                int   // --procs; 0: mountProcs unless $GOMAXPROCS
	attrTimeout          time.Duration
	entryTimeout         time.Duration
	ioTimeout            time.Duration
	writeTimeout         time.Duration
	metrics              string // --metrics; "" or "off": off
	logLevel             slog.Level
	logFile              string // --log-file; empty: stderr
	cpuProfile           string // --cpuprofile; empty: off
	debug, schedBatch    bool
	wsync                bool // --wsync: no creates or unlinks answered before meta
	subdir               string
}

// newMountCommand is `rdmafs mount`; runMount does the work.
func newMountCommand() *cobra.Command {
	f := &mountFlags{}
	c := &cobra.Command{
		Use:   "mount [META] MOUNTPOINT",
		Short: "Mount an rdmafs file system (FUSE)",
		Long: `Mounts the file system whose metadata service is at META (host:port, or
several comma-separated meta servers sharing one etcd: calls fail over among them) on
MOUNTPOINT (META defaults to $RDMAFS_META). File data moves between this host's registered buffers and the
chunkservers with one-sided RDMA over the chosen transport. Runs in the
foreground until unmounted or sent SIGTERM/SIGINT, which flushes dirty data and
unmounts; --background returns once the file system is mounted.`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 2 {
				return runMount(cmd, f, args[0], args[1])
			}
			meta := os.Getenv(metaEnv)
			if meta == "" {
				return fmt.Errorf("mount: no meta server: give its address (META MOUNTPOINT) or set $%s", metaEnv)
			}
			return runMount(cmd, f, meta, args[0])
		},
	}
	fl := c.Flags()
	fl.StringVar(&f.secretFile, "secret-file", os.Getenv(secretEnv), "file holding the cluster secret (default $"+secretEnv+")")
	fl.StringVar(&f.tokenFile, "token-file", "", "mount with this mount token instead of the cluster secret (made by rdmafs admin token create): restricted to the token's subdirectory, read-only or root-squashed as it says")
	f.tls.Register(fl, false)
	fl.StringVar(&f.transport, "transport", "auto", "rdma transport to the chunkservers: auto, tcp, shm or verbs")
	fl.StringVar(&f.memory, "mem", "256MiB", "registered buffer memory for file data (bounds dirty data)")
	fl.StringVar(&f.dirtyLimit, "dirty-limit", "", "dirty data one file may buffer before it is flushed (default a quarter of --mem)")
	fl.IntVar(&f.readaheadStripes, "readahead-stripes", 8, "largest readahead window of a sequential reader, in stripes (0: no readahead)")
	fl.StringVar(&f.readaheadMem, "readahead-mem", "", "memory for stripes read ahead, all files together (default a quarter of --mem)")
	fl.StringVar(&f.kernelReadahead, "kernel-readahead", "1MiB", "the kernel's readahead window per file (FUSE max_readahead)")
	fl.StringVar(&f.dropBehind, "drop-behind", "16MiB", "bytes a file handle writes in sequence before the kernel drops what it writes from its page cache (0: never)")
	fl.DurationVar(&f.ioTimeout, "io-timeout", 10*time.Second, "longest a chunkserver may leave requests unanswered before it is routed around (below it the timeout follows observed latency, from the larger of 2s and a fifth of this; raise it for chunkservers on slow disks)")
	fl.DurationVar(&f.writeTimeout, "write-timeout", 60*time.Second, "how long a write waits while fewer chunkservers than the layout's min-write-shards are reachable, before it fails with EIO")
	fl.DurationVar(&f.attrTimeout, "attr-timeout", time.Second, "how long the kernel caches attributes")
	fl.DurationVar(&f.entryTimeout, "entry-timeout", time.Second, "how long the kernel caches names (in a directory whose lease the mount holds, a file's name as long as the lease may be used, up to 2 s)")
	fl.StringVar(&f.metrics, "metrics", "127.0.0.1:0", "serve Prometheus metrics (/metrics) and Go profiles (/debug/pprof/) on this address; the default, a free port of 127.0.0.1, is found by `rdmafs stats MOUNTPOINT` (\"off\": no metrics)")
	fl.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	fl.StringVar(&f.logFile, "log-file", "", "log to this file, created 0600 (default stderr; --background: mount-MOUNTPOINT.log in /var/log/rdmafs, or ~/.local/state/rdmafs when not root)")
	fl.BoolVar(&f.background, "background", false, "return once mounted, serving in a background process")
	fl.StringVar(&f.subdir, "subdir", "", "mount this directory of the file system (a path from its root; with a mount token, from the token's directory) instead of its root")
	fl.BoolVar(&f.wsync, "wsync", false, "answer every create and unlink only once meta has applied it (by default a create of a name meta reserved for this mount, and an unlink, are answered at once and sent behind, in order; fsync and fsyncdir wait for them), as CephFS's wsync")
	fl.BoolVar(&f.schedBatch, "sched-batch", true, "run under SCHED_BATCH (no wake-up preemption: fewer context switches per request)")
	fl.IntVar(&f.procs, "procs", 0, "Go scheduler processors for the mount (GOMAXPROCS; default $GOMAXPROCS, else the larger of 16 and the CPU count): FUSE reader threads hold one each while blocked reading /dev/fuse")
	fl.BoolVar(&f.debug, "debug", false, "log every FUSE request")
	fl.StringVar(&f.cpuProfile, "cpuprofile", "", "write a CPU profile of the mount's lifetime to this file")
	fl.MarkHidden("cpuprofile")
	return c
}

// mountProcs is the default number of Go scheduler processors (GOMAXPROCS)
// of a mount on a machine with cpus CPUs: 16, or cpus when that is more.
//
// go-fuse runs as many request readers as processors (at least 2, at most
// 16), each holding its processor while blocked in read(2) on /dev/fuse: with
// spare processors the runtime need not take them back and a woken reader need
// not wait for one, and 16 readers serve a queue of 16 requests (figures in
// docs/performance.md).
func mountProcs(cpus int) int {
	return max(16, cpus)
}

// useMountProcs gives this process a mount's default number of scheduler
// processors, unless $GOMAXPROCS sets it.
func useMountProcs() {
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(mountProcs(runtime.NumCPU()))
	}
}

// runMount mounts the file system whose metadata service is at metaAddr on
// mountpoint and serves it until it is unmounted or the command's context ends
// (SIGINT or SIGTERM); with --background it starts a child that does so and
// returns once the child has mounted. Everything set up is taken
// down in reverse order on return: the queued releases reach the metadata
// service before its session closes.
func runMount(cmd *cobra.Command, f *mountFlags, metaAddr, mountpoint string) error {
	if f.background && os.Getenv(mountChildEnv) == "" {
		return mountInBackground(cmd, f)
	}
	cfg, err := f.config(metaAddr, mountpoint)
	if err != nil {
		return err
	}
	if cfg.cpuProfile != "" {
		stop, err := startCPUProfile(cfg.cpuProfile)
		if err != nil {
			return err
		}
		defer stop()
	}
	logger, err := cfg.newLogger()
	if err != nil {
		return err
	}
	cfg.setScheduling(logger)
	ctx := cmd.Context()
	meta, err := openMountMeta(ctx, cfg)
	if err != nil {
		return err
	}
	defer meta.close()
	dev, eng, err := cfg.newEngine(meta, logger)
	if err != nil {
		return err
	}
	defer dev.Close()
	defer eng.Close()
	// The metrics server starts before the mount, so that a taken address
	// fails the mount before the kernel sees it.
	reg := mountMetrics(eng, dev.Name())
	var metricsAddr string
	if cfg.metrics != "" && cfg.metrics != "off" {
		ms, err := metricshttp.Start(cfg.metrics, reg)
		if err != nil {
			return fmt.Errorf("mount: --metrics: %w", err)
		}
		defer ms.Stop(5*time.Second, logger)
		metricsAddr = ms.Addr()
		logger.Info("metrics", "addr", metricsAddr)
	}
	fsys, srv, err := cfg.mountFS(meta, eng, reg, metricsAddr, logger)
	if err != nil {
		return err
	}
	defer finishReleases(fsys)
	defer fsys.Close()
	logger.Info("mounted", "meta", cfg.metaAddr, "mountpoint", cfg.mountpoint, "transport", dev.Name())
	notifyMounted()
	sdnotify.Ready(logger)
	sdnotify.Watchdog(ctx, logger, func(context.Context) error { return nil })
	context.AfterFunc(ctx, func() { sdnotify.Stopping(logger) })
	serveMount(ctx, srv, eng, cfg.mountpoint, logger)
	return nil
}

// config parses and checks the flags of a mount of the file system at
// metaAddr on mountpoint. Its errors name the flag at fault.
func (f *mountFlags) config(metaAddr, mountpoint string) (*mountConfig, error) {
	if f.tokenFile != "" {
		f.secretFile = "" // a token replaces the secret, also one from $RDMAFS_SECRET_FILE
	} else if f.secretFile == "" {
		return nil, errors.New("mount: --secret-file (or $RDMAFS_SECRET_FILE) or --token-file is required: the metadata service refuses requests without the cluster secret or a mount token")
	}
	c := &mountConfig{
		metaAddr: metaAddr, mountpoint: mountpoint,
		secretFile: f.secretFile, tokenFile: f.tokenFile, transport: f.transport,
		readaheadStripes: f.readaheadStripes, procs: f.procs,
		attrTimeout: f.attrTimeout, entryTimeout: f.entryTimeout, ioTimeout: f.ioTimeout, writeTimeout: f.writeTimeout,
		metrics: f.metrics, logFile: f.logFile, cpuProfile: f.cpuProfile,
		debug: f.debug, schedBatch: f.schedBatch, wsync: f.wsync, subdir: f.subdir,
	}
	var err error
	if c.tls, err = f.tls.ClientConfig(); err != nil {
		return nil, fmt.Errorf("mount: %w", err)
	}
	mem, err := bytesize.Parse(f.memory)
	if err == nil && mem <= 0 {
		err = fmt.Errorf("must be positive")
	}
	if err != nil {
		return nil, fmt.Errorf("mount: --mem: %w", err)
	}
	c.memBytes = int(mem)
	if c.dirtyLimit, err = optionalSize("dirty-limit", f.dirtyLimit); err != nil {
		return nil, err
	}
	if c.readaheadMem, err = optionalSize("readahead-mem", f.readaheadMem); err != nil {
		return nil, err
	}
	c.dropBehind, err = bytesize.Parse(f.dropBehind)
	if err == nil && c.dropBehind < 0 {
		err = fmt.Errorf("must not be negative")
	}
	if err != nil {
		return nil, fmt.Errorf("mount: --drop-behind: %w", err)
	}
	if c.kernelReadahead, err = optionalSize("kernel-readahead", f.kernelReadahead); err != nil {
		return nil, err
	}
	switch {
	case c.readaheadStripes < 0:
		return nil, fmt.Errorf("mount: --readahead-stripes %d: must be 0 or more", c.readaheadStripes)
	case c.readaheadStripes == 0:
		c.readaheadStripes = -1 // off, as fileio.Config has it
	}
	if c.procs < 0 {
		return nil, fmt.Errorf("mount: --procs %d: must be 0 (default) or more", c.procs)
	}
	if err := c.logLevel.UnmarshalText([]byte(f.logLevel)); err != nil {
		return nil, fmt.Errorf("mount: --log-level %q: %w", f.logLevel, err)
	}
	return c, nil
}

// optionalSize parses the size v of --flag: 0 when v is empty, else a
// positive number of bytes.
func optionalSize(flag, v string) (int, error) {
	if v == "" {
		return 0, nil
	}
	n, err := bytesize.Parse(v)
	if err == nil && n <= 0 {
		err = fmt.Errorf("must be positive")
	}
	if err != nil {
		return 0, fmt.Errorf("mount: --%s: %w", flag, err)
	}
	return int(n), nil
}

// startCPUProfile starts profiling the process's CPU into a new file at path
// and returns the function that stops the profile and closes the file.
func startCPUProfile(path string) (stop func(), err error) {
	pf, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("mount: --cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(pf); err != nil {
		pf.Close()
		return nil, fmt.Errorf("mount: --cpuprofile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		pf.Close()
	}, nil
}

// newLogger returns the mount's logger: text at c.logLevel and above, to
// c.logFile (appended to, created if need be) or else to stderr.
func (c *mountConfig) newLogger() (*slog.Logger, error) {
	out := os.Stderr
	if c.logFile != "" {
		lf, err := private.OpenLog(c.logFile)
		if err != nil {
			return nil, fmt.Errorf("mount: --log-file: %w", err)
		}
		out = lf
	}
	return slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: c.logLevel})), nil
}

// setScheduling puts the process under SCHED_BATCH if c asks for it (a
// failure is logged and the mount goes on) and sets its number of Go
// scheduler processors. It must run before the file system is mounted:
// go-fuse sizes its pool of request readers by GOMAXPROCS then.
func (c *mountConfig) setScheduling(logger *slog.Logger) {
	if c.schedBatch {
		if err := sched.Batch(); err != nil {
			logger.Warn("mount: staying under the default scheduling policy", "err", err)
		}
	}
	if c.procs > 0 {
		runtime.GOMAXPROCS(c.procs)
	} else {
		useMountProcs()
	}
}

// mountMeta is a mount's link to the metadata service: the client, the
// session its opens are recorded in, and what the chunkservers check: the
// cluster secret, or a mount token's data key and the token.
type mountMeta struct {
	client  *client.Client
	session *client.Session
	dataKey []byte
	token   *proto.Token      // nil: dataKey is the cluster secret
	caps    *chunkclient.Caps // the token's chunk capabilities, from meta's replies
	root    uint64            // the inode mounted as the root: the session's, or --subdir below it
}

// openMountMeta reads the cluster secret or the mount token, dials the
// metadata service at c.metaAddr and opens a session named after this host
// and process.
func openMountMeta(ctx context.Context, c *mountConfig) (*mountMeta, error) {
	m := &mountMeta{}
	var mc *client.Client
	if c.tokenFile != "" {
		mt, err := auth.ReadTokenFile(c.tokenFile)
		if err != nil {
			return nil, fmt.Errorf("mount: %w", err)
		}
		m.dataKey, m.token = mt.DataKey, &proto.Token{ID: mt.Claims.ID, ReadOnly: mt.Claims.ReadOnly}
		m.caps = chunkclient.NewCaps()
		if mc, err = client.DialToken(c.metaAddr, mt.Grant, m.caps, client.WithTLS(c.tls)); err != nil {
			return nil, fmt.Errorf("mount: %w", err)
		}
	} else {
		secret, err := auth.ReadSecretFile(c.secretFile)
		if err != nil {
			return nil, fmt.Errorf("mount: %w", err)
		}
		m.dataKey = []byte(secret)
		if mc, err = client.Dial(c.metaAddr, secret, client.WithTLS(c.tls)); err != nil {
			return nil, fmt.Errorf("mount: %w", err)
		}
	}
	host, _ := os.Hostname()
	sess, err := mc.StartSession(ctx, fmt.Sprintf("%s pid %d", host, os.Getpid()), 0)
	if err != nil {
		mc.Close()
		return nil, fmt.Errorf("mount: metadata service at %s: %w", c.metaAddr, err)
	}
	m.client, m.session = mc, sess
	m.root = sess.RootIno()
	if c.subdir != "" {
		if m.root == 0 {
			m.root = fs.RootIno
		}
		if m.root, err = lookupDir(ctx, mc, m.root, c.subdir); err != nil {
			m.close()
			return nil, fmt.Errorf("mount: --subdir %s: %w", c.subdir, err)
		}
	}
	return m, nil
}

// lookupDir resolves path, component by component, from the directory
// root and returns its inode, which must be a directory.
func lookupDir(ctx context.Context, mc metapb.MetaClient, root uint64, path string) (uint64, error) {
	ino := root
	for _, name := range strings.Split(path, "/") {
		if name == "" || name == "." {
			continue
		}
		if name == ".." {
			return 0, errors.New("'..' is not allowed")
		}
		r, err := mc.Lookup(ctx, &metapb.LookupRequest{Caller: &metapb.Caller{}, Parent: ino, Name: name})
		if err != nil {
			return 0, fmt.Errorf("%s: %w", name, err)
		}
		ino = r.Attr.Ino
		if r.Attr.Mode&syscall.S_IFMT != syscall.S_IFDIR {
			return 0, fmt.Errorf("%s: %w", name, syscall.ENOTDIR)
		}
	}
	return ino, nil
}

// close closes the session, which releases its open files on the metadata
// service, and then the client.
func (m *mountMeta) close() {
	m.session.Close(context.Background())
	m.client.Close()
}

// newEngine opens the rdma transport to the chunkservers and builds the data
// engine over it and m. The caller closes the engine, then the device.
func (c *mountConfig) newEngine(m *mountMeta, logger *slog.Logger) (rdma.Device, *fileio.Engine, error) {
	dev, err := transport.Open(c.transport, logger)
	if err != nil {
		return nil, nil, fmt.Errorf("mount: %w", err)
	}
	eng, err := fileio.New(fileio.Config{Meta: m.client, Device: dev, Secret: m.dataKey, Token: m.token, Caps: m.caps, MemBytes: c.memBytes,
		FileDirtyLimit: c.dirtyLimit, ReadaheadStripes: c.readaheadStripes, ReadaheadBytes: c.readaheadMem, Logger: logger,
		IOTimeout: c.ioTimeout, WriteTimeout: c.writeTimeout})
	if err != nil {
		dev.Close()
		return nil, nil, fmt.Errorf("mount: %w", err)
	}
	return dev, eng, nil
}

// mountFS builds the file system over m's session and eng and mounts it on
// c.mountpoint, its request metrics registered with reg and metricsAddr
// the address it serves them on ("": none); the returned server is serving
// the kernel's requests.
func (c *mountConfig) mountFS(m *mountMeta, eng *fileio.Engine, reg prometheus.Registerer, metricsAddr string, logger *slog.Logger) (*fs.FS, *fuse.Server, error) {
	opts := fs.Options{Meta: m.client, Session: m.session.ID(), Root: m.root, Data: eng,
		AttrTimeout: c.attrTimeout, EntryTimeout: c.entryTimeout, Logger: logger, DropBehind: c.dropBehind, MetricsAddr: metricsAddr}
	if !c.wsync && m.token == nil {
		// A mount token's mount sends every change itself: meta gives
		// its session no inode numbers nor names.
		opts.Early = m.session
	}
	fsys, root := fs.New(opts)
	st := fsys.Stats()
	reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "rdmafs", Subsystem: "client", Name: "kept_answers_total",
			Help: "Lookups and getattrs answered from what the mount keeps (directory leases, attributes of files it owns), without a call to meta."},
			func() float64 { return float64(st.KeptAnswers.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "rdmafs", Subsystem: "client", Name: "meta_answers_total",
			Help: "Lookups and getattrs that asked the metadata service."},
			func() float64 { return float64(st.MetaAnswers.Load()) }))
	mopts := fs.MountOptions{Debug: c.debug, MaxReadAhead: c.kernelReadahead}
	if metricsAddr != "" {
		mopts.Metrics = reg // with metrics off, requests are not timed
	}
	srv, err := fs.Mount(c.mountpoint, root, mopts)
	if err != nil {
		return nil, nil, err
	}
	return fsys, srv, nil
}

// finishReleases waits up to 10 s for the releases of open files that fsys
// has queued: they must reach the metadata service before the session
// closes.
func finishReleases(fsys *fs.FS) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	fsys.WaitReleases(ctx)
}

// notifyMounted tells the parent of a --background child that the file system
// is mounted, by a byte on mountReadyFD; in a foreground mount it does
// nothing.
func notifyMounted() {
	if os.Getenv(mountChildEnv) == "" {
		return
	}
	ready := os.NewFile(mountReadyFD, "ready")
	ready.Write([]byte{1})
	ready.Close()
}

// serveMount returns once srv has stopped serving mountpoint. When ctx ends
// first (SIGINT or SIGTERM) it flushes eng's dirty data, waiting up to a
// minute, and unmounts, retrying for 5 s while the file system is busy and
// then detaching it (MNT_DETACH).
func serveMount(ctx context.Context, srv *fuse.Server, eng *fileio.Engine, mountpoint string, logger *slog.Logger) {
	served := make(chan struct{})
	go func() { srv.Wait(); close(served) }()
	select {
	case <-served:
		logger.Info("unmounted", "mountpoint", mountpoint)
		return
	case <-ctx.Done():
	}
	logger.Info("signal: flushing and unmounting", "mountpoint", mountpoint)
	fctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	if err := eng.FlushAll(fctx); err != nil {
		logger.Error("flush before unmount", "err", err)
	}
	cancel()
	for i := 0; ; i++ {
		err := srv.Unmount()
		if err == nil {
			break
		}
		if i == 50 {
			logger.Error("unmount failed; detaching", "err", err)
			syscall.Unmount(mountpoint, syscall.MNT_DETACH)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	<-served
}

// mountMetrics is the registry a mount serves on --metrics: the Go runtime,
// the process, the data engine's counters and its connections' work
// requests over transport; fs.Mount adds the FUSE requests'.
func mountMetrics(eng *fileio.Engine, transport string) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	counter := func(name, help string, v *atomic.Int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "rdmafs", Subsystem: "client", Name: name, Help: help},
			func() float64 { return float64(v.Load()) })
	}
	st := eng.Stats()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		counter("degraded_stripe_reads_total", "Stripes read with shards missing, rebuilt from survivors.", &st.DegradedReads),
		counter("readahead_stripes_total", "Stripes prefetched for sequential readers.", &st.ReadaheadStripes),
		counter("readahead_hits_total", "Reads served from prefetched stripes.", &st.ReadaheadHits),
		counter("merge_reads_total", "Partly overwritten stripes whose committed data was read in to merge with the new bytes.", &st.MergeReads),
		counter("delta_writes_total", "Stripes written as a parity delta (only the changed ranges and the parity's).", &st.DeltaWrites),
		counter("delta_old_kept_total", "Ranges of parity deltas whose old bytes the mount kept from the stripe's previous delta instead of reading them.", &st.DeltaOldKept),
		counter("next_grants_used_total", "Stripes written with the grant the commit of their previous delta made, without asking meta for one.", &st.NextGrantsUsed),
		counter("degraded_writes_total", "Stripes committed with shards missing, left to repair.", &st.DegradedWrites),
		counter("inline_commits_total", "Small files' stripes committed into metadata instead of shards.", &st.InlineCommits),
		counter("inline_patched_total", "Inline commits that sent only the bytes that changed.", &st.InlinePatched),
		counter("inline_behind_total", "Inline commits of files closed under their directory's lease sent with the next batch of calls.", &st.InlineBehind),
		counter("sparse_stripes_total", "Dirty stripes begun sparse: small writes gathered without a whole-stripe buffer.", &st.SparseStripes),
		counter("write_retries_total", "Shard writes tried again: after a chunkserver answered busy, or on another chunkserver after one failed.", &st.WriteRetries),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "rdmafs", Subsystem: "client", Name: "dirty_bytes",
			Help: "Buffer memory held by written data not yet committed (dirty and flushing stripes)."},
			func() float64 { return float64(eng.DirtyBytes()) }),
		eng.Wire().Collector(transport))
	return reg
}

// mountInBackground starts this command again as a detached child and returns
// once the child reports the file system mounted, or with the child's log.
func mountInBackground(cmd *cobra.Command, f *mountFlags) error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("mount --background: %w", err)
	}
	logFile := f.logFile
	args := os.Args[1:]
	if logFile == "" {
		mp := cmd.Flags().Arg(cmd.Flags().NArg() - 1)
		dir, err := logDir()
		if err != nil {
			return fmt.Errorf("mount --background: %w", err)
		}
		logFile = filepath.Join(dir, "mount-"+strings.Trim(strings.ReplaceAll(mp, "/", "-"), "-")+".log")
		args = append(args, "--log-file", logFile)
	}
	r, w, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("mount --background: %w", err)
	}
	// The child's stderr goes to its log file too, so that what the Go
	// runtime prints there (a panic, a SIGQUIT goroutine dump) is kept.
	logOut, err := private.OpenLog(logFile)
	if err != nil {
		return fmt.Errorf("mount --background: log file: %w", err)
	}
	defer logOut.Close()
	child := exec.Command(exe, args...)
	child.Stdout, child.Stderr = logOut, logOut
	child.Env = append(os.Environ(), mountChildEnv+"=1")
	child.ExtraFiles = []*os.File{w} // descriptor 3
	child.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := child.Start(); err != nil {
		return fmt.Errorf("mount --background: %w", err)
	}
	w.Close()
	done := make(chan error, 1)
	go func() {
		var b [1]byte
		_, err := r.Read(b[:])
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			fmt.Fprintf(cmd.OutOrStdout(), "mounted (pid %d, log %s)\n", child.Process.Pid, logFile)
			child.Process.Release()
			return nil
		}
		child.Wait()
		log, _ := os.ReadFile(logFile)
		return fmt.Errorf("mount --background: the mount process exited before mounting; its log:\n%s", log)
	case <-time.After(30 * time.Second):
		child.Process.Kill()
		return errors.New("mount --background: not mounted after 30s")
	}
}

// newUmountCommand is `rdmafs umount`: unmount(2), after which the mount
// process flushes and exits.
func newUmountCommand() *cobra.Command {
	var lazy bool
	c := &cobra.Command{
		Use:   "umount MOUNTPOINT",
		Short: "Unmount an rdmafs file system (the mount process flushes and exits)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			flags := 0
			if lazy {
				flags = syscall.MNT_DETACH
			}
			err := syscall.Unmount(args[0], flags)
			if errors.Is(err, syscall.EPERM) && os.Geteuid() != 0 {
				// A user's own FUSE mount: fusermount3 (set-user-ID)
				// unmounts it for the user who mounted it.
				args := []string{"-u", args[0]}
				if lazy {
					args = []string{"-u", "-z", args[len(args)-1]}
				}
				out, ferr := exec.Command("fusermount3", args...).CombinedOutput()
				if ferr == nil {
					return nil
				}
				err = fmt.Errorf("%w (fusermount3: %v: %s)", err, ferr, strings.TrimSpace(string(out)))
			}
			if err != nil {
				if errors.Is(err, syscall.EBUSY) {
					return fmt.Errorf("umount %s: busy: files are open or a process has its directory there (--lazy detaches now and unmounts when they close)", args[0])
				}
				return fmt.Errorf("umount %s: %w", args[0], err)
			}
			return nil
		},
	}
	c.Flags().BoolVarP(&lazy, "lazy", "l", false, "detach now, finish when no longer busy")
	return c
}

// logDir returns (creating it, private) the directory of background mounts'
// logs: /var/log/rdmafs for root, else the user's state directory
// ($XDG_STATE_HOME/rdmafs or ~/.local/state/rdmafs). Never a shared
// directory such as /tmp, where another user could plant a link.
func logDir() (string, error) {
	dir := "/var/log/rdmafs"
	if os.Geteuid() != 0 {
		state := os.Getenv("XDG_STATE_HOME")
		if state == "" {
			home, err := os.UserHomeDir()
			if err != nil {
				return "", fmt.Errorf("log directory: %w", err)
			}
			state = filepath.Join(home, ".local", "state")
		}
		dir = filepath.Join(state, "rdmafs")
	}
	if err := private.MkdirAll(dir, nil); err != nil {
		return "", fmt.Errorf("log directory: %w", err)
	}
	return dir, nil
}
