package testenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TLSFiles are the PEM files of a server started WithTLS, readable by the test process. Every
// certificate is made fresh for the server (ECDSA P-256, valid for a day) and never reused.
type TLSFiles struct {
	CAFile         string // the CA that signed the server's certificate and ClientCertFile; the server trusts it for client certificates
	ClientCertFile string // CN=postgres, signed by CAFile's CA
	ClientKeyFile  string
	// OtherCAFile is an unrelated CA: verifying the server against it must fail.
	OtherCAFile string
	// OtherClientCertFile (CN=postgres) is signed by OtherCAFile's CA, which the server does not trust.
	// A Go client never sends it: it only offers a certificate of a CA the server names.
	OtherClientCertFile, OtherClientKeyFile string

	ca  certKey // signs IssueClientCert's certificates
	dir string
	n   int
}

// IssueClientCert writes another client certificate signed by CAFile's CA, with the given common
// name, already expired when expired is set, and returns its certificate and key files.
func (f *TLSFiles) IssueClientCert(t testing.TB, cn string, expired bool) (certFile, keyFile string) {
	t.Helper()
	c, err := issue(&x509.Certificate{
		Subject:     pkix.Name{CommonName: cn},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, &f.ca)
	if err == nil && expired {
		// Reissue with a validity that ended an hour ago.
		tmpl := *c.cert
		tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-48*time.Hour), time.Now().Add(-time.Hour)
		c.der, err = x509.CreateCertificate(rand.Reader, &tmpl, f.ca.cert, &c.key.PublicKey, f.ca.key)
	}
	if err != nil {
		t.Fatalf("testenv: client certificate %s: %v", cn, err)
	}
	key, err := c.keyPEM()
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	f.n++
	certFile = filepath.Join(f.dir, fmt.Sprintf("issued-%d.crt", f.n))
	keyFile = filepath.Join(f.dir, fmt.Sprintf("issued-%d.key", f.n))
	if err := os.WriteFile(certFile, c.certPEM(), 0o600); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	if err := os.WriteFile(keyFile, key, 0o600); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return certFile, keyFile
}

// WithTLS starts the server with ssl = on and a server certificate (SAN IP 127.0.0.1 and DNS
// localhost) signed by a throwaway CA; the files are in Postgres.TLS. The server also trusts that CA
// for client certificates (ssl_ca_file), so pg_hba `cert` lines work.
//
// hba, when given, replaces pg_hba.conf's TCP rules: the file becomes `local all all trust`,
// `local replication all trust`, then these lines in order (e.g. `hostssl all all 127.0.0.1/32
// cert`, `hostnossl all all 0.0.0.0/0 reject`). Without hba, initdb's trust rules stay and TLS is
// offered but not required.
//
// Postgres.DSN (and DatabaseDSN, Pool, Exec) then connect with sslmode=verify-full, the CA and the
// CN=postgres client certificate, so the test's own connections pass any rules that let a verified,
// certified postgres in over TLS.
func WithTLS(hba ...string) PGOption {
	return func(o *pgOptions) {
		o.tls = true
		o.hba = append([]string(nil), hba...)
	}
}

// certKey is a certificate with its key.
type certKey struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	der  []byte
}

func (c certKey) certPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.der})
}

