package auth

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/rdmafs/rdmafs/internal/private"
)

// Certs names the files GenerateCerts writes in its directory.
type Certs struct {
	CA                    string // the CA certificate every process trusts
	CAKey                 string // the CA's key: keep it offline once certificates are made
	ServerCert, ServerKey string // meta's certificate (for every host given)
	ClientCert, ClientKey string // a client certificate for mutual TLS
}

// Server returns the TLS files of a meta server.
func (c Certs) Server() TLSFiles { return TLSFiles{Cert: c.ServerCert, Key: c.ServerKey, CA: c.CA} }

// Client returns the TLS files of a client (mount, chunkd, admin).
func (c Certs) Client() TLSFiles { return TLSFiles{Cert: c.ClientCert, Key: c.ClientKey, CA: c.CA} }

// CertsIn returns the names GenerateCerts uses in dir.
func CertsIn(dir string) Certs {
	p := func(name string) string { return filepath.Join(dir, name) }
	return Certs{CA: p("ca.pem"), CAKey: p("ca-key.pem"), ServerCert: p("meta.pem"), ServerKey: p("meta-key.pem"),
		ClientCert: p("client.pem"), ClientKey: p("client-key.pem")}
}

// GenerateCerts creates, in dir (made private if new), a certificate
// authority, a server certificate for meta valid for hosts (names or IP
// addresses) and a client certificate, all ECDSA P-256 and valid for
// validity from now. Keys are written 0600, and no existing file is
// overwritten: it fails if any of them exists.
func GenerateCerts(dir string, hosts []string, now time.Time, validity time.Duration) (Certs, error) {
	if len(hosts) == 0 {
		return Certs{}, errors.New("auth: certificates need at least one meta host name or address")
	}
	if err := private.MkdirAll(dir, nil); err != nil {
		return Certs{}, fmt.Errorf("auth: %w", err)
	}
	c := CertsIn(dir)
	for _, p := range []string{c.CA, c.CAKey, c.ServerCert, c.ServerKey, c.ClientCert, c.ClientKey} {
		if _, err := os.Lstat(p); err == nil {
			return Certs{}, fmt.Errorf("auth: %s exists: not overwriting certificates", p)
		}
	}
	notBefore, notAfter := now.Add(-time.Hour), now.Add(validity)
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Certs{}, fmt.Errorf("auth: CA key: %w", err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{Organization: []string{"rdmafs"}, CommonName: "rdmafs cluster CA"},
		NotBefore: notBefore, NotAfter: notAfter, IsCA: true, BasicConstraintsValid: true, MaxPathLenZero: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return Certs{}, fmt.Errorf("auth: CA certificate: %w", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return Certs{}, fmt.Errorf("auth: CA certificate: %w", err)
	}
	if err := writePEM(c.CA, "CERTIFICATE", caDER, 0o644); err != nil {
		return Certs{}, err
	}
	if err := writeKey(c.CAKey, caKey); err != nil {
		return Certs{}, err
	}
	leaf := func(certPath, keyPath, cn string, usage []x509.ExtKeyUsage, hosts []string) error {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return fmt.Errorf("auth: %s key: %w", cn, err)
		}
		tmpl := &x509.Certificate{
			SerialNumber: serial(), Subject: pkix.Name{Organization: []string{"rdmafs"}, CommonName: cn},
			NotBefore: notBefore, NotAfter: notAfter, KeyUsage: x509.KeyUsageDigitalSignature,
			ExtKeyUsage: usage,
		}
		for _, h := range hosts {
			if ip := net.ParseIP(h); ip != nil {
				tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
			} else {
				tmpl.DNSNames = append(tmpl.DNSNames, h)
			}
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return fmt.Errorf("auth: %s certificate: %w", cn, err)
		}
		if err := writePEM(certPath, "CERTIFICATE", der, 0o644); err != nil {
			return err
		}
		return writeKey(keyPath, key)
	}
	// The server certificate may authenticate clients too: etcd, given it
	// with client certificates required, connects to itself with it.
	serverUsage := []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	if err := leaf(c.ServerCert, c.ServerKey, "rdmafs meta", serverUsage, hosts); err != nil {
		return Certs{}, err
	}
	if err := leaf(c.ClientCert, c.ClientKey, "rdmafs client", []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, nil); err != nil {
		return Certs{}, err
	}
	return c, nil
}

// serial returns a random 128-bit certificate serial number.
func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	return n
}

func writeKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return fmt.Errorf("auth: encode key: %w", err)
	}
	return writePEM(path, "PRIVATE KEY", der, private.FileMode)
}

func writePEM(path, typ string, der []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return fmt.Errorf("auth: %w", err)
	}
	if err := pem.Encode(f, &pem.Block{Type: typ, Bytes: der}); err != nil {
		f.Close()
		return fmt.Errorf("auth: write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("auth: sync %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("auth: close %s: %w", path, err)
	}
	return nil
}
