package e2e

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/internal/cmdbuild"
	"github.com/rdmafs/rdmafs/internal/devcluster/clustertest"
)

// TestSystemdUnits checks deploy/systemd's units with systemd-analyze
// verify (their commands pointed at the test's binaries): no error and no
// warning, templates instantiated.
func TestSystemdUnits(t *testing.T) {
	needRoot(t)
	clustertest.Need(t, "systemd-analyze")
	root, err := cmdbuild.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	units, err := filepath.Glob(filepath.Join(root, "deploy", "systemd", "*.service"))
	if err != nil || len(units) < 3 {
		t.Fatalf("units in deploy/systemd: %v, %v", units, err)
	}
	dir := t.TempDir()
	var names []string
	for _, u := range units {
		b, err := os.ReadFile(u)
		if err != nil {
			t.Fatal(err)
		}
		name := filepath.Base(u)
		if err := os.WriteFile(filepath.Join(dir, name), []byte(strings.ReplaceAll(string(b), "/usr/local/bin/", binDir+"/")), 0o644); err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(name, "@.service") {
			name = strings.TrimSuffix(name, "@.service") + "@test.service"
		}
		names = append(names, filepath.Join(dir, name))
	}
	out, err := exec.Command("systemd-analyze", append([]string{"verify"}, names...)...).CombinedOutput()
	if err != nil || len(out) > 0 {
		t.Fatalf("systemd-analyze verify %v: %v\n%s", names, err, out)
	}
}

// notifySocket is a fake systemd notification socket.
type notifySocket struct {
	path string
	conn *net.UnixConn
}

func newNotifySocket(t *testing.T) *notifySocket {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &notifySocket{path: path, conn: conn}
}

// expect waits up to d for a message holding want.
func (n *notifySocket) expect(t *testing.T, want string, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	buf := make([]byte, 4096)
	for {
		n.conn.SetReadDeadline(deadline)
		k, err := n.conn.Read(buf)
		if err != nil {
			t.Fatalf("no %q on the notification socket within %v: %v", want, d, err)
		}
		if strings.Contains(string(buf[:k]), want) {
			return
		}
	}
}

// TestNotifyReadiness runs meta and chunkd as systemd would run their
// Type=notify units, with a fake notification socket and a watchdog: each
// says READY=1 once it serves, sends WATCHDOG=1 keep-alives, and says
// STOPPING=1 when SIGTERM stops it, then exits cleanly.
func TestNotifyReadiness(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	metaData := filepath.Join(dir, "meta")
	if out, err := exec.Command(filepath.Join(binDir, "rdmafs"), "format", metaData).CombinedOutput(); err != nil {
		t.Fatalf("format: %v\n%s", err, out)
	}
	procs := map[string][]string{
		"meta":   {filepath.Join(binDir, "rdmafs"), "meta", "--data", metaData, "--listen", "127.0.0.1:0"},
		"chunkd": {filepath.Join(binDir, "chunkd"), "--data", filepath.Join(dir, "chunk"), "--listen", "127.0.0.1:0", "--transport", "tcp", "--mem", "64MiB"},
	}
	for name, argv := range procs {
		t.Run(name, func(t *testing.T) {
			ns := newNotifySocket(t)
			cmd := exec.Command(argv[0], argv[1:]...)
			cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+ns.path, "WATCHDOG_USEC=400000")
			log, err := os.Create(filepath.Join(dir, name+".log"))
			if err != nil {
				t.Fatal(err)
			}
			defer log.Close()
			cmd.Stdout, cmd.Stderr = log, log
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			defer func() {
				cmd.Process.Kill()
				<-done
			}()
			ns.expect(t, "READY=1", 20*time.Second)
			ns.expect(t, "WATCHDOG=1", 2*time.Second)
			if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			ns.expect(t, "STOPPING=1", 10*time.Second)
			select {
			case err := <-done:
				if err != nil {
					b, _ := os.ReadFile(log.Name())
					t.Fatalf("%s exited with %v after SIGTERM; its log:\n%s", name, err, b)
				}
				done <- nil
			case <-time.After(30 * time.Second):
				t.Fatalf("%s still running 30s after SIGTERM", name)
			}
		})
	}
}
