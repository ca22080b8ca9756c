package auth

import (
	"bytes"
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/internal/datakey"
)

const tokenSecret = "0123456789abcdef0123456789abcdef"

func TestTokenRoundTrip(t *testing.T) {
	id, _ := NewTokenID()
	in := Token{ID: id, Subdir: "/projects//a/", ReadOnly: true, SquashRoot: true, Name: "ci", Created: time.Unix(1000, 0).UTC()}
	s, err := IssueToken(tokenSecret, in)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "tok")
	os.WriteFile(file, []byte(s+"\n"), 0o600)
	mt, err := ReadTokenFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if mt.Claims.ID != id || mt.Claims.Subdir != "/projects/a" || !mt.Claims.ReadOnly || !mt.Claims.SquashRoot {
		t.Fatalf("claims read back %+v", mt.Claims)
	}
	if !bytes.Equal(mt.DataKey, datakey.ForToken([]byte(tokenSecret), id, true)) {
		t.Fatal("data key is not the one chunkd derives")
	}
	if strings.Contains(mt.Grant, base64.RawURLEncoding.EncodeToString(mt.DataKey)) {
		t.Fatal("the grant sent to meta carries the data key")
	}
	got, err := VerifyGrant(tokenSecret, mt.Grant)
	if err != nil || got.ID != id || got.Subdir != "/projects/a" {
		t.Fatalf("VerifyGrant: %+v %v", got, err)
	}
	if _, err := VerifyGrant("another secret entirely, 32 chars", mt.Grant); !errors.Is(err, ErrBadToken) {
		t.Fatalf("grant under another secret: %v", err)
	}
	os.Chmod(file, 0o644)
	if _, err := ReadTokenFile(file); err == nil {
		t.Fatal("read a token file others can read")
	}
}

// TestGrantTampering: any change to the claims, and claims this version does
// not understand or that lack an id or a clean subdirectory, are refused
// even with a valid MAC over them.
func TestGrantTampering(t *testing.T) {
	id, _ := NewTokenID()
	s, _ := IssueToken(tokenSecret, Token{ID: id, Subdir: "/a", ReadOnly: true})
	grant := strings.Join(strings.Split(s, ":")[:3], ":")
	parts := strings.Split(grant, ":")
	claims, _ := base64.RawURLEncoding.DecodeString(parts[1])
	widened := bytes.Replace(claims, []byte(`"readonly":true`), []byte(`"readonly":false`), 1)
	forged := parts[0] + ":" + base64.RawURLEncoding.EncodeToString(widened) + ":" + parts[2]
	if _, err := VerifyGrant(tokenSecret, forged); !errors.Is(err, ErrBadToken) {
		t.Fatalf("claims changed under the old MAC accepted: %v", err)
	}
	signed := func(json string) string {
		c := base64.RawURLEncoding.EncodeToString([]byte(json))
		return tokenPrefix + ":" + c + ":" + base64.RawURLEncoding.EncodeToString(grantMAC(tokenSecret, c))
	}
	for _, json := range []string{
		`{"id":"0102030405060708","subdir":"/a","future_restriction":true}`,
		`{"subdir":"/a"}`,
		`{"id":"01020304","subdir":"/a"}`,
		`{"id":"0102030405060708","subdir":"/a/../b"}`,
		`{"id":"0102030405060708","subdir":"a"}`,
	} {
		if _, err := VerifyGrant(tokenSecret, signed(json)); !errors.Is(err, ErrBadToken) {
			t.Errorf("claims %s accepted: %v", json, err)
		}
	}
	if _, err := VerifyGrant(tokenSecret, signed(`{"id":"0102030405060708","subdir":"/a"}`)); err != nil {
		t.Fatalf("well-formed claims refused: %v", err)
	}
}
