package auth

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"

	"github.com/spf13/pflag"

	"github.com/rdmafs/rdmafs/internal/private"
)

// TLSFiles names the PEM files of a process's TLS identity and of the
// certificate authority it trusts. The zero value means TLS off.
//
// A server (meta) needs Cert and Key; with CA it also verifies the
// certificates clients present, and with RequireClientCert refuses clients
// without one (mutual TLS). A client (mount, chunkd, admin commands) needs CA
// to verify the server, and presents Cert and Key when both are set.
type TLSFiles struct {
	Cert, Key, CA     string
	RequireClientCert bool
}

// Enabled reports whether any TLS file is named.
func (f TLSFiles) Enabled() bool { return f.Cert != "" || f.Key != "" || f.CA != "" }

// Register adds --tls-cert, --tls-key and --tls-ca to fs; server adds
// --tls-require-client-cert too.
func (f *TLSFiles) Register(fs *pflag.FlagSet, server bool) {
	if server {
		fs.StringVar(&f.Cert, "tls-cert", "", "serve TLS with this PEM certificate (chain); needs --tls-key (rdmafs certs makes them)")
		fs.StringVar(&f.Key, "tls-key", "", "the PEM private key of --tls-cert")
		fs.StringVar(&f.CA, "tls-ca", "", "verify client certificates against this PEM CA bundle when clients present one")
		fs.BoolVar(&f.RequireClientCert, "tls-require-client-cert", false, "refuse clients that present no certificate signed by --tls-ca (mutual TLS)")
		return
	}
	fs.StringVar(&f.CA, "tls-ca", "", "connect to meta over TLS, verifying its certificate against this PEM CA bundle (rdmafs certs makes them)")
	fs.StringVar(&f.Cert, "tls-cert", "", "present this PEM client certificate to meta (mutual TLS); needs --tls-key")
	fs.StringVar(&f.Key, "tls-key", "", "the PEM private key of --tls-cert")
}

// ServerConfig returns the TLS configuration of a server, or nil when f names
// no file (TLS off).
func (f TLSFiles) ServerConfig() (*tls.Config, error) {
	if !f.Enabled() {
		return nil, nil
	}
	if f.Cert == "" || f.Key == "" {
		return nil, errors.New("auth: TLS needs both --tls-cert and --tls-key on the server")
	}
	if err := private.CheckSecret(f.Key); err != nil {
		return nil, fmt.Errorf("auth: --tls-key: %w", err)
	}
	cert, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		return nil, fmt.Errorf("auth: load TLS certificate: %w", err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13}
	if f.CA != "" {
		if cfg.ClientCAs, err = loadCA(f.CA); err != nil {
			return nil, err
		}
		cfg.ClientAuth = tls.VerifyClientCertIfGiven
		if f.RequireClientCert {
			cfg.ClientAuth = tls.RequireAndVerifyClientCert
		}
	} else if f.RequireClientCert {
		return nil, errors.New("auth: --tls-require-client-cert needs --tls-ca to verify client certificates with")
	}
	return cfg, nil
}

// ClientConfig returns the TLS configuration of a client, or nil when f
// names no file (TLS off). The server's name is checked against the address
// dialled (an IP address must be among the certificate's IP addresses).
func (f TLSFiles) ClientConfig() (*tls.Config, error) {
	if !f.Enabled() {
		return nil, nil
	}
	if f.CA == "" {
		return nil, errors.New("auth: TLS needs --tls-ca to verify the metadata server's certificate")
	}
	roots, err := loadCA(f.CA)
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS13}
	switch {
	case f.Cert != "" && f.Key != "":
		if err := private.CheckSecret(f.Key); err != nil {
			return nil, fmt.Errorf("auth: --tls-key: %w", err)
		}
		cert, err := tls.LoadX509KeyPair(f.Cert, f.Key)
		if err != nil {
			return nil, fmt.Errorf("auth: load TLS client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	case f.Cert != "" || f.Key != "":
		return nil, errors.New("auth: a TLS client certificate needs both --tls-cert and --tls-key")
	}
	return cfg, nil
}

// loadCA reads a PEM bundle of CA certificates.
func loadCA(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("auth: read TLS CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("auth: TLS CA %s holds no PEM certificate", path)
	}
	return pool, nil
}
