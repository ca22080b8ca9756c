package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/internal/devcluster"
	"golang.org/x/net/http2/hpack"
)

// otherUser is the uid and gid of a local user with no entry in /etc/passwd
// and no membership of root's groups: what an ordinary user of the host is
// to rdmafs's files.
const otherUser = 4242

// asOtherUser returns cmd set to run as otherUser.
func asOtherUser(cmd *exec.Cmd) *exec.Cmd {
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: otherUser, Gid: otherUser}}
	return cmd
}

// TestAtRestPrivate writes a file that only root may read, then searches the
// cluster's directories for its bytes and its name as another local user, with
// every parent directory opened to all as an installer might leave
// /srv or /var/lib: grep finds nothing, and no chunk, metadata, log or
// secret file can be opened. As root the same grep finds both, so the search
// is able to find them.
func TestAtRestPrivate(t *testing.T) {
	needRoot(t)
	c := up(t)
	marker := "rdmafs-at-rest-" + randomHex(t, 8)
	name := "payroll-" + randomHex(t, 6) + ".txt"
	data := bytes.Repeat([]byte(marker+"\n"), (2<<20)/(len(marker)+1)) // past the inline size: in shards
	path := filepath.Join(c.MountPoint, name)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	f.Close()

	// Open the cluster directory itself to all: what is below must stand alone.
	if err := os.Chmod(c.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	grep := func(other bool, pattern string) string {
		cmd := exec.Command("grep", "-r", "-l", "-a", "--exclude-dir=mnt", "-s", pattern, c.Dir)
		if other {
			asOtherUser(cmd)
		}
		out, _ := cmd.Output() // exit 1: nothing found; 2: unreadable entries (expected as other)
		return strings.TrimSpace(string(out))
	}
	if grep(false, marker) == "" || grep(false, name) == "" {
		t.Fatalf("root's grep found neither the data (%q) nor the name (%q) in %s: the search cannot tell", grep(false, marker), grep(false, name), c.Dir)
	}
	if out := grep(true, marker); out != "" {
		t.Fatalf("another user found the file's data in:\n%s", out)
	}
	if out := grep(true, name); out != "" {
		t.Fatalf("another user found the file's name in:\n%s", out)
	}

	// Every file below the cluster directory but the mount and the public
	// certificates is closed to the other user, checked file by file.
	var open []string
	err = filepath.WalkDir(c.Dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == c.MountPoint {
			return filepath.SkipDir
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		public := strings.HasSuffix(p, ".pem") && !strings.HasSuffix(p, "-key.pem")
		if p != c.Dir && !public && fi.Mode().Perm()&0o077 != 0 {
			open = append(open, p+" "+fi.Mode().String())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(open) > 0 {
		t.Fatalf("open to group or others:\n%s", strings.Join(open, "\n"))
	}
	for _, p := range []string{c.SecretFile, filepath.Join(c.Meta.Data, "meta.db"), c.Chunk[0].Data} {
		if err := asOtherUser(exec.Command("cat", p)).Run(); err == nil {
			t.Fatalf("another user read %s", p)
		}
	}
}

// recorder is a TCP proxy to one address that keeps every byte it carries,
// both ways: a packet capture of the connections made through it.
type recorder struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	bytes  bytes.Buffer
	wg     sync.WaitGroup
}

func newRecorder(t *testing.T, target string) *recorder {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &recorder{ln: ln, target: target}
	r.wg.Add(1)
	go r.serve()
	t.Cleanup(r.close)
	return r
}

func (r *recorder) Write(b []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.bytes.Write(b)
}

func (r *recorder) serve() {
	defer r.wg.Done()
	for {
		in, err := r.ln.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", r.target)
		if err != nil {
			in.Close()
			continue
		}
		r.wg.Add(2)
		pipe := func(dst, src net.Conn) {
			defer r.wg.Done()
			io.Copy(io.MultiWriter(dst, r), src)
			dst.Close()
			src.Close()
		}
		go pipe(out, in)
		go pipe(in, out)
	}
}

func (r *recorder) close() {
	r.ln.Close()
	r.wg.Wait()
}

// captured returns a copy of everything carried so far.
func (r *recorder) captured() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return bytes.Clone(r.bytes.Bytes())
}

// captureMount mounts c through a recorder in front of its meta server,
// creates a file with a distinctive name and data, unmounts, and returns
// the capture, the secret and the name.
func captureMount(t *testing.T, c *devcluster.Cluster) (capture []byte, secret, name string) {
	t.Helper()
	rec := newRecorder(t, c.MetaAddr)
	real := c.MetaAddr
	c.MetaAddr = rec.ln.Addr().String()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := c.MountFS(ctx, filepath.Join(c.Dir, "mnt"), "")
	c.MetaAddr = real
	if err != nil {
		t.Fatal(err)
	}
	name = "merger-plans-" + randomHex(t, 6) + ".txt"
	p := filepath.Join(c.MountPoint, name)
	if err := os.WriteFile(p, []byte("small, inline: in the commit itself\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatal(err)
	}
	if err := c.Unmount(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(c.SecretFile)
	if err != nil {
		t.Fatal(err)
	}
	return rec.captured(), strings.TrimSpace(string(b)), name
}

// TestControlPlaneCapture records a mount's connection to meta: with TLS
// (the default) neither the cluster secret nor a file name it created is in
// the bytes on the wire; on a cluster run with --plaintext both are, which
// shows the capture would catch them.
func TestControlPlaneCapture(t *testing.T) {
	needRoot(t)
	plainCfg := func(plain bool) func(*devcluster.Config) {
		return func(cfg *devcluster.Config) { cfg.Mount, cfg.PlainText = false, plain }
	}
	c := upWith(t, plainCfg(false))
	capture, secret, name := captureMount(t, c)
	if len(capture) < 1000 {
		t.Fatalf("captured only %d bytes: the mount did not go through the recorder", len(capture))
	}
	if inClear(capture, secret) {
		t.Fatal("the cluster secret crossed the wire in clear with TLS on")
	}
	if bytes.Contains(capture, []byte(name)) {
		t.Fatal("a file name crossed the wire in clear with TLS on")
	}
	plain := upWith(t, plainCfg(true))
	capture, secret, name = captureMount(t, plain)
	if !inClear(capture, secret) || !bytes.Contains(capture, []byte(name)) {
		t.Fatalf("without TLS the capture (%d bytes) holds the secret: %v, the name: %v — the check cannot see them",
			len(capture), inClear(capture, secret), bytes.Contains(capture, []byte(name)))
	}
}

// inClear reports whether capture holds s as an HTTP/2 header value would
// carry it: as is, or Huffman-coded by HPACK (a coded string literal starts
// on a byte boundary, so its bytes appear whole).
func inClear(capture []byte, s string) bool {
	return bytes.Contains(capture, []byte(s)) || bytes.Contains(capture, hpack.AppendHuffmanString(nil, s))
}

func randomHex(t *testing.T, n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// mountWithToken mounts c at dir with the mount token in tokenFile instead
// of the secret (and c's TLS flags), as a process of its own; the mount is
// stopped with SIGTERM when the test ends.
func mountWithToken(t *testing.T, c *devcluster.Cluster, tokenFile, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"mount", c.MetaAddr, dir, "--token-file", tokenFile, "--transport", c.Transport, "--mem", "64MiB"},
		c.TLSArgs()...)
	var log bytes.Buffer
	cmd := exec.Command(filepath.Join(binDir, "rdmafs"), args...)
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		if devcluster.IsFUSEMount(dir) {
			syscall.Unmount(dir, syscall.MNT_DETACH)
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for !devcluster.IsFUSEMount(dir) {
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("mount with %s exited: %v\n%s", tokenFile, err, log.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("mount with %s not mounted after 30s:\n%s", tokenFile, log.String())
		}
	}
}

// TestMountToken mounts with mount tokens made by `rdmafs admin token
// create`: the mount's root is the token's subdirectory and nothing else of
// the file system is in it; file data moves through chunkd on the token's
// data key; root's files belong to nobody under --squash-root; a
// --readonly token's mount reads and refuses every change with EROFS.
func TestMountToken(t *testing.T) {
	needRoot(t)
	c := up(t)
	proj := filepath.Join(c.MountPoint, "projects", "a")
	if err := os.MkdirAll(proj, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(proj, 0o777); err != nil {
		t.Fatal(err)
	}
	big := pattern(3<<20, 7) // in shards: read back through chunkd
	if err := os.WriteFile(filepath.Join(proj, "big"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(c.MountPoint, "other"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(c.MountPoint, "other", "payroll"), []byte("outside"), 0o644); err != nil {
		t.Fatal(err)
	}
	token := func(name string, flags ...string) string {
		file := filepath.Join(t.TempDir(), name)
		out, err := rdmafs(t, append([]string{"admin", "token", "create", "--secret-file", c.SecretFile, "--subdir", "/projects/a", "-o", file}, flags...)...)
		if err != nil {
			t.Fatalf("admin token create: %v\n%s", err, out)
		}
		return file
	}

	rwDir := filepath.Join(t.TempDir(), "rw")
	mountWithToken(t, c, token("rw", "--squash-root"), rwDir)
	ents, err := os.ReadDir(rwDir)
	if err != nil || len(ents) != 1 || ents[0].Name() != "big" {
		t.Fatalf("the token mount's root holds %v (%v), want the subdirectory's one file", ents, err)
	}
	got, err := os.ReadFile(filepath.Join(rwDir, "big"))
	if err != nil || !bytes.Equal(got, big) {
		t.Fatalf("read through the token mount: %v (equal %v)", err, bytes.Equal(got, big))
	}
	written := pattern(2<<20, 8)
	if err := os.WriteFile(filepath.Join(rwDir, "by-root"), written, 0o644); err != nil {
		t.Fatalf("write through a read-write token mount: %v", err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(proj, "by-root"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Uid != 65534 || st.Gid != 65534 {
		t.Fatalf("root's file on a root-squashed mount is owned by %d:%d, want 65534:65534", st.Uid, st.Gid)
	}
	if got, err := os.ReadFile(filepath.Join(proj, "by-root")); err != nil || !bytes.Equal(got, written) {
		t.Fatalf("file written through the token mount, read on the full mount: %v", err)
	}

	roDir := filepath.Join(t.TempDir(), "ro")
	mountWithToken(t, c, token("ro", "--readonly"), roDir)
	if got, err := os.ReadFile(filepath.Join(roDir, "big")); err != nil || !bytes.Equal(got, big) {
		t.Fatalf("read through a read-only token mount: %v", err)
	}
	for name, err := range map[string]error{
		"create": os.WriteFile(filepath.Join(roDir, "new"), []byte("x"), 0o644),
		"write":  os.WriteFile(filepath.Join(roDir, "big"), []byte("x"), 0o644),
		"remove": os.Remove(filepath.Join(roDir, "big")),
		"mkdir":  os.Mkdir(filepath.Join(roDir, "d"), 0o755),
		"chmod":  os.Chmod(filepath.Join(roDir, "big"), 0o600),
	} {
		if !errors.Is(err, syscall.EROFS) {
			t.Errorf("%s on a read-only token mount: %v, want EROFS", name, err)
		}
	}
	if got, err := os.ReadFile(filepath.Join(proj, "big")); err != nil || !bytes.Equal(got, big) {
		t.Fatalf("the file after the read-only mount's attempts: %v", err)
	}
}
