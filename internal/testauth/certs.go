// Package testauth makes credentials for tests: a throwaway certificate authority with server
// and client certificates written to a test's temporary directory (so that TLS tests need no
// certificate files in the repository), bcrypt password hashes and nkey users.
package testauth

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Files are the PEM files Write produced.
type Files struct {
	CA         string // the authority's certificate
	ServerCert string // for localhost, 127.0.0.1 and ::1
	ServerKey  string
	ClientCert string // for client authentication, common name "jetgres-test-client"
	ClientKey  string
	OtherCA    string // an unrelated authority, which vouches for none of the above
}

// Write creates the files in a fresh temporary directory of t and returns their paths.
func Write(t testing.TB) Files {
	t.Helper()
	dir := t.TempDir()
	ca, caKey := authority(t, "jetgres test CA")
	other, _ := authority(t, "unrelated test CA")
	serverDER, serverKey := issue(t, ca, caKey, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "localhost"},
		DNSNames:    []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	clientDER, clientKey := issue(t, ca, caKey, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "jetgres-test-client"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	f := Files{
		CA:         filepath.Join(dir, "ca.pem"),
		ServerCert: filepath.Join(dir, "server.pem"),
		ServerKey:  filepath.Join(dir, "server-key.pem"),
		ClientCert: filepath.Join(dir, "client.pem"),
		ClientKey:  filepath.Join(dir, "client-key.pem"),
		OtherCA:    filepath.Join(dir, "other-ca.pem"),
	}
	writePEM(t, f.CA, "CERTIFICATE", ca.Raw)
	writePEM(t, f.OtherCA, "CERTIFICATE", other.Raw)
	writePEM(t, f.ServerCert, "CERTIFICATE", serverDER)
	writePEM(t, f.ServerKey, "EC PRIVATE KEY", marshalKey(t, serverKey))
	writePEM(t, f.ClientCert, "CERTIFICATE", clientDER)
	writePEM(t, f.ClientKey, "EC PRIVATE KEY", marshalKey(t, clientKey))
	return f
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("testcerts: generate key: %v", err)
	}
	return k
}

func serial(t testing.TB) *big.Int {
	t.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatalf("testcerts: serial number: %v", err)
	}
	return n
}

func authority(t testing.TB, name string) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          serial(t),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatalf("testcerts: create %s: %v", name, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatalf("testcerts: parse %s: %v", name, err)
	}
	return cert, key
}

func issue(t testing.TB, ca *x509.Certificate, caKey *ecdsa.PrivateKey, tmpl *x509.Certificate) ([]byte, *ecdsa.PrivateKey) {
	t.Helper()
	key := newKey(t)
	tmpl.SerialNumber = serial(t)
	tmpl.NotBefore = time.Now().Add(-time.Hour)
	tmpl.NotAfter = time.Now().Add(24 * time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatalf("testcerts: issue %s: %v", tmpl.Subject.CommonName, err)
	}
	return der, key
}

func marshalKey(t testing.TB, k *ecdsa.PrivateKey) []byte {
	t.Helper()
	b, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatalf("testcerts: marshal key: %v", err)
	}
	return b
}

func writePEM(t testing.TB, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatalf("testcerts: %v", err)
	}
}
