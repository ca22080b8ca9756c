// Package netns builds a small network of Linux network namespaces for fault
// tests: a hub namespace holding a bridge, and hosts, each a namespace of its
// own joined to the bridge by a veth pair, with an address only inside it.
// Nothing is created in the namespace of the calling process. A process runs
// on a host under `nsenter --net=/run/netns/NAME` (see Host.Prefix), which
// enters only the network namespace: a FUSE mount made there stays visible
// in the caller's mount namespace. Faults: Partition (the hub side of the
// host's veth goes down), Blackhole (every packet to and from the host
// dropped by nftables while the link stays up: a silent peer), Loss and
// Delay (tc netem where the kernel has it; loss falls back to nftables).
//
// Every command runs with a deadline; Close deletes every namespace the lab
// made, which removes its veths and bridge with it.
package netns

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// ErrUnsupported is returned by a fault the kernel or the tools cannot inject.
var ErrUnsupported = errors.New("netns: not supported here")

// Available reports why network namespaces cannot be used here, or nil.
func Available() error {
	for _, prog := range []string{"ip", "nsenter"} {
		if _, err := exec.LookPath(prog); err != nil {
			return fmt.Errorf("netns: %s not installed (iproute2 / util-linux): %w", prog, err)
		}
	}
	if os.Geteuid() != 0 {
		return errors.New("netns: needs root")
	}
	return nil
}

// Lab is a hub namespace with a bridge and the hosts attached to it.
type Lab struct {
	prefix string // namespace names start with it
	subnet string // first three octets of the hosts' addresses, e.g. "10.77.0"
	hub    string // the hub namespace

	mu    sync.Mutex
	hosts []*Host
	nss   []string // every namespace made, in order
}

// Host is a network namespace attached to the lab's bridge.
type Host struct {
	lab  *Lab
	Name string // the host's name in the lab
	NS   string // namespace name (under /run/netns)
	IP   string // its address (a /24 shared by the lab)
	dev  string // its end of the veth pair, inside NS
	hub  string // the other end, inside the hub namespace
	nft  bool   // a blackhole table is installed
}

