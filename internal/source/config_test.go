package source

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
		pg    PGConfig
		check func(t *testing.T, host, user, pass, db string, port uint16, tlsOn bool, serverName string, verify bool)
	}{
		{"fields only, TLS off", PGConfig{Host: "127.0.0.1", Port: 5433, User: "u", Password: "p'w", Database: "d", TLSMode: "disable"},
			func(t *testing.T, host, user, pass, db string, port uint16, tlsOn bool, _ string, _ bool) {
				if host != "127.0.0.1" || port != 5433 || user != "u" || pass != "p'w" || db != "d" || tlsOn {
					t.Errorf("%s %d %s %s %s tls=%v", host, port, user, pass, db, tlsOn)
				}
			}},
		{"dsn with fields overriding", PGConfig{DSN: "postgres://a:b@h1:1111/x?sslmode=disable", User: "u2", Password: "p2", TLSMode: "prefer"},
			func(t *testing.T, host, user, pass, db string, port uint16, tlsOn bool, _ string, _ bool) {
				if host != "h1" || port != 1111 || user != "u2" || pass != "p2" || db != "x" || tlsOn {
					t.Errorf("%s %d %s %s %s tls=%v", host, port, user, pass, db, tlsOn)
				}
			}},
		{"verify-full with a root CA", PGConfig{Host: "db.internal", TLSMode: "verify-full", RootCAFile: ca},
			func(t *testing.T, _, _, _, _ string, _ uint16, tlsOn bool, serverName string, verify bool) {
				if !tlsOn || serverName != "db.internal" || !verify {
					t.Errorf("tls=%v serverName=%q verify=%v", tlsOn, serverName, verify)
				}
			}},
		{"require encrypts without verifying", PGConfig{Host: "db.internal", TLSMode: "require"},
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
	_, err := PGConfig{Host: "h", Password: "s3cret", TLSMode: "verify-full", RootCAFile: "/nonexistent"}.ConnConfig()
	if err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("error %v", err)
	}
}

func TestClusterSlotMatchesRedis(t *testing.T) {
	// Known slots from Redis' CLUSTER KEYSLOT.
	for tag, want := range map[string]uint16{"foo": 12182, "bar": 5061} {
		if got := clusterSlot(tag); got != want {
			t.Errorf("%s: slot %d, want %d", tag, got, want)
		}
	}
	c := Config{Tables: []Table{{Queue: "foo"}, {Queue: "bar"}}}
	c.Redis.ClusterURLs = []string{"redis://127.0.0.1:7000"}
	if err := c.checkClusterSlots(); err == nil || !strings.Contains(err.Error(), "cluster_slot") {
		t.Errorf("different slots accepted: %v", err)
	}
	c.Tables[1].Queue = "foo"
	if err := c.checkClusterSlots(); err != nil {
		t.Error(err)
	}
}
