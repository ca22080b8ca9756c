package auth

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rdmafs/rdmafs/internal/private"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

func TestSecretFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "secret")
	s, err := GenerateSecretFile(path)
	if err != nil || len(s) != 64 {
		t.Fatalf("generate: %q %v", s, err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("secret file mode %v %v", fi.Mode(), err)
	}
	if _, err := GenerateSecretFile(path); err == nil {
		t.Fatal("overwrote an existing secret file")
	}
	got, err := ReadSecretFile(path)
	if err != nil || got != s {
		t.Fatalf("read %q %v", got, err)
	}
	short := filepath.Join(t.TempDir(), "short")
	os.WriteFile(short, []byte("abc\n"), 0o600)
	if _, err := ReadSecretFile(short); err == nil {
		t.Fatal("accepted a 3-character secret")
	}
	os.Chmod(path, 0o644)
	if _, err := ReadSecretFile(path); !errors.Is(err, private.ErrExposed) {
		t.Fatalf("read a world-readable secret file: %v", err)
	}
	if _, err := ReadSecretFile(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Fatal("read a missing file")
	}
}

func TestInterceptor(t *testing.T) {
	const secret = "0123456789abcdef0123"
	var logs bytes.Buffer
	rejected := map[string]int{}
	g := NewGuard(secret, slog.New(slog.NewTextHandler(&logs, nil)), func(r string) { rejected[r]++ })
	icpt := g.Unary()
	called := false
	h := func(ctx context.Context, req any) (any, error) { called = true; return "ok", nil }
	tests := []struct {
		name string
		md   metadata.MD
		want codes.Code
		msg  string
	}{
		{"no metadata", nil, codes.Unauthenticated, "missing cluster secret"},
		{"wrong", metadata.Pairs(MetadataKey, "x"), codes.Unauthenticated, "wrong cluster secret"},
		{"right", metadata.Pairs(MetadataKey, secret), codes.OK, ""},
	}
	for _, tt := range tests {
		called = false
		ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 9), Port: 4242}})
		if tt.md != nil {
			ctx = metadata.NewIncomingContext(ctx, tt.md)
		}
		_, err := icpt(ctx, nil, &grpc.UnaryServerInfo{FullMethod: "/m"}, h)
		if status.Code(err) != tt.want || (tt.msg != "" && !strings.Contains(err.Error(), tt.msg)) || called != (tt.want == codes.OK) {
			t.Errorf("%s: err %v called %v", tt.name, err, called)
		}
	}
	if rejected[RejectNoSecret] != 1 || rejected[RejectWrongSecret] != 1 {
		t.Errorf("rejections counted %v, want one of each", rejected)
	}
	if !strings.Contains(logs.String(), "reason=wrong_secret peer=127.0.0.9:4242 method=/m") {
		t.Errorf("refusal not logged with its peer:\n%s", logs.String())
	}
	md, _ := SecretCredentials(secret).GetRequestMetadata(context.Background())
	if md[MetadataKey] != secret {
		t.Fatalf("credentials send %v", md)
	}
}
