package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/rdmafs/rdmafs/internal/devcluster"
)

// testOutDir is where tests leave artefacts for people to look at
// (screenshots): $RDMAFS_TEST_OUT, else rdmafs-test-out in the temporary
// directory. It is not removed after the test.
func testOutDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("RDMAFS_TEST_OUT")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "rdmafs-test-out")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestDashboard opens meta's web dashboard of a dev cluster (TLS on, as
// by default) in headless Chromium: it loads with no console error or
// exception, lists the cluster's chunkservers, and after a chunkd is killed
// -9 shows it down and a degraded stripe count. Screenshots of both states
// go to testOutDir.
func TestDashboard(t *testing.T) {
	needRoot(t)
	browser, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal("chromium is not installed: the dashboard test needs Debian's chromium package (scripts/install-deps.sh installs it)")
	}
	c := upWith(t, func(cfg *devcluster.Config) {
		cfg.Chunkservers = 3
		cfg.EC, cfg.Unit = "2+1", "64KiB"
		cfg.MetaArgs = []string{"--http", "127.0.0.1:0", "--dashboard-interval", "1s"}
	})
	for i := range 4 {
		if err := os.WriteFile(fmt.Sprintf("%s/f%d", c.MountPoint, i), bytes.Repeat([]byte{byte(i)}, 300<<10), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	httpAddr := logged(t, c.Meta.Log, `msg="meta server started".* metrics=(\S+)`)
	secret, err := os.ReadFile(c.SecretFile)
	if err != nil {
		t.Fatal(err)
	}
	scheme := "http"
	if c.TLSDir != "" {
		scheme = "https" // the dashboard is behind meta's TLS
	}
	url := scheme + "://" + httpAddr + "/"

	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(browser),
		chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.UserDataDir(t.TempDir()),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-quic", true),
		// The cluster's CA is its own: the browser is not told to trust it.
		chromedp.Flag("ignore-certificate-errors", c.TLSDir != ""),
		chromedp.WindowSize(1400, 1000),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx)
	defer cancelBrowser()

	var mu sync.Mutex
	var problems []string
	if err := chromedp.Listen(bctx, func(ev any) {
		mu.Lock()
		defer mu.Unlock()
		switch ev := ev.(type) {
		case *runtime.EventConsoleAPICalled:
			if ev.Type == runtime.ConsoleAPICalledTypeError || ev.Type == runtime.ConsoleAPICalledTypeWarning {
				var args []string
				for _, a := range ev.Args {
					args = append(args, string(a.Value)+a.Description)
				}
				problems = append(problems, fmt.Sprintf("console.%s: %s", ev.Type, strings.Join(args, " ")))
			}
		case *runtime.EventExceptionThrown:
			problems = append(problems, (&chromedp.ExceptionError{ExceptionDetails: ev.ExceptionDetails}).Error())
		case *cdplog.EventEntryAdded:
			if ev.Entry.Level == cdplog.EntryLevelError || ev.Entry.Level == cdplog.EntryLevelWarning {
				problems = append(problems, fmt.Sprintf("log %s: %s %s", ev.Entry.Level, ev.Entry.Text, ev.Entry.URL))
			}
		}
	}); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	// The browser lives as long as bctx; actions get a deadline of their own.
	ctx, cancel := context.WithTimeout(bctx, 3*time.Minute)
	defer cancel()
	auth := "Basic " + base64.StdEncoding.EncodeToString([]byte("admin:"+strings.TrimSpace(string(secret))))
	if _, err := chromedp.Call(ctx, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{Headers: network.Headers{"Authorization": auth}}); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(ctx, chromedp.Navigate(url)); err != nil {
		t.Fatalf("open %s: %v", url, err)
	}
	out := testOutDir(t)

	// Healthy: every chunkserver listed up.
	waitPage(ctx, t, "three chunkservers up, healthy",
		`document.querySelectorAll('#servers tbody td.up').length === 3 && document.getElementById('health').textContent === 'healthy'`)
	rows, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('#servers tbody tr').length`))
	if err != nil {
		t.Fatal(err)
	}
	if rows != 3 {
		t.Fatalf("the dashboard lists %d chunkservers, want 3", rows)
	}
	for i, ch := range c.Chunk {
		listed, err := chromedp.Run(ctx, chromedp.Evaluate[bool](fmt.Sprintf(
			`[...document.querySelectorAll('#servers tbody tr')].some(tr => tr.textContent.includes(%q))`, ch.Addr)))
		if err != nil {
			t.Fatal(err)
		}
		if !listed {
			t.Errorf("chunkserver %d (%s) is not on the dashboard", i, ch.Addr)
		}
	}
	shot(ctx, t, filepath.Join(out, "dashboard-healthy.png"))

	// A chunkd killed -9: down on the page, and stripes degraded.
	if err := c.KillChunkd(0); err != nil {
		t.Fatal(err)
	}
	waitPage(ctx, t, "a chunkserver down and degraded stripes",
		`document.querySelectorAll('#servers tbody td.down').length === 1 && Number(document.getElementById('st-degraded').textContent.replace(/,/g, '')) > 0 && document.getElementById('health').textContent === 'degraded'`)
	degraded, err := chromedp.Run(ctx, chromedp.Text("#st-degraded"))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("degraded stripes shown after a chunkd was killed: %s", degraded)
	// The graphs have points (samples every second).
	waitPage(ctx, t, "graphs drawn", `document.querySelectorAll('#g-health polyline').length === 2`)
	shot(ctx, t, filepath.Join(out, "dashboard-degraded.png"))

	mu.Lock()
	defer mu.Unlock()
	for _, p := range problems {
		t.Errorf("browser: %s", p)
	}
}

// waitPage waits until the JavaScript expression cond is true on the page.
func waitPage(ctx context.Context, t *testing.T, what, cond string) {
	t.Helper()
	if _, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](cond, chromedp.WithPollingTimeout(90*time.Second))); err != nil {
		body, _ := chromedp.Run(ctx, chromedp.Text("body"))
		t.Fatalf("dashboard: waiting for %s: %v\npage:\n%s", what, err, body)
	}
}

// shot saves a screenshot of the whole page to path.
func shot(ctx context.Context, t *testing.T, path string) {
	t.Helper()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", path)
}