func (c certKey) keyPEM() ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(c.key)
	if err != nil {
		return nil, fmt.Errorf("marshal key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// issue makes a certificate from tmpl, signed by parent (self-signed when parent is nil).
func issue(tmpl *x509.Certificate, parent *certKey) (certKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return certKey{}, fmt.Errorf("generate key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return certKey{}, fmt.Errorf("serial: %w", err)
	}
	tmpl.SerialNumber = serial
	// An hour back tolerates a clock that differs a little between the cert's maker and its checker.
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour)
	signer, signerKey := tmpl, key
	if parent != nil {
		signer, signerKey = parent.cert, parent.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, &key.PublicKey, signerKey)
	if err != nil {
		return certKey{}, fmt.Errorf("create certificate %s: %w", tmpl.Subject.CommonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return certKey{}, fmt.Errorf("parse certificate %s: %w", tmpl.Subject.CommonName, err)
	}
	return certKey{cert: cert, key: key, der: der}, nil
}

func newCA(name string) (certKey, error) {
	return issue(&x509.Certificate{
		Subject:               pkix.Name{CommonName: name},
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}, nil)
}

func newClient(ca *certKey) (certKey, error) {
	return issue(&x509.Certificate{
		Subject:     pkix.Name{CommonName: "postgres"}, // cert auth maps the CN to the user
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, ca)
}

// setupTLS writes the server's certificate, key and CA into the data directory (0600, owned by the
// service user: PostgreSQL refuses a key others can read) and the client's files into dir, rewrites
// pg_hba.conf when hba is given, and returns the files and the postgresql.conf lines.
func setupTLS(dataDir, dir string, hba []string) (*TLSFiles, []string, error) {
	ca, err := newCA("pgrelay test ca")
	if err != nil {
		return nil, nil, err
	}
	other, err := newCA("pgrelay untrusted test ca")
	if err != nil {
		return nil, nil, err
	}
	server, err := issue(&x509.Certificate{
		Subject:     pkix.Name{CommonName: "localhost"},
		DNSNames:    []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}, &ca)
	if err != nil {
		return nil, nil, err
	}
	client, err := newClient(&ca)
	if err != nil {
		return nil, nil, err
	}
	otherClient, err := newClient(&other)
	if err != nil {
		return nil, nil, err
	}
	serverKey, err := server.keyPEM()
	if err != nil {
		return nil, nil, err
	}
	for name, data := range map[string][]byte{"server.crt": server.certPEM(), "server.key": serverKey, "ca.crt": ca.certPEM()} {
		if err := writeServerFile(filepath.Join(dataDir, name), data); err != nil {
			return nil, nil, err
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, nil, err
	}
	files := &TLSFiles{
		CAFile:              filepath.Join(dir, "ca.crt"),
		ClientCertFile:      filepath.Join(dir, "client.crt"),
		ClientKeyFile:       filepath.Join(dir, "client.key"),
		OtherCAFile:         filepath.Join(dir, "other-ca.crt"),
		OtherClientCertFile: filepath.Join(dir, "other-client.crt"),
		OtherClientKeyFile:  filepath.Join(dir, "other-client.key"),
		ca:                  ca,
		dir:                 dir,
	}
	clientKey, err := client.keyPEM()
	if err != nil {
		return nil, nil, err
	}
	otherKey, err := otherClient.keyPEM()
	if err != nil {
		return nil, nil, err
	}
	for path, data := range map[string][]byte{
		files.CAFile: ca.certPEM(), files.ClientCertFile: client.certPEM(), files.ClientKeyFile: clientKey,
		files.OtherCAFile: other.certPEM(), files.OtherClientCertFile: otherClient.certPEM(), files.OtherClientKeyFile: otherKey,
	} {
		// 0600: libpq refuses a client key others can read, and nothing here needs more.
		if err := os.WriteFile(path, data, 0o600); err != nil {
			return nil, nil, fmt.Errorf("write %s: %w", path, err)
		}
	}
	if len(hba) > 0 {
		lines := append([]string{"local all all trust", "local replication all trust"}, hba...)
		// The file already belongs to the service user (initdb made it); writing keeps its owner.
		if err := os.WriteFile(filepath.Join(dataDir, "pg_hba.conf"), []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
			return nil, nil, fmt.Errorf("write pg_hba.conf: %w", err)
		}
	}
	conf := []string{
		"ssl = on",
		"ssl_cert_file = 'server.crt'", // relative to the data directory
		"ssl_key_file = 'server.key'",
		"ssl_ca_file = 'ca.crt'",
	}
	return files, conf, nil
}

// writeServerFile writes a file the server reads: mode 0600, owned by the service user.
func writeServerFile(path string, data []byte) error {
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	cred, _, err := serviceUser()
	if err != nil {
		return err
	}
	if cred != nil {
		if err := os.Chown(path, int(cred.Uid), int(cred.Gid)); err != nil {
			return fmt.Errorf("chown %s: %w", path, err)
		}
	}
	return nil
}

// dsnParams are the DSN query parameters of the test's own connections to a WithTLS server.
func (f *TLSFiles) dsnParams() string {
	v := url.Values{}
	v.Set("sslmode", "verify-full")
	v.Set("sslrootcert", f.CAFile)
	v.Set("sslcert", f.ClientCertFile)
	v.Set("sslkey", f.ClientKeyFile)
	return v.Encode()
}

// startTLS is StartPostgres's TLS step.
func startTLS(t testing.TB, pg *Postgres, hba []string) []string {
	t.Helper()
	files, conf, err := setupTLS(pg.DataDir, filepath.Join(filepath.Dir(pg.DataDir), "tls"), hba)
	if err != nil {
		t.Fatalf("testenv: tls: %v", err)
	}
	pg.TLS = files
	return conf
}
