package auth

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// tlsServer serves gRPC's health service behind a Guard with the TLS files
// of c, counting refusals by reason.
func tlsServer(t *testing.T, files TLSFiles, secret string) (addr string, rejected func() map[string]int, logs *bytes.Buffer) {
	t.Helper()
	cfg, err := files.ServerConfig()
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	counts := map[string]int{}
	logs = &bytes.Buffer{}
	g := NewGuard(secret, slog.New(slog.NewTextHandler(&lockedWriter{w: logs, mu: &mu}, nil)), func(r string) {
		mu.Lock()
		counts[r]++
		mu.Unlock()
	})
	srv := grpc.NewServer(grpc.Creds(g.TLS(cfg)), grpc.UnaryInterceptor(g.Unary()))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return lis.Addr().String(), func() map[string]int {
		mu.Lock()
		defer mu.Unlock()
		out := map[string]int{}
		for k, v := range counts {
			out[k] = v
		}
		return out
	}, logs
}

type lockedWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

func check(addr string, creds credentials.TransportCredentials, secret string) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds), grpc.WithPerRPCCredentials(SecretCredentials(secret)))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	return err
}

func TestTLS(t *testing.T) {
	const secret = "0123456789abcdef0123"
	certs, err := GenerateCerts(t.TempDir(), []string{"127.0.0.1", "localhost"}, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := GenerateCerts(strings.TrimSuffix(certs.CA, "/ca.pem"), []string{"x"}, time.Now(), time.Hour); err == nil {
		t.Fatal("GenerateCerts overwrote existing certificates")
	}
	server := certs.Server()
	server.RequireClientCert = true
	addr, rejected, logs := tlsServer(t, server, secret)

	clientCfg, err := certs.Client().ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	if err := check(addr, credentials.NewTLS(clientCfg), secret); err != nil {
		t.Fatalf("mutual TLS with the right secret refused: %v", err)
	}
	if err := check(addr, credentials.NewTLS(clientCfg), "wrong-secret-0123456789"); err == nil {
		t.Fatal("wrong secret accepted over TLS")
	}
	if err := check(addr, insecure.NewCredentials(), secret); err == nil {
		t.Fatal("a client without TLS was served")
	}
	noCert := TLSFiles{CA: certs.CA}
	cfg, err := noCert.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	if err := check(addr, credentials.NewTLS(cfg), secret); err == nil {
		t.Fatal("a client without a certificate was served although client certificates are required")
	}
	// A CA of another cluster does not verify this server.
	other, err := GenerateCerts(t.TempDir(), []string{"127.0.0.1"}, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	otherCfg, _ := other.Client().ClientConfig()
	if err := check(addr, credentials.NewTLS(otherCfg), secret); err == nil {
		t.Fatal("a client trusting another CA accepted this server")
	}
	// The server sees a handshake fail after the client gave up on it:
	// wait for the count rather than read it at once.
	deadline := time.Now().Add(10 * time.Second)
	got := rejected()
	for (got[RejectWrongSecret] != 1 || got[RejectTLS] < 3) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
		got = rejected()
	}
	if got[RejectWrongSecret] != 1 || got[RejectTLS] < 3 {
		t.Fatalf("refusals counted %v, want 1 wrong secret and at least 3 failed handshakes", got)
	}
	if !strings.Contains(logs.String(), "TLS handshake refused") || !strings.Contains(logs.String(), "peer=127.0.0.1:") {
		t.Fatalf("failed handshakes not logged with their peer:\n%s", logs.String())
	}
}

func TestTLSFilesErrors(t *testing.T) {
	certs, err := GenerateCerts(t.TempDir(), []string{"127.0.0.1"}, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []TLSFiles{{Cert: certs.ServerCert}, {CA: certs.CA, RequireClientCert: true}} {
		if _, err := f.ServerConfig(); err == nil {
			t.Errorf("server config %+v accepted", f)
		}
	}
	for _, f := range []TLSFiles{{Cert: certs.ClientCert, Key: certs.ClientKey}, {CA: certs.CA, Cert: certs.ClientCert}, {CA: certs.ServerKey}} {
		if _, err := f.ClientConfig(); err == nil {
			t.Errorf("client config %+v accepted", f)
		}
	}
	if c, err := (TLSFiles{}).ServerConfig(); c != nil || err != nil {
		t.Errorf("no files: %v %v, want TLS off", c, err)
	}
}
