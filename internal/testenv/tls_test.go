package testenv

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// TestStartPostgresWithTLS proves WithTLS: the server speaks TLS with a certificate that verifies
// (verify-full) against TLSFiles.CAFile for 127.0.0.1 and localhost, keeps its key 0600 and owned by
// the server's user, and applies the given pg_hba lines: DSN gets in (TLS, client certificate
// CN=postgres), while a plain connection, one without a client certificate, one with a certificate
// of the untrusted CA, one of another user (IssueClientCert), and one verifying against the
// untrusted CA are refused.
func TestStartPostgresWithTLS(t *testing.T) {
	pg := StartPostgres(t, WithTLS("hostssl all all 127.0.0.1/32 cert", "hostnossl all all 0.0.0.0/0 reject"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var ssl bool
	var dn string
	if err := pg.Pool().QueryRow(ctx, `SELECT ssl, client_dn FROM pg_stat_ssl WHERE pid = pg_backend_pid()`).Scan(&ssl, &dn); err != nil {
		t.Fatalf("read pg_stat_ssl: %v", err)
	}
	if !ssl || dn != "/CN=postgres" {
		t.Fatalf("DSN's connection: ssl=%v client_dn=%q, want TLS with /CN=postgres", ssl, dn)
	}
	st, err := os.Stat(filepath.Join(pg.DataDir, "server.key"))
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("server.key mode %v, want 0600", st.Mode().Perm())
	}
	if cred, _, _ := serviceUser(); cred != nil && st.Sys().(*syscall.Stat_t).Uid != cred.Uid {
		t.Errorf("server.key owned by uid %d, want the server's %d", st.Sys().(*syscall.Stat_t).Uid, cred.Uid)
	}
	connect := func(dsn string) error {
		conn, err := pgx.Connect(ctx, dsn)
		if err == nil {
			conn.Close(ctx)
		}
		return err
	}
	f := pg.TLS
	aliceCert, aliceKey := f.IssueClientCert(t, "alice", false)
	base := "postgres://postgres@127.0.0.1:" + strconv.Itoa(pg.Port) + "/postgres?"
	if err := connect("postgres://postgres@localhost:" + strconv.Itoa(pg.Port) + "/postgres?" + f.dsnParams()); err != nil {
		t.Errorf("verify-full to localhost: %v", err)
	}
	for _, c := range []struct {
		name, params, want string
	}{
		{"plain", "sslmode=disable", "no encryption"},
		{"no client certificate", "sslmode=verify-full&sslrootcert=" + f.CAFile, "requires a valid client certificate"},
		// Go offers no certificate the server's CA list does not name: the server sees none.
		{"client certificate of the untrusted CA", "sslmode=require&sslcert=" + f.OtherClientCertFile + "&sslkey=" + f.OtherClientKeyFile, "requires a valid client certificate"},
		{"client certificate of another user", "sslmode=require&sslcert=" + aliceCert + "&sslkey=" + aliceKey, "certificate authentication failed"},
		{"server verified against the untrusted CA", "sslmode=verify-full&sslrootcert=" + f.OtherCAFile + "&sslcert=" + f.ClientCertFile + "&sslkey=" + f.ClientKeyFile, "unknown authority"},
	} {
		err := connect(base + c.params)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one containing %q", c.name, err, c.want)
		}
		var pe *pgconn.PgError
		if c.name == "plain" && (!errors.As(err, &pe) || pe.Code != "28000") {
			t.Errorf("plain: %v is not SQLSTATE 28000", err)
		}
	}
}

// TestStartPostgresWithTLSKeepsTrustWithoutHBA proves WithTLS without hba lines offers TLS but
// keeps initdb's trust rules: both a TLS connection without a client certificate and a plain one get in.
func TestStartPostgresWithTLSKeepsTrustWithoutHBA(t *testing.T) {
	pg := StartPostgres(t, WithTLS())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for params, wantSSL := range map[string]bool{"sslmode=require": true, "sslmode=disable": false} {
		conn, err := pgx.Connect(ctx, "postgres://postgres@127.0.0.1:"+strconv.Itoa(pg.Port)+"/postgres?"+params)
		if err != nil {
			t.Fatalf("%s: %v", params, err)
		}
		var ssl bool
		err = conn.QueryRow(ctx, `SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()`).Scan(&ssl)
		conn.Close(ctx)
		if err != nil || ssl != wantSSL {
			t.Errorf("%s: ssl=%v (%v), want %v", params, ssl, err, wantSSL)
		}
	}
}
