package pgconnect

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/rawio"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// writeCA writes a self-signed CA certificate and returns its path.
func writeCA(t *testing.T) string {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test ca"},
		NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "ca.pem")
	os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	return path
}

func TestConnConfigFieldsAndTLS(t *testing.T) {
	ca := writeCA(t)
	for _, c := range []struct {
		name  string
		pg    Config
		check func(t *testing.T, host, user, pass, db string, port uint16, tlsOn bool, serverName string, verify bool)
	}{
		{"fields only, TLS off", Config{Host: "127.0.0.1", Port: 5433, User: "u", Password: "p'w", Database: "d", TLSMode: "disable"},
			func(t *testing.T, host, user, pass, db string, port uint16, tlsOn bool, _ string, _ bool) {
				if host != "127.0.0.1" || port != 5433 || user != "u" || pass != "p'w" || db != "d" || tlsOn {
					t.Errorf("%s %d %s %s %s tls=%v", host, port, user, pass, db, tlsOn)
				}
			}},
		{"dsn with fields overriding", Config{DSN: "postgres://a:b@h1:1111/x?sslmode=disable", User: "u2", Password: "p2"},
			func(t *testing.T, host, user, pass, db string, port uint16, tlsOn bool, _ string, _ bool) {
				if host != "h1" || port != 1111 || user != "u2" || pass != "p2" || db != "x" || tlsOn {
					t.Errorf("%s %d %s %s %s tls=%v", host, port, user, pass, db, tlsOn)
				}
			}},
		{"verify-full with a root CA", Config{Host: "db.internal", TLSMode: "verify-full", RootCAFile: ca},
			func(t *testing.T, _, _, _, _ string, _ uint16, tlsOn bool, serverName string, verify bool) {
				if !tlsOn || serverName != "db.internal" || !verify {
					t.Errorf("tls=%v serverName=%q verify=%v", tlsOn, serverName, verify)
				}
			}},
		{"require encrypts without verifying", Config{Host: "db.internal", TLSMode: "require"},
			func(t *testing.T, _, _, _, _ string, _ uint16, tlsOn bool, _ string, verify bool) {
				if !tlsOn || verify {
					t.Errorf("tls=%v verify=%v", tlsOn, verify)
				}
			}},
	} {
		cfg, err := c.pg.ConnConfig()
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		tlsOn := cfg.TLSConfig != nil
		serverName, verify := "", false
		if tlsOn {
			serverName, verify = cfg.TLSConfig.ServerName, !cfg.TLSConfig.InsecureSkipVerify
		}
		t.Run(c.name, func(t *testing.T) {
			c.check(t, cfg.Host, cfg.User, cfg.Password, cfg.Database, cfg.Port, tlsOn, serverName, verify)
			if cfg.RuntimeParams["TimeZone"] != "UTC" || cfg.RuntimeParams["extra_float_digits"] != "3" {
				t.Errorf("session settings missing: %v", cfg.RuntimeParams)
			}
		})
	}
}

func TestConnConfigErrorHidesThePassword(t *testing.T) {
	_, err := Config{Host: "h", Password: "s3cret", TLSMode: "verify-full", RootCAFile: "/nonexistent"}.ConnConfig()
	if err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("error %v", err)
	}
}

func TestPoolConfigMergesFields(t *testing.T) {
	cases := []struct {
		name           string
		c              Config
		host, user, db string
		port           uint16
		password       string
		tls            bool
	}{
		{"fields only", Config{Host: "127.0.0.1", Port: 5433, User: "u", Password: "p'w", Database: "d", TLSMode: "disable"}, "127.0.0.1", "u", "d", 5433, "p'w", false},
		{"URL with fields overriding", Config{DSN: "postgres://a@h1:1/x?sslmode=disable", User: "b", Database: "y z"}, "h1", "b", "y z", 1, "", false},
		{"key=value DSN with password field", Config{DSN: "host=h2 port=2 user=c dbname=w sslmode=disable", Password: "s3cret"}, "h2", "c", "w", 2, "s3cret", false},
		{"tls require", Config{DSN: "host=h3 user=c", TLSMode: "require"}, "h3", "c", "", 5432, "", true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pc, err := c.c.PoolConfig(4)
			if err != nil {
				t.Fatal(err)
			}
			cc := pc.ConnConfig
			if cc.Host != c.host || cc.User != c.user || cc.Port != c.port || cc.Password != c.password || (c.db != "" && cc.Database != c.db) {
				t.Fatalf("got host=%s port=%d user=%s db=%s password=%q", cc.Host, cc.Port, cc.User, cc.Database, cc.Password)
			}
			if (cc.TLSConfig != nil) != c.tls {
				t.Fatalf("tls config %v", cc.TLSConfig)
			}
			if cc.RuntimeParams["TimeZone"] != "UTC" || cc.RuntimeParams["DateStyle"] != "ISO" || pc.MaxConns != 4 {
				t.Fatalf("session settings %v", cc.RuntimeParams)
			}
		})
	}
	_, err := Config{DSN: "postgres://u:hunter2@h/db?sslmode=bogus"}.PoolConfig(0)
	if err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("bad dsn error %v (must not show the password)", err)
	}
}

func TestValidateNamesTheField(t *testing.T) {
	cases := []struct {
		c    Config
		path string
	}{
		{Config{Host: "h", TLSMode: "sometimes"}, "tls.mode:"},
		{Config{Host: "h", TLSMode: "require", RootCAFile: "/ca"}, "tls.root_ca_file:"},
		{Config{Host: "h", CertFile: "/c"}, "tls.client_cert_file:"},
		{Config{}, "dsn:"},
		{Config{Host: "h", Port: 70000}, "port:"},
		{Config{DSN: "postgres://u:pw@h/db?sslmode=bogus"}, "dsn:"},
	}
	for _, c := range cases {
		err := c.c.Validate()
		if !errcode.Is(err, errcode.PGConfig) || !strings.HasPrefix(err.Error(), "pg_config: "+c.path) || !strings.Contains(err.Error(), ". Fix: ") {
			t.Errorf("%+v: error %v, want pg_config, the field %q and a fix", c.c, err, c.path)
		}
	}
	if err := (Config{Host: "127.0.0.1"}).Validate(); err != nil {
		t.Fatal(err)
	}
}

// Connections from ConnConfig (and so ReplicationConfig and PoolConfig) read and write without the
// runtime's system call bookkeeping (rawio); TLS, if any, runs over that socket.
func TestConnConfigDialsRawIO(t *testing.T) {
	cfg, err := Config{DSN: "postgres://u@127.0.0.1/db"}.ConnConfig()
	if err != nil {
		t.Fatal(err)
	}
	c, _ := testenv.SocketPair(t, "tcp", cfg.DialFunc)
	if !rawio.Wrapped(c) {
		t.Fatalf("ConnConfig's dialer made a %T, not rawio's", c)
	}
}
