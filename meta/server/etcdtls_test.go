package server_test

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/meta/auth"
	"github.com/rdmafs/rdmafs/meta/client"
	"github.com/rdmafs/rdmafs/meta/core"
	"github.com/rdmafs/rdmafs/meta/kv/etcdkv/etcdproc"
	"github.com/rdmafs/rdmafs/meta/metapb"
	"github.com/rdmafs/rdmafs/meta/server"
)

// TestEtcdTLS runs meta on an etcd that requires TLS with client
// certificates: format and serve through a URL naming the CA and the client
// certificate work; the same URL without them is refused by etcd, with an
// error that says the store could not be reached.
func TestEtcdTLS(t *testing.T) {
	certs, err := auth.GenerateCerts(t.TempDir(), []string{"127.0.0.1"}, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	etcd, err := etcdproc.Start(ctx, etcdproc.Options{TLS: &certs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { etcd.Stop() })
	url := etcd.URL("tls")
	if !strings.Contains(url, "?cacert=") {
		t.Fatalf("URL of a TLS etcd names no CA: %s", url)
	}
	plain := "etcd://" + etcd.Endpoint() + "/tls"
	if _, err := server.FormatStore(ctx, "", plain, t.TempDir()+"/s0", core.StandardLayout()); err == nil {
		t.Fatal("formatted through a plaintext connection to an etcd that requires TLS")
	}
	secretFile := t.TempDir() + "/secret"
	if _, err := server.FormatStore(ctx, "", url, secretFile, core.StandardLayout()); err != nil {
		t.Fatal(err)
	}
	secret, err := auth.ReadSecretFile(secretFile)
	if err != nil {
		t.Fatal(err)
	}
	s, err := server.Start(ctx, server.Config{KV: url, Listen: "127.0.0.1:0", Secret: secret, ElectionTTL: time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Stop(context.Background()) })
	c, err := client.Dial(s.Addr(), secret)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The server serves once elected, over the TLS connection to etcd.
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, err := c.Mkdir(ctx, &metapb.MkdirRequest{Parent: core.RootIno, Name: "over-tls", Mode: 0o755})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("mkdir on meta over etcd with TLS: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
