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
	"syscall"
	"time"

	"github.com/rdmafs/rdmafs/meta/client"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// Config describes a cluster to bring up.
type Config struct {
	Dir          string // everything lives here (created)
	Bin          string // directory holding the rdmafs and chunkd binaries
	Chunkservers int    // default 6; negative: none (metadata-only tests)
	EC           string // default "4+2"
	Unit         string // default "1MiB"
	Transport    string // rdma transport for chunkd and the client (default "auto")
	ChunkdMem    string // registered memory per chunkd (default "256MiB")
	ClientMem    string // client buffer memory (default "256MiB")
	Mount        bool   // also mount at Dir/mnt
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
}

// Proc is a process of the cluster.
type Proc struct {
	PID  int    `json:"pid"`
	Addr string `json:"addr,omitempty"`
	Data string `json:"data,omitempty"`
	Log  string `json:"log"`
}

// Cluster is a running cluster; its state is kept in Dir/cluster.json.
type Cluster struct {
	Dir        string `json:"dir"`
	Bin        string `json:"bin"`
	MetaAddr   string `json:"meta_addr"`
	SecretFile string `json:"secret_file"`
	Transport  string `json:"transport"`
	Meta       Proc   `json:"meta"`
	// Metas are all meta servers (with an etcd store; Meta is Metas[0]).
	Metas      []Proc   `json:"metas,omitempty"`
	Chunk      []Proc   `json:"chunk"`
	Mount      *Proc    `json:"mount,omitempty"`
	MountPoint string   `json:"mount_point,omitempty"`
	ChunkdArgs []string `json:"chunkd_args,omitempty"`
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

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Up formats a file system in cfg.Dir (unless formatted), starts the meta
// server and the chunkservers, waits until all are registered and up, and
// mounts it when cfg.Mount is set. On failure everything started is stopped.
func Up(ctx context.Context, cfg Config) (c *Cluster, err error) {
	cfg.defaults()
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("devcluster: %w", err)
	}
	dir, _ := filepath.Abs(cfg.Dir)
	c = &Cluster{Dir: dir, Bin: cfg.Bin, Transport: cfg.Transport, ChunkdArgs: cfg.ChunkdArgs}
	defer func() {
		if err != nil {
			c.Down(context.Background())
		}
	}()
	if cfg.KV != "" {
		return c, c.upEtcd(ctx, cfg)
	}
	metaData := filepath.Join(dir, "meta")
	c.SecretFile = filepath.Join(metaData, "secret")
	if _, err := os.Stat(c.SecretFile); errors.Is(err, os.ErrNotExist) {
		out, err := exec.CommandContext(ctx, c.bin("rdmafs"), "format", metaData, "--ec", cfg.EC, "--unit", cfg.Unit).CombinedOutput()
		if err != nil {
			return c, fmt.Errorf("devcluster: rdmafs format: %v: %s", err, out)
		}
	}
	port, err := freePort()
	if err != nil {
		return c, fmt.Errorf("devcluster: %w", err)
	}
	c.MetaAddr = fmt.Sprintf("127.0.0.1:%d", port)
	metaArgs := append([]string{"meta", "--data", metaData, "--listen", c.MetaAddr,
		"--heartbeat-timeout", cfg.HeartbeatTimeout.String()}, cfg.MetaArgs...)
	if c.Meta, err = c.start("meta", c.bin("rdmafs"), metaArgs...); err != nil {
		return c, err
	}
	c.Meta.Addr, c.Meta.Data = c.MetaAddr, metaData
	if err := c.save(); err != nil {
		return c, err
	}
	for i := 0; i < cfg.Chunkservers; i++ {
		p, err := c.StartChunkd(ctx, i, cfg.ChunkdMem)
		if err != nil {
			return c, err
		}
		c.Chunk = append(c.Chunk, p)
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

// start launches a process whose output goes to Dir/NAME.log.
func (c *Cluster) start(name, exe string, args ...string) (Proc, error) {
	logPath := filepath.Join(c.Dir, name+".log")
	lf, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return Proc{}, fmt.Errorf("devcluster: %w", err)
	}
	defer lf.Close()
	cmd := exec.Command(exe, args...)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return Proc{}, fmt.Errorf("devcluster: start %s: %w", name, err)
	}
	go cmd.Wait() // reap
	return Proc{PID: cmd.Process.Pid, Log: logPath}, nil
}

