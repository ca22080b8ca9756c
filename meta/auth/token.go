package auth

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"strings"
	"time"

	"github.com/rdmafs/rdmafs/internal/datakey"
	"github.com/rdmafs/rdmafs/internal/private"
)

// A mount token restricts what a mount may do, the way an NFS export does:
// to a subdirectory, read-only, with root squashed. It is made offline from
// the cluster secret (IssueToken) and given to a mount instead of the
// secret. The mount presents its Grant to meta (TokenMetadataKey), which
// checks its MAC and enforces it, and authenticates to chunkd with the
// token's data key, which chunkd derives from the secret, the token's id and
// its read-only bit (DataKey), so that chunkd refuses writes of a read-only
// token without asking meta.

// TokenMetadataKey is the gRPC metadata key that carries a mount token's
// grant (its claims and MAC, never its data key).
const TokenMetadataKey = "rdmafs-token"

// tokenPrefix starts every token file's content and every grant.
const tokenPrefix = "rdmafs-token-1"

// TokenID names a mount token; in its claims it is 16 hex digits.
type TokenID [8]byte

// MarshalText implements encoding.TextMarshaler.
func (id TokenID) MarshalText() ([]byte, error) { return []byte(hex.EncodeToString(id[:])), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (id *TokenID) UnmarshalText(b []byte) error {
	if n, err := hex.Decode(id[:], b); err != nil || n != len(id) || len(b) != 2*len(id) {
		return fmt.Errorf("token id %q: want %d hex digits", b, 2*len(id))
	}
	return nil
}

// Token is what a mount token allows.
type Token struct {
	ID         TokenID   `json:"id"`
	Subdir     string    `json:"subdir"` // absolute, cleaned: "/" is the whole file system
	ReadOnly   bool      `json:"readonly,omitempty"`
	SquashRoot bool      `json:"squash_root,omitempty"`
	Name       string    `json:"name,omitempty"`
	Created    time.Time `json:"created"`
}

// Squashed are the uid and gid that root becomes on a root-squashed mount
// (nobody and nogroup).
const Squashed = 65534

// ErrBadToken is wrapped by the errors of a token that does not verify.
var ErrBadToken = errors.New("invalid mount token")

// NewTokenID returns a random token id.
func NewTokenID() (TokenID, error) {
	var id TokenID
	_, err := rand.Read(id[:])
	return id, err
}

// IssueToken returns the content of a token file for t under secret:
// "rdmafs-token-1:CLAIMS:MAC:DATAKEY" (base64url), to be kept like the
// secret (mode 0600). t.Subdir is cleaned and must be absolute.
func IssueToken(secret string, t Token) (string, error) {
	if !path.IsAbs(t.Subdir) {
		return "", fmt.Errorf("auth: token subdirectory %q is not an absolute path", t.Subdir)
	}
	t.Subdir = path.Clean(t.Subdir)
	claims, err := json.Marshal(t)
	if err != nil {
		return "", fmt.Errorf("auth: encode token: %w", err)
	}
	c := base64.RawURLEncoding.EncodeToString(claims)
	m := base64.RawURLEncoding.EncodeToString(grantMAC(secret, c))
	k := base64.RawURLEncoding.EncodeToString(datakey.ForToken([]byte(secret), t.ID, t.ReadOnly))
	return strings.Join([]string{tokenPrefix, c, m, k}, ":"), nil
}

func grantMAC(secret, claims string) []byte {
	h := hmac.New(sha256.New, []byte(secret))
	h.Write([]byte("rdmafs mount token grant\x00"))
	h.Write([]byte(claims))
	return h.Sum(nil)
}

// MountToken is a token file as a mount reads it: what it sends meta (Grant)
// and what it authenticates to chunkd with (DataKey), with the claims for
// its own use (unverified: only meta and chunkd can check them).
type MountToken struct {
	Grant   string
	DataKey []byte
	Claims  Token
}

// ReadTokenFile reads a token file written by `rdmafs admin token create`.
// Like a secret file, it is refused when its group or others may read it.
func ReadTokenFile(file string) (MountToken, error) {
	if err := private.CheckSecret(file); err != nil {
		return MountToken{}, fmt.Errorf("auth: %w", err)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return MountToken{}, fmt.Errorf("auth: read token file: %w", err)
	}
	parts := strings.Split(strings.TrimSpace(string(b)), ":")
	if len(parts) != 4 || parts[0] != tokenPrefix {
		return MountToken{}, fmt.Errorf("auth: %s: %w: not a %s token file", file, ErrBadToken, tokenPrefix)
	}
	t, err := decodeClaims(parts[1])
	if err != nil {
		return MountToken{}, fmt.Errorf("auth: %s: %w", file, err)
	}
	key, err := base64.RawURLEncoding.DecodeString(parts[3])
	if err != nil || len(key) != datakey.Size {
		return MountToken{}, fmt.Errorf("auth: %s: %w: bad data key", file, ErrBadToken)
	}
	return MountToken{Grant: strings.Join(parts[:3], ":"), DataKey: key, Claims: t}, nil
}

// VerifyGrant checks a grant (the first three fields of a token) against
// secret and returns its claims.
func VerifyGrant(secret, grant string) (Token, error) {
	parts := strings.Split(grant, ":")
	if len(parts) != 3 || parts[0] != tokenPrefix {
		return Token{}, fmt.Errorf("%w: malformed", ErrBadToken)
	}
	mac, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil || !hmac.Equal(mac, grantMAC(secret, parts[1])) {
		return Token{}, fmt.Errorf("%w: its MAC does not verify under this cluster's secret", ErrBadToken)
	}
	return decodeClaims(parts[1])
}

func decodeClaims(s string) (Token, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return Token{}, fmt.Errorf("%w: claims: %v", ErrBadToken, err)
	}
	// A claim this version does not know may be a restriction: refuse the
	// token rather than ignore it.
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var t Token
	if err := dec.Decode(&t); err != nil {
		return Token{}, fmt.Errorf("%w: claims: %v", ErrBadToken, err)
	}
	if t.ID == (TokenID{}) {
		return Token{}, fmt.Errorf("%w: no id", ErrBadToken)
	}
	if !path.IsAbs(t.Subdir) || path.Clean(t.Subdir) != t.Subdir {
		return Token{}, fmt.Errorf("%w: subdirectory %q", ErrBadToken, t.Subdir)
	}
	return t, nil
}