func run(ctx context.Context, args ...string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("netns: %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// New creates the hub namespace PREFIX-hub with a bridge. prefix must be
// unique among the labs alive on the machine (e.g. include the PID); hosts
// get addresses subnet.10, subnet.11, ... (subnet is three octets).
func New(ctx context.Context, prefix, subnet string) (l *Lab, err error) {
	if err := Available(); err != nil {
		return nil, err
	}
	l = &Lab{prefix: prefix, subnet: subnet, hub: prefix + "-hub"}
	defer func() {
		if err != nil {
			l.Close()
		}
	}()
	if err := l.addNS(ctx, l.hub); err != nil {
		return l, err
	}
	for _, args := range [][]string{
		{"ip", "-n", l.hub, "link", "add", "br0", "type", "bridge"},
		{"ip", "-n", l.hub, "link", "set", "br0", "up"},
	} {
		if err := run(ctx, args...); err != nil {
			return l, err
		}
	}
	return l, nil
}

func (l *Lab) addNS(ctx context.Context, name string) error {
	// A namespace left by a crashed earlier run of the same name goes first.
	if _, err := os.Stat("/run/netns/" + name); err == nil {
		run(ctx, "ip", "netns", "del", name)
	}
	if err := run(ctx, "ip", "netns", "add", name); err != nil {
		return err
	}
	l.mu.Lock()
	l.nss = append(l.nss, name)
	l.mu.Unlock()
	return run(ctx, "ip", "-n", name, "link", "set", "lo", "up")
}

// AddHost creates a namespace joined to the bridge, with an address of its own.
func (l *Lab) AddHost(ctx context.Context, name string) (*Host, error) {
	l.mu.Lock()
	n := len(l.hosts)
	l.mu.Unlock()
	h := &Host{lab: l, Name: name, NS: fmt.Sprintf("%s-%s", l.prefix, name),
		IP: fmt.Sprintf("%s.%d", l.subnet, 10+n), dev: "eth0", hub: fmt.Sprintf("v%d", n)}
	if err := l.addNS(ctx, h.NS); err != nil {
		return nil, err
	}
	for _, args := range [][]string{
		{"ip", "-n", h.NS, "link", "add", h.dev, "type", "veth", "peer", "name", h.hub, "netns", l.hub},
		{"ip", "-n", h.NS, "addr", "add", h.IP + "/24", "dev", h.dev},
		{"ip", "-n", h.NS, "link", "set", h.dev, "up"},
		{"ip", "-n", l.hub, "link", "set", h.hub, "master", "br0"},
		{"ip", "-n", l.hub, "link", "set", h.hub, "up"},
	} {
		if err := run(ctx, args...); err != nil {
			return nil, err
		}
	}
	l.mu.Lock()
	l.hosts = append(l.hosts, h)
	l.mu.Unlock()
	return h, nil
}

// Close deletes every namespace of the lab (and with them the veths and the
// bridge). Processes still running in one keep it alive until they exit:
// stop them first.
func (l *Lab) Close() error {
	l.mu.Lock()
	nss := append([]string(nil), l.nss...)
	l.nss = nil
	l.mu.Unlock()
	var first error
	for i := len(nss) - 1; i >= 0; i-- {
		if err := run(context.Background(), "ip", "netns", "del", nss[i]); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Path is the namespace's file, for setns(2) and nsenter.
func (h *Host) Path() string { return "/run/netns/" + h.NS }

// Prefix is the command prefix that runs a program on the host: only the
// network namespace changes (mounts, PIDs and files are the caller's).
func (h *Host) Prefix() []string { return []string{"nsenter", "--net=" + h.Path(), "--"} }

// DialContext connects from inside the host's namespace: the socket is made
// by a thread that entered the namespace (and that thread then ends, so no
// other goroutine ever runs in it). For grpc.WithContextDialer.
func (h *Host) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		// Never unlocked: the goroutine exits locked, so the runtime ends
		// the thread instead of reusing it in the wrong namespace.
		runtime.LockOSThread()
		fd, err := unix.Open(h.Path(), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			ch <- result{nil, fmt.Errorf("netns: %w", err)}
			return
		}
		err = unix.Setns(fd, unix.CLONE_NEWNET)
		unix.Close(fd)
		if err != nil {
			ch <- result{nil, fmt.Errorf("netns: setns %s: %w", h.NS, err)}
			return
		}
		var d net.Dialer
		c, err := d.DialContext(ctx, network, addr)
		ch <- result{c, err}
	}()
	r := <-ch
	return r.c, r.err
}

// Partition takes the hub side of the host's link down: the host's packets
// go nowhere and nothing reaches it, while its processes keep running.
func (h *Host) Partition(ctx context.Context) error {
	return run(ctx, "ip", "-n", h.lab.hub, "link", "set", h.hub, "down")
}

// Heal undoes Partition.
func (h *Host) Heal(ctx context.Context) error {
	return run(ctx, "ip", "-n", h.lab.hub, "link", "set", h.hub, "up")
}

// Blackhole drops every packet to and from the host (nftables inside its
// namespace) while its link stays up: peers see silence, not refusals.
// Undo with Clear.
func (h *Host) Blackhole(ctx context.Context) error {
	return h.nftDrop(ctx, "drop")
}

// nftDrop installs a table dropping the host's packets on eth0 with verdict
// expr (e.g. "drop", or "numgen random mod 100 < 20 drop").
func (h *Host) nftDrop(ctx context.Context, expr string) error {
	if _, err := exec.LookPath("nft"); err != nil {
		return fmt.Errorf("%w: nft (nftables) not installed", ErrUnsupported)
	}
	h.clearNft(ctx)
	script := fmt.Sprintf(`table inet rdmafsfault {
  chain in { type filter hook input priority -300; policy accept; iifname "%[1]s" %[2]s; }
  chain out { type filter hook output priority -300; policy accept; oifname "%[1]s" %[2]s; }
}
`, h.dev, expr)
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", h.NS, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("netns: nft on %s: %v: %s", h.Name, err, bytes.TrimSpace(out))
	}
	h.nft = true
	return nil
}

func (h *Host) clearNft(ctx context.Context) {
	if h.nft {
		run(ctx, "ip", "netns", "exec", h.NS, "nft", "delete", "table", "inet", "rdmafsfault")
		h.nft = false
	}
}

// HasNetem reports whether tc netem works here (the kernel may lack sch_netem).
func (h *Host) HasNetem(ctx context.Context) bool {
	if err := run(ctx, "ip", "netns", "exec", h.NS, "tc", "qdisc", "replace", "dev", h.dev, "root", "netem", "delay", "0ms"); err != nil {
		return false
	}
	run(ctx, "ip", "netns", "exec", h.NS, "tc", "qdisc", "del", "dev", h.dev, "root")
	return true
}

// Netem sets a netem qdisc on the host's link (outgoing packets), e.g.
// Netem(ctx, "delay", "200ms", "50ms") or Netem(ctx, "loss", "100%").
func (h *Host) Netem(ctx context.Context, args ...string) error {
	a := append([]string{"ip", "netns", "exec", h.NS, "tc", "qdisc", "replace", "dev", h.dev, "root", "netem"}, args...)
	if err := run(ctx, a...); err != nil {
		if strings.Contains(err.Error(), "unknown") || strings.Contains(err.Error(), "No such file") {
			return fmt.Errorf("%w: %v", ErrUnsupported, err)
		}
		return err
	}
	return nil
}

// Delay delays the host's outgoing packets by d (netem only).
func (h *Host) Delay(ctx context.Context, d, jitter time.Duration) error {
	return h.Netem(ctx, "delay", d.String(), jitter.String())
}

// Loss drops pct percent of the host's packets: netem where the kernel has
// it, else nftables (both directions).
func (h *Host) Loss(ctx context.Context, pct int) error {
	err := h.Netem(ctx, "loss", fmt.Sprintf("%d%%", pct))
	if errors.Is(err, ErrUnsupported) {
		return h.nftDrop(ctx, fmt.Sprintf("numgen random mod 100 < %d drop", pct))
	}
	return err
}

// Throttle limits the host's outgoing rate (tc tbf), e.g. "8mbit": a slow
// but working link, available without netem.
func (h *Host) Throttle(ctx context.Context, rate string) error {
	return run(ctx, "ip", "netns", "exec", h.NS, "tc", "qdisc", "replace", "dev", h.dev, "root", "tbf",
		"rate", rate, "burst", "32kbit", "latency", "400ms")
}

// Clear removes every fault of the host: qdiscs, nftables rules, a partition.
func (h *Host) Clear(ctx context.Context) error {
	run(ctx, "ip", "netns", "exec", h.NS, "tc", "qdisc", "del", "dev", h.dev, "root") // none is fine
	h.clearNft(ctx)
	return h.Heal(ctx)
}