// StartChunkd starts chunkserver number i (its data in Dir/chunkI, reused if
// it exists) and waits until it serves.
func (c *Cluster) StartChunkd(ctx context.Context, i int, mem string) (Proc, error) {
	data := filepath.Join(c.Dir, fmt.Sprintf("chunk%d", i))
	ready := filepath.Join(c.Dir, fmt.Sprintf("chunk%d.ready", i))
	os.Remove(ready)
	addr := ""
	if i < len(c.Chunk) {
		addr = c.Chunk[i].Addr // restart on the address it registered
	}
	if addr == "" {
		port, err := freePort()
		if err != nil {
			return Proc{}, err
		}
		addr = fmt.Sprintf("127.0.0.1:%d", port)
	}
	if mem == "" {
		mem = "256MiB"
	}
	args := append([]string{"--data", data, "--listen", addr, "--meta", c.MetaAddr,
		"--secret-file", c.SecretFile, "--mem", mem, "--transport", c.Transport, "--ready-file", ready, "--heartbeat", "500ms"}, c.ChunkdArgs...)
	p, err := c.start(fmt.Sprintf("chunk%d", i), c.bin("chunkd"), args...)
	if err != nil {
		return p, err
	}
	p.Addr, p.Data = addr, data
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := os.Stat(ready); err == nil {
			return p, nil
		}
		if syscall.Kill(p.PID, 0) != nil || time.Now().After(deadline) {
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

func tail(b []byte) []byte {
	if len(b) > 4000 {
		return b[len(b)-4000:]
	}
	return b
}

// Client connects to the meta server.
func (c *Cluster) Client() (*client.Client, error) {
	return client.DialSecretFile(c.MetaAddr, c.SecretFile)
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
		up := 0
		if err == nil {
			for _, cs := range st.Chunkservers {
				if cs.Up {
					up++
				}
			}
			if up >= n {
				return nil
			}
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

// MountFS mounts the file system at dir with `rdmafs mount --background`.
func (c *Cluster) MountFS(ctx context.Context, dir, mem string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("devcluster: %w", err)
	}
	logPath := filepath.Join(c.Dir, "mount.log")
	if mem == "" {
		mem = "256MiB"
	}
	out, err := exec.CommandContext(ctx, c.bin("rdmafs"), "mount", c.MetaAddr, dir, "--secret-file", c.SecretFile,
		"--transport", c.Transport, "--mem", mem, "--background", "--log-file", logPath).CombinedOutput()
	if err != nil {
		return fmt.Errorf("devcluster: mount: %v: %s", err, out)
	}
	var pid int
	if _, err := fmt.Sscanf(string(out), "mounted (pid %d", &pid); err != nil {
		return fmt.Errorf("devcluster: mount said %q", out)
	}
	c.Mount, c.MountPoint = &Proc{PID: pid, Log: logPath}, dir
	return c.save()
}

// Unmount stops the mount process with SIGTERM (it flushes and unmounts) and
// waits for it.
func (c *Cluster) Unmount() error {
	if c.Mount == nil {
		return nil
	}
	err := stop(c.Mount.PID, syscall.SIGTERM, 60*time.Second)
	if err != nil {
		syscall.Unmount(c.MountPoint, syscall.MNT_DETACH)
	}
	c.Mount = nil
	c.save()
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
	for i := range c.Chunk {
		if c.Chunk[i].PID != 0 {
			keep(stop(c.Chunk[i].PID, syscall.SIGTERM, 10*time.Second))
			c.Chunk[i].PID = 0
		}
	}
	if c.Meta.PID != 0 {
		keep(stop(c.Meta.PID, syscall.SIGTERM, 10*time.Second))
		c.Meta.PID = 0
	}
	for i := range c.Metas {
		if c.Metas[i].PID != 0 {
			keep(stop(c.Metas[i].PID, syscall.SIGTERM, 10*time.Second))
			c.Metas[i].PID = 0
		}
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
	for syscall.Kill(pid, 0) == nil && !zombie(pid) {
		if time.Now().After(deadline) {
			syscall.Kill(pid, syscall.SIGKILL)
			return fmt.Errorf("devcluster: pid %d ignored %v for %v: killed", pid, sig, grace)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

// zombie reports whether pid has exited but not been reaped (by another process).
func zombie(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	// The state follows the command name in parentheses.
	for i := len(b) - 1; i > 0; i-- {
		if b[i] == ')' && i+2 < len(b) {
			return b[i+2] == 'Z'
		}
	}
	return false
}

func (c *Cluster) save() error {
	b, _ := json.MarshalIndent(c, "", "  ")
	if err := os.WriteFile(filepath.Join(c.Dir, "cluster.json"), b, 0o644); err != nil {
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
