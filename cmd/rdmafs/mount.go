package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"

	"github.com/rdmafs/rdmafs/fs"
	"github.com/rdmafs/rdmafs/fs/fileio"
	"github.com/rdmafs/rdmafs/internal/bytesize"
	"github.com/rdmafs/rdmafs/internal/metricshttp"
	"github.com/rdmafs/rdmafs/internal/sched"
	"github.com/rdmafs/rdmafs/meta/auth"
	"github.com/rdmafs/rdmafs/meta/client"
	"github.com/rdmafs/rdmafs/rdma/transport"
)

// mountReadyFD is the descriptor a --background child reports readiness on.
const mountReadyFD = 3

const mountChildEnv = "RDMAFS_MOUNT_CHILD"

type mountFlags struct {
	secretFile, transport, memory, metrics, logLevel, logFile string
	dirtyLimit, readaheadMem, kernelReadahead, dropBehind     string
	readaheadStripes, procs                                   int
	attrTimeout, entryTimeout, ioTimeout, writeTimeout        time.Duration
	background, debug, schedBatch                             bool
	cpuProfile                                                string
}

func newMountCommand() *cobra.Command {
	f := &mountFlags{}
	c := &cobra.Command{
		Use:   "mount META MOUNTPOINT",
		Short: "Mount an rdmafs file system (FUSE)",
		Long: `Mounts the file system whose metadata service is at META (host:port, or
several comma-separated meta servers sharing one etcd: calls fail over among them) on
MOUNTPOINT. File data moves between this host's registered buffers and the
chunkservers with one-sided RDMA over the chosen transport. Runs in the
foreground until unmounted or sent SIGTERM/SIGINT, which flushes dirty data and
unmounts; --background returns once the file system is mounted.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error { return runMount(cmd, f, args[0], args[1]) },
	}
	fl := c.Flags()
	fl.StringVar(&f.secretFile, "secret-file", os.Getenv("RDMAFS_SECRET_FILE"), "file holding the cluster secret (default $RDMAFS_SECRET_FILE)")
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
	fl.DurationVar(&f.entryTimeout, "entry-timeout", time.Second, "how long the kernel caches names")
	fl.StringVar(&f.metrics, "metrics", "", "serve Prometheus metrics (/metrics) and Go profiles (/debug/pprof/) on this address (empty: off)")
	fl.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	fl.StringVar(&f.logFile, "log-file", "", "log to this file (default stderr; --background: MOUNTPOINT's name in /tmp)")
	fl.BoolVar(&f.background, "background", false, "return once mounted, serving in a background process")
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

func runMount(cmd *cobra.Command, f *mountFlags, metaAddr, mountpoint string) error {
	if f.background && os.Getenv(mountChildEnv) == "" {
		return mountInBackground(cmd, f)
	}
	if f.secretFile == "" {
		return errors.New("mount: --secret-file (or $RDMAFS_SECRET_FILE) is required: the metadata service refuses requests without the cluster secret")
	}
	if f.cpuProfile != "" {
		pf, err := os.Create(f.cpuProfile)
		if err != nil {
			return fmt.Errorf("mount: --cpuprofile: %w", err)
		}
		pprof.StartCPUProfile(pf)
		defer pprof.StopCPUProfile()
	}
	memBytes, err := bytesize.Parse(f.memory)
	if err == nil && memBytes <= 0 {
		err = fmt.Errorf("must be positive")
	}
	if err != nil {
		return fmt.Errorf("mount: --mem: %w", err)
	}
	optionalSize := func(flag, v string) (int, error) {
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
	dirtyLimit, err := optionalSize("dirty-limit", f.dirtyLimit)
	if err != nil {
		return err
	}
	readaheadMem, err := optionalSize("readahead-mem", f.readaheadMem)
	if err != nil {
		return err
	}
	dropBehind, err := bytesize.Parse(f.dropBehind)
	if err == nil && dropBehind < 0 {
		err = fmt.Errorf("must not be negative")
	}
	if err != nil {
		return fmt.Errorf("mount: --drop-behind: %w", err)
	}
	kernelReadahead, err := optionalSize("kernel-readahead", f.kernelReadahead)
	if err != nil {
		return err
	}
	readaheadStripes := f.readaheadStripes
	switch {
	case readaheadStripes < 0:
		return fmt.Errorf("mount: --readahead-stripes %d: must be 0 or more", readaheadStripes)
	case readaheadStripes == 0:
		readaheadStripes = -1 // off
	}
	logger, err := mountLogger(f)
	if err != nil {
		return err
	}
	if f.schedBatch {
		if err := sched.Batch(); err != nil {
			logger.Warn("mount: staying under the default scheduling policy", "err", err)
		}
	}
	switch {
	case f.procs < 0:
		return fmt.Errorf("mount: --procs %d: must be 0 (default) or more", f.procs)
	case f.procs > 0:
		runtime.GOMAXPROCS(f.procs)
	default:
		useMountProcs()
	}
	secret, err := auth.ReadSecretFile(f.secretFile)
	if err != nil {
		return fmt.Errorf("mount: %w", err)
	}
	ctx := cmd.Context()
	mc, err := client.Dial(metaAddr, secret)
	if err != nil {
		return fmt.Errorf("mount: %w", err)
	}
	defer mc.Close()
	host, _ := os.Hostname()
	sess, err := mc.StartSession(ctx, fmt.Sprintf("%s pid %d", host, os.Getpid()), 0)
	if err != nil {
		return fmt.Errorf("mount: metadata service at %s: %w", metaAddr, err)
	}
	defer sess.Close(context.Background())
	dev, err := transport.Open(f.transport, logger)
	if err != nil {
		return fmt.Errorf("mount: %w", err)
	}
	defer dev.Close()
	eng, err := fileio.New(fileio.Config{Meta: mc, Device: dev, Secret: []byte(secret), MemBytes: int(memBytes),
		FileDirtyLimit: dirtyLimit, ReadaheadStripes: readaheadStripes, ReadaheadBytes: readaheadMem, Logger: logger,
		IOTimeout: f.ioTimeout, WriteTimeout: f.writeTimeout})
	if err != nil {
		return fmt.Errorf("mount: %w", err)
	}
	defer eng.Close()
	if f.metrics != "" {
		// Listening before mounting: a taken address fails the mount
		// before the kernel sees it.
		ms, err := metricshttp.Start(f.metrics, mountMetrics(eng))
		if err != nil {
			return fmt.Errorf("mount: --metrics: %w", err)
		}
		defer ms.Stop(5*time.Second, logger)
		logger.Info("metrics", "addr", ms.Addr())
	}
	fsys, root := fs.New(fs.Options{Meta: mc, Session: sess.ID(), Data: eng, AttrTimeout: f.attrTimeout, EntryTimeout: f.entryTimeout, Logger: logger,
		DropBehind: int64(dropBehind)})
	defer func() {
		// The queued releases go before the session closes.
		rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		fsys.WaitReleases(rctx)
	}()
	srv, err := fs.Mount(mountpoint, root, fs.MountOptions{Debug: f.debug, MaxReadAhead: kernelReadahead})
	if err != nil {
		return err
	}
	logger.Info("mounted", "meta", metaAddr, "mountpoint", mountpoint, "transport", dev.Name())
	if os.Getenv(mountChildEnv) != "" {
		ready := os.NewFile(mountReadyFD, "ready")
		ready.Write([]byte{1})
		ready.Close()
	}
	served := make(chan struct{})
	go func() { srv.Wait(); close(served) }()
	select {
	case <-served:
		logger.Info("unmounted", "mountpoint", mountpoint)
	case <-ctx.Done():
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
	return nil
}

// mountMetrics is the registry a mount serves on --metrics: the Go runtime,
// the process and the data engine's counters.
func mountMetrics(eng *fileio.Engine) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "rdmafs_client_degraded_stripe_reads_total", Help: "Stripes read with shards missing, rebuilt from survivors."},
			func() float64 { return float64(eng.Stats().DegradedReads.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "rdmafs_client_readahead_stripes_total", Help: "Stripes prefetched for sequential readers."},
			func() float64 { return float64(eng.Stats().ReadaheadStripes.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "rdmafs_client_readahead_hits_total", Help: "Reads served from prefetched stripes."},
			func() float64 { return float64(eng.Stats().ReadaheadHits.Load()) }))
	return reg
}

func mountLogger(f *mountFlags) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(f.logLevel)); err != nil {
		return nil, fmt.Errorf("mount: --log-level %q: %w", f.logLevel, err)
	}
	out := os.Stderr
	if f.logFile != "" {
		lf, err := os.OpenFile(f.logFile, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			return nil, fmt.Errorf("mount: --log-file: %w", err)
		}
		out = lf
	}
	return slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: level})), nil
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
		mp := cmd.Flags().Arg(1)
		logFile = filepath.Join(os.TempDir(), "rdmafs-mount-"+strings.Trim(strings.ReplaceAll(mp, "/", "-"), "-")+".log")
		args = append(args, "--log-file", logFile)
	}
	r, w, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("mount --background: %w", err)
	}
	// The child's stderr goes to its log file too, so that what the Go
	// runtime prints there (a panic, a SIGQUIT goroutine dump) is kept.
	logOut, err := os.OpenFile(logFile, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
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
			if err := syscall.Unmount(args[0], flags); err != nil {
				if errors.Is(err, syscall.EBUSY) {
					return fmt.Errorf("umount %s: busy: files are open or a process has its directory there (--lazy detaches now and unmounts when they close)", args[0])
				}
				return fmt.Errorf("umount %s: %w", args[0], err)
			}
			return nil
		},
	}
	c.Flags().BoolVar(&lazy, "lazy", false, "detach now, finish when no longer busy")
	return c
}
