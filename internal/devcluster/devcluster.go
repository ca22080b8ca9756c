// Package devcluster runs a whole rdmafs on one host as real processes: a meta
// server, chunkd processes and a FUSE mount, all on 127.0.0.1 with their data
// under one directory. `rdmafs dev up/down` and the end-to-end tests use it.
// Every process it starts it stops by PID.
package devcluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"

	"github.com/rdmafs/rdmafs/internal/bytesize"
	"github.com/rdmafs/rdmafs/internal/private"
	"github.com/rdmafs/rdmafs/meta/auth"
	"github.com/rdmafs/rdmafs/meta/client"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// trashDays is format's --trash-days for the cluster.
func (cfg Config) trashDays() string {
	if cfg.TrashDays == "" {
		return "0"
	}
	return cfg.TrashDays
}

// Config describes a cluster to bring up.
type Config struct {
	Dir          string // everything lives here (created)
	Bin          string // directory holding the rdmafs and chunkd binaries
	Chunkservers int    // default 6; negative: none (metadata-only tests)
	EC           string // default "4+2"
	Unit         string // default "1MiB"
	// TrashDays is format's --trash-days; default "0": deletes free space
	// at once, as the tests of deletion expect (rdmafs dev up passes 1).
	TrashDays string
	Transport string // rdma transport for chunkd and the client (default "auto")
	ChunkdMem string // registered memory per chunkd (default "256MiB")
	ClientMem string // client buffer memory (default "256MiB")
	Mount     bool   // also mount at Dir/mnt
	// HeartbeatTimeout marks a chunkserver down (default 10s; short in tests).
	HeartbeatTimeout time.Duration
	// MetaArgs and ChunkdArgs are extra flags for rdmafs meta and every
	// chunkd (e.g. --repair-grace, --repair-bw).
	MetaArgs   []string
	ChunkdArgs []string
	// KV, when set, is an etcd://host:port/prefix URL: the file system is
	// formatted in etcd and Metas meta servers run on it (one elected,
	// the others standing by); chunkd and the mount get all addresses.
	KV string
	// Metas is the number of meta servers with KV (default 2).
	Metas int
	// ElectionTTL is the meta leader lease with KV (default 2s).
	ElectionTTL time.Duration
	// MountArgs are extra flags for rdmafs mount (e.g. --write-timeout).
	MountArgs []string
	// ChunkdDisk, when set (e.g. "64MiB"), gives each chunkd a data
	// directory on a tmpfs of this size of its own, mounted when the chunkd
	// first starts and unmounted by Down: small disks that fill.
	ChunkdDisk string
	// Net, when set, runs the processes in network namespaces (see
	// internal/netns); otherwise everything is on 127.0.0.1.
	Net *Net
	// PlainText turns TLS off on the control plane. It is on by default:
	// Up makes a CA and certificates in Dir/tls (once), meta requires
	// client certificates, and every process and Client use them.
	PlainText bool
}

