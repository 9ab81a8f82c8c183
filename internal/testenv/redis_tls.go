package testenv

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
)

// RedisTLSFiles are the PEM files of a Redis started with StartRedisTLS, readable by the test
// process; made fresh for the server like TLSFiles.
type RedisTLSFiles struct {
	CAFile         string // signed the server's certificate and ClientCertFile
	ClientCertFile string // the server accepts only clients with a certificate of CAFile's CA
	ClientKeyFile  string
	OtherCAFile    string // an unrelated CA: verifying the server against it fails
}

// StartRedisTLS starts a redis-server that speaks only TLS (no plain port) with a certificate for
// 127.0.0.1 and localhost signed by a throwaway CA, and requires a client certificate of that CA.
// URL is then rediss://, and Client connects with the CA and the client certificate.
func StartRedisTLS(t testing.TB, extra ...string) *Redis {
	t.Helper()
	return startRedisOn(t, func(r *Redis) []string {
		return append([]string{"--port", "0", "--tls-port", fmt.Sprint(r.Port),
			"--tls-cert-file", filepath.Join(r.Dir, "server.crt"), "--tls-key-file", filepath.Join(r.Dir, "server.key"),
			"--tls-ca-cert-file", filepath.Join(r.Dir, "ca.crt"), "--tls-auth-clients", "yes"}, extra...)
	}, func(r *Redis) {
		files, err := setupRedisTLS(r.Dir, filepath.Join(tempDir(t, "redis-client"), "tls"))
		if err != nil {
			t.Fatalf("testenv: redis tls: %v", err)
		}
		r.TLS = files
		if r.tlsConf, err = files.ClientConfig(); err != nil {
			t.Fatalf("testenv: redis tls: %v", err)
		}
	})
}

// ClientConfig is a TLS configuration that trusts the server and presents the client certificate.
func (f *RedisTLSFiles) ClientConfig() (*tls.Config, error) {
	ca, err := os.ReadFile(f.CAFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("no certificate in %s", f.CAFile)
	}
	cert, err := tls.LoadX509KeyPair(f.ClientCertFile, f.ClientKeyFile)
	if err != nil {
		return nil, err
	}
	return &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}, nil
}

// setupRedisTLS writes the server's certificate, key and CA into dataDir (for the server) and the
// client's files into dir.
func setupRedisTLS(dataDir, dir string) (*RedisTLSFiles, error) {
	ca, err := newCA("pgrelay redis test ca")
	if err != nil {
		return nil, err
	}
	other, err := newCA("pgrelay untrusted redis test ca")
	if err != nil {
		return nil, err
	}
	server, err := issue(&x509.Certificate{
		DNSNames:    []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}, &ca)
	if err != nil {
		return nil, err
	}
	client, err := newClient(&ca)
	if err != nil {
		return nil, err
	}
	serverKey, err := server.keyPEM()
	if err != nil {
		return nil, err
	}
	for name, data := range map[string][]byte{"server.crt": server.certPEM(), "server.key": serverKey, "ca.crt": ca.certPEM()} {
		if err := writeServerFile(filepath.Join(dataDir, name), data); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	files := &RedisTLSFiles{CAFile: filepath.Join(dir, "ca.crt"), ClientCertFile: filepath.Join(dir, "client.crt"),
		ClientKeyFile: filepath.Join(dir, "client.key"), OtherCAFile: filepath.Join(dir, "other-ca.crt")}
	clientKey, err := client.keyPEM()
	if err != nil {
		return nil, err
	}
	for path, data := range map[string][]byte{files.CAFile: ca.certPEM(), files.ClientCertFile: client.certPEM(),
		files.ClientKeyFile: clientKey, files.OtherCAFile: other.certPEM()} {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			return nil, fmt.Errorf("write %s: %w", path, err)
		}
	}
	return files, nil
}
