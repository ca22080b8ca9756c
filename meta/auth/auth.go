// Package auth implements the control plane's authentication: the cluster
// secret (generating and reading the secret file, attaching it to outgoing
// gRPC calls, refusing and auditing incoming calls without it) and TLS (the
// certificate files of servers and clients, and a generator of them for a
// cluster).
package auth

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/rdmafs/rdmafs/internal/private"
)

// MetadataKey is the gRPC metadata key that carries the cluster secret.
const MetadataKey = "rdmafs-secret"

// GenerateSecretFile writes a new random secret (256 bits, hex) to path with
// mode 0600. It refuses to overwrite an existing file.
func GenerateSecretFile(path string) (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("auth: generate secret: %w", err)
	}
	secret := hex.EncodeToString(b[:])
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return "", fmt.Errorf("auth: create directory of %s: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", fmt.Errorf("auth: create secret file: %w", err)
	}
	if _, err := f.WriteString(secret + "\n"); err != nil {
		f.Close()
		return "", fmt.Errorf("auth: write secret file %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return "", fmt.Errorf("auth: sync secret file %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return "", fmt.Errorf("auth: close secret file %s: %w", path, err)
	}
	return secret, nil
}

// ReadSecretFile reads a secret written by GenerateSecretFile. It refuses a
// file that its group or others may access (private.ErrExposed), as ssh
// refuses such keys: whoever can read the secret can read every file.
func ReadSecretFile(path string) (string, error) {
	if err := private.CheckSecret(path); err != nil {
		return "", fmt.Errorf("auth: %w", err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("auth: read secret file: %w", err)
	}
	secret := strings.TrimSpace(string(b))
	if len(secret) < 16 {
		return "", fmt.Errorf("auth: secret file %s holds no usable secret (at least 16 characters)", path)
	}
	return secret, nil
}

// Credentials attach the cluster secret (SecretCredentials) or a mount
// token's grant (TokenCredentials) to every outgoing call; use them with
// grpc.WithPerRPCCredentials.
type Credentials struct {
	key, value string
}

// SecretCredentials returns the credentials of a holder of the secret.
func SecretCredentials(secret string) Credentials { return Credentials{MetadataKey, secret} }

// TokenCredentials returns the credentials of a mount token's holder: its
// grant (MountToken.Grant), never its data key.
func TokenCredentials(grant string) Credentials { return Credentials{TokenMetadataKey, grant} }

// GetRequestMetadata implements credentials.PerRPCCredentials.
func (c Credentials) GetRequestMetadata(ctx context.Context, uri ...string) (map[string]string, error) {
	return map[string]string{c.key: c.value}, nil
}

// RequireTransportSecurity implements credentials.PerRPCCredentials. The
// secret or grant is sent in clear without TLS: acceptable only on a trusted
// network (see docs/security.md).
func (c Credentials) RequireTransportSecurity() bool { return false }
