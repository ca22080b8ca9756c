package devcluster

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/rdmafs/rdmafs/meta/client"
	"github.com/rdmafs/rdmafs/meta/metapb"
)

// upEtcd is Up for a file system in etcd with several meta servers.
func (c *Cluster) upEtcd(ctx context.Context, cfg Config) error {
	if cfg.Metas <= 0 {
		cfg.Metas = 2
	}
	if cfg.ElectionTTL <= 0 {
		cfg.ElectionTTL = 2 * time.Second
	}
	c.SecretFile = filepath.Join(c.Dir, "secret")
	out, err := exec.CommandContext(ctx, c.bin("rdmafs"), "format", "--kv", cfg.KV, "--secret-file", c.SecretFile,
		"--ec", cfg.EC, "--unit", cfg.Unit, "--trash-days", cfg.trashDays()).CombinedOutput()
	if err != nil {
		return fmt.Errorf("devcluster: rdmafs format --kv: %v: %s", err, out)
	}
	var addrs []string
	for i := 0; i < cfg.Metas; i++ {
		port, err := c.freePort()
		if err != nil {
			return fmt.Errorf("devcluster: %w", err)
		}
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		args := append(append([]string{c.bin("rdmafs"), "meta", "--kv", cfg.KV, "--listen", addr,
			"--secret-file", c.SecretFile, "--heartbeat-timeout", cfg.HeartbeatTimeout.String(),
			"--election-ttl", cfg.ElectionTTL.String()}, c.serverTLSArgs()...), cfg.MetaArgs...)
		p, err := c.start(fmt.Sprintf("meta%d", i), args...)
		if err != nil {
			return err
		}
		p.Addr = addr
		c.Metas = append(c.Metas, p)
		addrs = append(addrs, addr)
		if i == 0 {
			// Let the first one win the election: tests know whom to kill.
			if err := c.waitLeader(ctx, 0, 30*time.Second); err != nil {
				return err
			}
		}
	}
	c.Meta = c.Metas[0]
	c.MetaAddr = strings.Join(addrs, ",")
	if err := c.save(); err != nil {
		return err
	}
	for i := 0; i < cfg.Chunkservers; i++ {
		p, err := c.StartChunkd(ctx, i, cfg.ChunkdMem)
		if p.PID != 0 {
			c.Chunk = append(c.Chunk, p) // Down stops it, started or not
		}
		if err != nil {
			return err
		}
		if err := c.save(); err != nil {
			return err
		}
	}
	if err := c.WaitUp(ctx, cfg.Chunkservers, 30*time.Second); err != nil {
		return err
	}
	if cfg.Mount {
		if err := c.MountFS(ctx, filepath.Join(c.Dir, "mnt"), cfg.ClientMem); err != nil {
			return err
		}
	}
	return c.save()
}

// Leader returns the index in Metas of the meta server that serves, or -1.
func (c *Cluster) Leader(ctx context.Context) int {
	for i, m := range c.Metas {
		if m.PID != 0 && c.serves(ctx, m.Addr) {
			return i
		}
	}
	return -1
}

func (c *Cluster) serves(ctx context.Context, addr string) bool {
	mc, err := client.DialFiles(addr, c.SecretFile, c.ClientTLS())
	if err != nil {
		return false
	}
	defer mc.Close()
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, err = mc.StatFS(cctx, &metapb.StatFSRequest{})
	return err == nil
}

func (c *Cluster) waitLeader(ctx context.Context, i int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for !c.serves(ctx, c.Metas[i].Addr) {
		if time.Now().After(deadline) {
			return fmt.Errorf("devcluster: meta %d was not elected within %v", i, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}