// Net places a cluster's processes on hosts of a network (network
// namespaces): each host has an address its process listens on and a
// command prefix that runs a program there (e.g. nsenter --net=...).
type Net struct {
	Meta   Host
	Mount  Host
	Chunkd func(i int) Host
	// Dial connects this process to the meta server (it may live in
	// another network namespace); nil: an ordinary dial.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// Host is where a process of the cluster runs.
type Host struct {
	IP     string   // address to listen on
	Prefix []string // runs a program on the host; empty: here
}

// Proc is a process of the cluster.
type Proc struct {
	PID  int    `json:"pid"`
	Addr string `json:"addr,omitempty"`
	Data string `json:"data,omitempty"`
	Log  string `json:"log"`
	// Args is the command line it was started with (with any host prefix):
	// a restart runs it again.
	Args []string `json:"args,omitempty"`
}

// Cluster is a running cluster; its state is kept in Dir/cluster.json.
type Cluster struct {
	Dir        string `json:"dir"`
	Bin        string `json:"bin"`
	MetaAddr   string `json:"meta_addr"`
	SecretFile string `json:"secret_file"`
	// TLSDir holds the cluster's CA and certificates (auth.CertsIn); empty:
	// plaintext control plane.
	TLSDir    string `json:"tls_dir,omitempty"`
	Transport string `json:"transport"`
	Meta      Proc   `json:"meta"`
	// Metas are all meta servers (with an etcd store; Meta is Metas[0]).
	Metas      []Proc   `json:"metas,omitempty"`
	Chunk      []Proc   `json:"chunk"`
	Mount      *Proc    `json:"mount,omitempty"`
	MountPoint string   `json:"mount_point,omitempty"`
	ChunkdArgs []string `json:"chunkd_args,omitempty"`
	ChunkdMem  string   `json:"chunkd_mem,omitempty"`
	ClientMem  string   `json:"client_mem,omitempty"`
	MountArgs  []string `json:"mount_args,omitempty"`
	ChunkdDisk string   `json:"chunkd_disk,omitempty"`
	// Tmpfs are the file systems Up mounted (chunkd disks); Down unmounts them.
	Tmpfs []string `json:"tmpfs,omitempty"`
	// MountPrefix runs the mount on its host (network namespace).
	MountPrefix []string `json:"mount_prefix,omitempty"`

	// StopGrace is how long Down and Unmount wait after SIGTERM before
	// SIGKILL (default 60s for the mount, 10s for the others when zero).
	StopGrace time.Duration `json:"-"`
	net       *Net
	portsMu   sync.Mutex
	ports     map[int]bool // handed out by freePort
}

func (c *Config) defaults() {
	if c.Chunkservers == 0 {
		c.Chunkservers = 6
	}
	if c.Chunkservers < 0 {
		c.Chunkservers = 0 // metadata only
	}
	if c.EC == "" {
		c.EC = "4+2"
	}
	if c.Unit == "" {
		c.Unit = "1MiB"
	}
	if c.Transport == "" {
		c.Transport = "auto"
	}
	if c.ChunkdMem == "" {
		c.ChunkdMem = "256MiB"
	}
	if c.ClientMem == "" {
		c.ClientMem = "256MiB"
	}
	if c.HeartbeatTimeout == 0 {
		c.HeartbeatTimeout = 10 * time.Second
	}
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago and
// that this cluster has not handed out before: a process started on an
// earlier port may not have bound it yet, and the kernel may offer it again.
func (c *Cluster) freePort() (int, error) {
	c.portsMu.Lock()
	defer c.portsMu.Unlock()
	if c.ports == nil {
		c.ports = make(map[int]bool)
	}
	for {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if !c.ports[port] {
			c.ports[port] = true
			return port, nil
		}
	}
}

// Up formats a file system in cfg.Dir (unless formatted), starts the meta
// server and the chunkservers, waits until all are registered and up, and
// mounts it when cfg.Mount is set. On failure everything started is stopped.
func Up(ctx context.Context, cfg Config) (c *Cluster, err error) {
	cfg.defaults()
	if err := private.MkdirAll(cfg.Dir, nil); err != nil {
		return nil, fmt.Errorf("devcluster: %w", err)
	}
	dir, _ := filepath.Abs(cfg.Dir)
	c = &Cluster{Dir: dir, Bin: cfg.Bin, Transport: cfg.Transport, ChunkdArgs: cfg.ChunkdArgs, ChunkdMem: cfg.ChunkdMem,
		ClientMem: cfg.ClientMem, MountArgs: cfg.MountArgs, ChunkdDisk: cfg.ChunkdDisk, net: cfg.Net}
	if cfg.Net != nil {
		c.MountPrefix = cfg.Net.Mount.Prefix
	}
	defer func() {
		if err != nil {
			c.Down(context.Background())
		}
	}()
	if !cfg.PlainText {
		hosts := []string{"127.0.0.1", "localhost"}
		if cfg.Net != nil {
			hosts = append(hosts, cfg.Net.Meta.IP)
		}
		if err := c.setupTLS(hosts); err != nil {
			return c, err
		}
	}
	if cfg.KV != "" {
		return c, c.upEtcd(ctx, cfg)
	}
	metaData := filepath.Join(dir, "meta")
	c.SecretFile = filepath.Join(metaData, "secret")
	if _, err := os.Stat(c.SecretFile); errors.Is(err, os.ErrNotExist) {
		out, err := exec.CommandContext(ctx, c.bin("rdmafs"), "format", metaData, "--ec", cfg.EC, "--unit", cfg.Unit, "--trash-days", cfg.trashDays()).CombinedOutput()
		if err != nil {
			return c, fmt.Errorf("devcluster: rdmafs format: %v: %s", err, out)
		}
	}
	var prefix []string
	if cfg.Net != nil {
		c.MetaAddr = cfg.Net.Meta.IP + ":7300" // a namespace of its own: the port is free
		prefix = cfg.Net.Meta.Prefix
	} else {
		port, err := c.freePort()
		if err != nil {
			return c, fmt.Errorf("devcluster: %w", err)
		}
		c.MetaAddr = fmt.Sprintf("127.0.0.1:%d", port)
	}
	metaArgs := append(append(append(append([]string(nil), prefix...), c.bin("rdmafs"), "meta", "--data", metaData, "--listen", c.MetaAddr,
		"--heartbeat-timeout", cfg.HeartbeatTimeout.String()), c.serverTLSArgs()...), cfg.MetaArgs...)
	if c.Meta, err = c.start("meta", metaArgs...); err != nil {
		return c, err
	}
	c.Meta.Addr, c.Meta.Data = c.MetaAddr, metaData
	if err := c.save(); err != nil {
		return c, err
	}
	for i := 0; i < cfg.Chunkservers; i++ {
		p, err := c.StartChunkd(ctx, i, cfg.ChunkdMem)
		if p.PID != 0 {
			c.Chunk = append(c.Chunk, p) // Down stops it, started or not
		}
		if err != nil {
			return c, err
		}
		if err := c.save(); err != nil {
			return c, err
		}
	}
	if err := c.WaitUp(ctx, cfg.Chunkservers, 30*time.Second); err != nil {
		return c, err
	}
	if cfg.Mount {
		if err := c.MountFS(ctx, filepath.Join(dir, "mnt"), cfg.ClientMem); err != nil {
			return c, err
		}
	}
	return c, c.save()
}

func (c *Cluster) bin(name string) string { return filepath.Join(c.Bin, name) }

// start launches the command line args (program first) as a process whose
// output goes to Dir/NAME.log.
func (c *Cluster) start(name string, args ...string) (Proc, error) {
	logPath := filepath.Join(c.Dir, name+".log")
	lf, err := private.OpenLog(logPath)
	if err != nil {
		return Proc{}, fmt.Errorf("devcluster: %w", err)
	}
	defer lf.Close()
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return Proc{}, fmt.Errorf("devcluster: start %s: %w", name, err)
	}
	go cmd.Wait() // reap
	return Proc{PID: cmd.Process.Pid, Log: logPath, Args: args}, nil
}

// StartChunkd starts chunkserver number i (its data in Dir/chunkI, reused if
// it exists) and waits until it serves. A chunkserver that ran before
// restarts on the address it registered.
func (c *Cluster) StartChunkd(ctx context.Context, i int, mem string) (Proc, error) {
	data := filepath.Join(c.Dir, fmt.Sprintf("chunk%d", i))
	ready := filepath.Join(c.Dir, fmt.Sprintf("chunk%d.ready", i))
	addr := ""
	if i < len(c.Chunk) {
		addr = c.Chunk[i].Addr // restart on the address it registered
	}
	var prefix []string
	if c.net != nil && c.net.Chunkd != nil {
		h := c.net.Chunkd(i)
		prefix = h.Prefix
		if addr == "" {
			addr = h.IP + ":7500" // a namespace of its own: the port is free
		}
	}
	if addr == "" {
		port, err := c.freePort()
		if err != nil {
			return Proc{}, err
		}
		addr = fmt.Sprintf("127.0.0.1:%d", port)
	}
	if mem == "" {
		mem = "256MiB"
	}
	if c.ChunkdDisk != "" {
		if err := c.tmpfs(data, c.ChunkdDisk); err != nil {
			return Proc{}, err
		}
	}
	args := append(append(append(append([]string(nil), prefix...), c.bin("chunkd"), "--data", data, "--listen", addr, "--meta", c.MetaAddr,
		"--mem", mem, "--transport", c.Transport, "--ready-file", ready, "--heartbeat", "500ms"), c.ClientArgs()...), c.ChunkdArgs...)
	p, err := c.startChunkd(ctx, i, args)
	p.Addr, p.Data = addr, data
	return p, err
}

// startChunkd runs a chunkd command line and waits for its ready file.
func (c *Cluster) startChunkd(ctx context.Context, i int, args []string) (Proc, error) {
	ready := filepath.Join(c.Dir, fmt.Sprintf("chunk%d.ready", i))
	os.Remove(ready)
	p, err := c.start(fmt.Sprintf("chunk%d", i), args...)
	if err != nil {
		return p, err
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := os.Stat(ready); err == nil {
			return p, nil
		}
		if Exited(p.PID) || time.Now().After(deadline) {
			log, _ := os.ReadFile(p.Log)
			return p, fmt.Errorf("devcluster: chunkd %d did not start; its log:\n%s", i, tail(log))
		}
		select {
		case <-ctx.Done():
			return p, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// RestartChunkd starts chunkserver i again after it was killed: the same
// command line, so the same data directory, identity and address. It
// waits until the chunkd serves (not until meta has it up: see WaitUp).
func (c *Cluster) RestartChunkd(ctx context.Context, i int) error {
	old := c.Chunk[i]
	if old.PID != 0 && !Exited(old.PID) {
		return fmt.Errorf("devcluster: chunkd %d (pid %d) is still running", i, old.PID)
	}
	if len(old.Args) == 0 {
		p, err := c.StartChunkd(ctx, i, c.ChunkdMem)
		if p.PID != 0 {
			c.Chunk[i] = p
			c.save()
		}
		return err
	}
	p, err := c.startChunkd(ctx, i, old.Args)
	if p.PID != 0 {
		p.Addr, p.Data = old.Addr, old.Data
		c.Chunk[i] = p
		c.save()
	}
	return err
}

// tmpfs mounts a tmpfs of size at dir unless one of this cluster's is
// mounted there already.
func (c *Cluster) tmpfs(dir, size string) error {
	for _, m := range c.Tmpfs {
		if m == dir {
			return nil
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("devcluster: %w", err)
	}
	n, err := bytesize.Parse(size)
	if err != nil {
		return fmt.Errorf("devcluster: chunkd disk size %q: %w", size, err)
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, fmt.Sprintf("size=%d,mode=0700", n)); err != nil {
		return fmt.Errorf("devcluster: mount a %s tmpfs at %s: %w", size, dir, err)
	}
	c.Tmpfs = append(c.Tmpfs, dir)
	return c.save()
}

func tail(b []byte) []byte {
	if len(b) > 4000 {
		return b[len(b)-4000:]
	}
	return b
}

// Client connects to the meta server.
func (c *Cluster) Client() (*client.Client, error) {
	if c.net != nil && c.net.Dial != nil {
		dial := c.net.Dial
		return client.DialFiles(c.MetaAddr, c.SecretFile, c.ClientTLS(), grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return dial(ctx, "tcp", addr)
		}))
	}
	return client.DialFiles(c.MetaAddr, c.SecretFile, c.ClientTLS())
}

// setupTLS makes the cluster's CA and certificates in Dir/tls for the meta
// server's hosts, unless a previous Up made them.
func (c *Cluster) setupTLS(hosts []string) error {
	c.TLSDir = filepath.Join(c.Dir, "tls")
	if _, err := os.Stat(auth.CertsIn(c.TLSDir).CA); err == nil {
		return nil
	}
	if _, err := auth.GenerateCerts(c.TLSDir, hosts, time.Now(), 365*24*time.Hour); err != nil {
		return fmt.Errorf("devcluster: %w", err)
	}
	return nil
}

// ClientTLS returns the TLS files of a client of the cluster: its CA and
// the client certificate (zero when the cluster runs without TLS).
func (c *Cluster) ClientTLS() auth.TLSFiles {
	if c.TLSDir == "" {
		return auth.TLSFiles{}
	}
	return auth.CertsIn(c.TLSDir).Client()
}

// ClientArgs returns the flags with which a client of the cluster (mount,
// chunkd, status, admin commands) reaches meta: --secret-file and, with
// TLS, --tls-ca, --tls-cert and --tls-key.
func (c *Cluster) ClientArgs() []string {
	return append([]string{"--secret-file", c.SecretFile}, c.TLSArgs()...)
}

// TLSArgs returns a client's TLS flags (--tls-ca, --tls-cert, --tls-key;
// none without TLS): ClientArgs without the secret, for a mount given a
// mount token instead.
func (c *Cluster) TLSArgs() []string {
	f := c.ClientTLS()
	if !f.Enabled() {
		return nil
	}
	return []string{"--tls-ca", f.CA, "--tls-cert", f.Cert, "--tls-key", f.Key}
}

// serverTLSArgs returns the TLS flags of a meta server of the cluster
// (none without TLS): its certificate, and client certificates required.
func (c *Cluster) serverTLSArgs() []string {
	if c.TLSDir == "" {
		return nil
	}
	f := auth.CertsIn(c.TLSDir).Server()
	return []string{"--tls-cert", f.Cert, "--tls-key", f.Key, "--tls-ca", f.CA, "--tls-require-client-cert"}
}

// Command is a command running program (rdmafs or chunkd, from Bin) with
// args where the meta server runs: `rdmafs status` and `rdmafs admin`
// reach it there.
func (c *Cluster) Command(ctx context.Context, program string, args ...string) *exec.Cmd {
	var argv []string
	if c.net != nil {
		argv = append(argv, c.net.Meta.Prefix...)
	}
	argv = append(append(argv, c.bin(program)), args...)
	return exec.CommandContext(ctx, argv[0], argv[1:]...)
}

// WaitUp waits until n chunkservers are registered and up.
func (c *Cluster) WaitUp(ctx context.Context, n int, timeout time.Duration) error {
	mc, err := c.Client()
	if err != nil {
		return err
	}
	defer mc.Close()
	deadline := time.Now().Add(timeout)
	for {
		st, err := mc.Status(ctx, &metapb.StatusRequest{})
		up := st.ChunkserversUp() // 0 on an error
		if err == nil && up >= n {
			return nil
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(c.Meta.Log)
			return fmt.Errorf("devcluster: %d of %d chunkservers up after %v (%v); meta log:\n%s", up, n, timeout, err, tail(log))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// MountFS mounts the file system at dir: `rdmafs mount` in the foreground,
// its output (log, panics, SIGQUIT goroutine dumps) appended to
// Dir/mount.log, with the cluster's MountArgs. It returns once the kernel
// has the FUSE mount, or with the log's tail if the process exits first.
func (c *Cluster) MountFS(ctx context.Context, dir, mem string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("devcluster: %w", err)
	}
	if mem == "" {
		mem = c.ClientMem
	}
	if mem == "" {
		mem = "256MiB"
	}
	args := append(append(append(append([]string(nil), c.MountPrefix...), c.bin("rdmafs"), "mount", c.MetaAddr, dir,
		"--transport", c.Transport, "--mem", mem), c.ClientArgs()...), c.MountArgs...)
	p, err := c.start("mount", args...)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(30 * time.Second)
	for !IsFUSEMount(dir) {
		if Exited(p.PID) || time.Now().After(deadline) {
			stop(p.PID, syscall.SIGKILL, 5*time.Second)
			log, _ := os.ReadFile(p.Log)
			return fmt.Errorf("devcluster: mount at %s failed (%s); mount.log:\n%s", dir, strings.Join(args, " "), tail(log))
		}
		select {
		case <-ctx.Done():
			stop(p.PID, syscall.SIGKILL, 5*time.Second)
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	c.Mount, c.MountPoint = &p, dir
	return c.save()
}

// IsFUSEMount reports whether a FUSE file system is mounted at dir in this
// process's mount namespace.
func IsFUSEMount(dir string) bool {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER
		f := strings.Fields(line)
		if len(f) < 5 || unescapeMount(f[4]) != dir {
			continue
		}
		for j := 5; j+1 < len(f); j++ {
			if f[j] == "-" && strings.HasPrefix(f[j+1], "fuse") {
				return true
			}
		}
	}
	return false
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, "\\") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Unmount stops the mount process with SIGTERM (it flushes and unmounts) and
// waits for it; past the grace it is killed and the mount detached.
func (c *Cluster) Unmount() error {
	if c.Mount == nil {
		if c.MountPoint != "" && IsFUSEMount(c.MountPoint) {
			syscall.Unmount(c.MountPoint, syscall.MNT_DETACH) // left by a killed mount
		}
		return nil
	}
	grace := c.StopGrace
	if grace == 0 {
		grace = 60 * time.Second
	}
	err := stop(c.Mount.PID, syscall.SIGTERM, grace)
	if IsFUSEMount(c.MountPoint) {
		syscall.Unmount(c.MountPoint, syscall.MNT_DETACH)
	}
	c.Mount = nil
	c.save()
	return err
}

// KillMount kills the mount process with SIGKILL and detaches the dead
// mount (whose files then fail with ENOTCONN); Remount mounts again.
func (c *Cluster) KillMount() error {
	if c.Mount == nil {
		return errors.New("devcluster: not mounted")
	}
	err := stop(c.Mount.PID, syscall.SIGKILL, 10*time.Second)
	if IsFUSEMount(c.MountPoint) {
		if uerr := syscall.Unmount(c.MountPoint, syscall.MNT_DETACH); uerr != nil && err == nil {
			err = fmt.Errorf("devcluster: detach %s: %w", c.MountPoint, uerr)
		}
	}
	c.Mount = nil
	c.save()
	return err
}

// Remount mounts again at the mount point after Unmount or KillMount.
func (c *Cluster) Remount(ctx context.Context) error {
	if c.Mount != nil {
		return errors.New("devcluster: still mounted")
	}
	return c.MountFS(ctx, c.MountPoint, c.ClientMem)
}

// KillMeta kills meta server i with SIGKILL: of Metas with an etcd store,
// else (i = 0) the one meta server.
func (c *Cluster) KillMeta(i int) error {
	if len(c.Metas) == 0 {
		if i != 0 {
			return fmt.Errorf("devcluster: no meta server %d", i)
		}
		err := stop(c.Meta.PID, syscall.SIGKILL, 10*time.Second)
		c.Meta.PID = 0
		c.save()
		return err
	}
	err := stop(c.Metas[i].PID, syscall.SIGKILL, 10*time.Second)
	c.Metas[i].PID = 0
	if i == 0 {
		c.Meta.PID = 0
	}
	c.save()
	return err
}

// RestartMeta starts meta server i again (as KillMeta counts them) with
// the command line it ran with, and waits until it answers (with an etcd
// store: until it runs; it may stand by).
func (c *Cluster) RestartMeta(ctx context.Context, i int) error {
	p := &c.Meta
	name := "meta"
	if len(c.Metas) > 0 {
		p, name = &c.Metas[i], fmt.Sprintf("meta%d", i)
	} else if i != 0 {
		return fmt.Errorf("devcluster: no meta server %d", i)
	}
	if p.PID != 0 && !Exited(p.PID) {
		return fmt.Errorf("devcluster: %s (pid %d) is still running", name, p.PID)
	}
	if len(p.Args) == 0 {
		return fmt.Errorf("devcluster: %s: no command line recorded to restart it with", name)
	}
	np, err := c.start(name, p.Args...)
	if err != nil {
		return err
	}
	p.PID = np.PID
	if len(c.Metas) > 0 && i == 0 {
		c.Meta.PID = np.PID
	}
	c.save()
	if len(c.Metas) > 0 {
		return nil
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if err := c.ping(ctx); err == nil {
			return nil
		} else if Exited(np.PID) || time.Now().After(deadline) {
			log, _ := os.ReadFile(np.Log)
			return fmt.Errorf("devcluster: meta did not come back (%v); its log:\n%s", err, tail(log))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// ping asks the meta server for StatFS with a short deadline.
func (c *Cluster) ping(ctx context.Context) error {
	mc, err := c.Client()
	if err != nil {
		return err
	}
	defer mc.Close()
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, err = mc.StatFS(cctx, &metapb.StatFSRequest{})
	return err
}

// KillChunkd kills chunkserver i with SIGKILL.
func (c *Cluster) KillChunkd(i int) error {
	err := stop(c.Chunk[i].PID, syscall.SIGKILL, 10*time.Second)
	c.Chunk[i].PID = 0
	c.save()
	return err
}

// Down unmounts and stops every process, SIGTERM first, SIGKILL after a grace.
func (c *Cluster) Down(ctx context.Context) error {
	var first error
	keep := func(err error) {
		if err != nil && first == nil {
			first = err
		}
	}
	keep(c.Unmount())
	grace := c.StopGrace
	if grace == 0 {
		grace = 10 * time.Second
	}
	for i := range c.Chunk {
		if c.Chunk[i].PID != 0 {
			keep(stop(c.Chunk[i].PID, syscall.SIGTERM, grace))
			c.Chunk[i].PID = 0
		}
	}
	if c.Meta.PID != 0 {
		keep(stop(c.Meta.PID, syscall.SIGTERM, grace))
		c.Meta.PID = 0
	}
	for i := range c.Metas {
		if c.Metas[i].PID != 0 {
			keep(stop(c.Metas[i].PID, syscall.SIGTERM, grace))
			c.Metas[i].PID = 0
		}
	}
	for len(c.Tmpfs) > 0 {
		dir := c.Tmpfs[len(c.Tmpfs)-1]
		if err := syscall.Unmount(dir, 0); err != nil {
			keep(fmt.Errorf("devcluster: unmount tmpfs %s: %w (detached)", dir, err))
			syscall.Unmount(dir, syscall.MNT_DETACH)
		}
		c.Tmpfs = c.Tmpfs[:len(c.Tmpfs)-1]
	}
	c.save()
	return first
}

// stop signals pid and waits until it is gone, escalating to SIGKILL.
func stop(pid int, sig syscall.Signal, grace time.Duration) error {
	if pid <= 0 {
		return nil
	}
	if err := syscall.Kill(pid, sig); err != nil {
		if errors.Is(err, syscall.ESRCH) {
			return nil
		}
		return fmt.Errorf("devcluster: signal %d: %w", pid, err)
	}
	deadline := time.Now().Add(grace)
	for !Exited(pid) {
		if time.Now().After(deadline) {
			syscall.Kill(pid, syscall.SIGKILL)
			return fmt.Errorf("devcluster: pid %d ignored %v for %v: killed", pid, sig, grace)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

// Exited reports whether process pid (not 0) is gone or has exited and
// waits to be reaped (a zombie).
func Exited(pid int) bool {
	return syscall.Kill(pid, 0) != nil || zombie(pid)
}

// zombie reports whether pid has exited but not been reaped (by another
// process). A killed multi-threaded process's main thread is a zombie while
// its other threads still exit (holding its files, and their locks), so
// the process counts as exited only once it is its last thread.
func zombie(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	// The state follows the command name in parentheses.
	z := false
	for i := len(b) - 1; i > 0; i-- {
		if b[i] == ')' && i+2 < len(b) {
			z = b[i+2] == 'Z'
			break
		}
	}
	if !z {
		return false
	}
	tasks, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
	return err != nil || len(tasks) <= 1
}

func (c *Cluster) save() error {
	b, _ := json.MarshalIndent(c, "", "  ")
	if err := os.WriteFile(filepath.Join(c.Dir, "cluster.json"), b, private.FileMode); err != nil {
		return fmt.Errorf("devcluster: %w", err)
	}
	return nil
}

// Load reads a cluster's state from dir.
func Load(dir string) (*Cluster, error) {
	b, err := os.ReadFile(filepath.Join(dir, "cluster.json"))
	if err != nil {
		return nil, fmt.Errorf("devcluster: no cluster in %s: %w", dir, err)
	}
	c := &Cluster{}
	if err := json.Unmarshal(b, c); err != nil {
		return nil, fmt.Errorf("devcluster: %s: %w", filepath.Join(dir, "cluster.json"), err)
	}
	return c, nil
}
