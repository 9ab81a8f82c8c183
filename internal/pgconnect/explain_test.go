package pgconnect

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgrelay/pgrelay/internal/cdctest"
	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// TestExplainTLSAndHBAFailuresOfARealServer connects with each tls setting a user can get wrong to
// a real PostgreSQL whose pg_hba.conf wants TLS with a client certificate (and to one without TLS),
// and proves Explain gives each refusal its code and the fix naming the field to change, while the
// right settings (verify-full, verify-ca under another host name, require) connect.
func TestExplainTLSAndHBAFailuresOfARealServer(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.WithTLS("hostssl all all 127.0.0.1/32 cert", "hostnossl all all 0.0.0.0/0 reject"))
	plain := testenv.StartPostgres(t)
	f := pg.TLS
	expiredCert, expiredKey := f.IssueClientCert(t, "postgres", true)
	aliceCert, aliceKey := f.IssueClientCert(t, "alice", false)
	certified := Config{Host: "127.0.0.1", Port: pg.Port, User: "postgres", Database: "postgres",
		TLSMode: "verify-full", RootCAFile: f.CAFile, CertFile: f.ClientCertFile, KeyFile: f.ClientKeyFile}
	with := func(change func(*Config)) Config {
		c := certified
		change(&c)
		return c
	}
	for _, c := range []struct {
		name      string
		conf      Config
		otherHost bool         // connect as db.example (resolved to 127.0.0.1), a name the certificate lacks
		tls12     bool         // the server's alert must arrive inside the handshake (see below)
		code      errcode.Code // "" when the connection must succeed
		fix       string
	}{
		{name: "verify-full, the CA, the client certificate", conf: certified},
		{name: "require with the client certificate", conf: with(func(c *Config) { c.TLSMode, c.RootCAFile = "require", "" })},
		{name: "verify-ca skips the host name", conf: with(func(c *Config) { c.TLSMode = "verify-ca" }), otherHost: true},
		{name: "verify-full under another host name", conf: certified, otherHost: true, code: errcode.PGTLS, fix: "or use tls.mode verify-ca"},
		{name: "untrusted CA", conf: with(func(c *Config) { c.RootCAFile = f.OtherCAFile }), code: errcode.PGTLS, fix: "set tls.root_ca_file"},
		{name: "no client certificate", conf: with(func(c *Config) { c.CertFile, c.KeyFile = "", "" }), code: errcode.PGTLS, fix: "set tls.client_cert_file"},
		{name: "client certificate of an untrusted CA", conf: with(func(c *Config) { c.CertFile, c.KeyFile = f.OtherClientCertFile, f.OtherClientKeyFile }), code: errcode.PGTLS, fix: "signed by a CA in the server's ssl_ca_file"},
		{name: "expired client certificate", conf: with(func(c *Config) { c.CertFile, c.KeyFile = expiredCert, expiredKey }), code: errcode.PGTLS, fix: "valid, unexpired certificate", tls12: true},
		{name: "client certificate of another user", conf: with(func(c *Config) { c.CertFile, c.KeyFile = aliceCert, aliceKey }), code: errcode.PGTLS, fix: "CN is the user name"},
		{name: "TLS off against a TLS-only pg_hba.conf", conf: Config{Host: "127.0.0.1", Port: pg.Port, User: "postgres", TLSMode: "disable"}, code: errcode.PGHBA, fix: "set tls.mode to require"},
		{name: "require against a server without TLS", conf: Config{Host: "127.0.0.1", Port: plain.Port, User: "postgres", TLSMode: "require"}, code: errcode.PGTLS, fix: "turn ssl on"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.otherHost {
				c.conf.Host = "db.example"
			}
			cfg, err := c.conf.ConnConfig()
			if err != nil {
				t.Fatal(err)
			}
			cfg.LookupFunc = func(ctx context.Context, host string) ([]string, error) {
				if host == "db.example" {
					return []string{"127.0.0.1"}, nil
				}
				return net.DefaultResolver.LookupHost(ctx, host)
			}
			if c.tls12 {
				// Under TLS 1.3 the server checks the client certificate after the client's handshake
				// is done, so about one attempt in twenty writes the startup message into a reset
				// connection before reading the alert (then nothing tells it is TLS's doing); TLS 1.2
				// checks it inside the handshake, and the alert always arrives.
				cfg.TLSConfig.MaxVersion = tls.VersionTLS12
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			conn, err := pgconn.ConnectConfig(ctx, cfg)
			if err == nil {
				// Read back what the server saw: a TLS session, with the client certificate.
				res, qerr := conn.Exec(ctx, `SELECT ssl, coalesce(client_dn, '') FROM pg_stat_ssl WHERE pid = pg_backend_pid()`).ReadAll()
				conn.Close(ctx)
				if qerr != nil {
					t.Fatal(qerr)
				}
				if row := res[0].Rows[0]; string(row[0]) != "t" || string(row[1]) != "/CN=postgres" {
					t.Errorf("server saw ssl=%s client_dn=%q", row[0], row[1])
				}
			}
			err = Explain(err)
			switch {
			case c.code == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case c.code == "":
			case errcode.Of(err) != c.code || !strings.Contains(err.Error(), "Fix: ") || !strings.Contains(err.Error(), c.fix):
				t.Errorf("got %v, want code %s and a fix containing %q", err, c.code, c.fix)
			default:
				t.Logf("%v", err)
			}
		})
	}
}

// TestExplainTLSLeavesOtherErrorsAlone proves Explain passes nil, coded and unrelated errors
// through unchanged, and keeps the cause reachable with errors.As.
func TestExplainTLSLeavesOtherErrorsAlone(t *testing.T) {
	coded := errcode.New(errcode.Version, "old", "upgrade")
	other := &pgconn.PgError{Code: "42P01", Message: `relation "x" does not exist`}
	for _, err := range []error{nil, coded, other, errors.New("dial tcp: connection refused")} {
		if got := Explain(err); got != err {
			t.Errorf("%v became %v", err, got)
		}
	}
	hba := &pgconn.PgError{Code: "28000", Message: `pg_hba.conf rejects connection for host "10.0.0.1", user "u", database "d", SSL encryption`}
	got := Explain(fmt.Errorf("connect: %w", hba))
	var pe *pgconn.PgError
	if errcode.Of(got) != errcode.PGHBA || !strings.Contains(got.Error(), "add a hostssl line") || !errors.As(got, &pe) {
		t.Errorf("SSL-encryption reject: %v", got)
	}
}

// TestExplainPrivilegeRefusalsOfARealServer connects as roles that each lack one thing a pgrelay
// connection needs and proves Explain codes each refusal with the statement that fixes it, naming
// the role and the database: LOGIN, CONNECT on the database (pg_login) and, for the replication
// connection of pg_cdc, the REPLICATION attribute (source_privileges); with the fix applied the
// same connection succeeds.
func TestExplainPrivilegeRefusalsOfARealServer(t *testing.T) {
	pg := testenv.StartPostgres(t)
	pg.Exec(`REVOKE CONNECT ON DATABASE postgres FROM PUBLIC`)
	pg.CreateRole("nologin", "", `GRANT CONNECT ON DATABASE postgres TO %s`)
	pg.CreateRole("noconnect", "LOGIN")
	pg.CreateRole("norepl", "LOGIN", `GRANT CONNECT ON DATABASE postgres TO %s`)
	for _, c := range []struct {
		user        string
		replication bool
		code        errcode.Code
		fix         string
	}{
		{"nologin", false, errcode.PGLogin, `ALTER ROLE "nologin" LOGIN`},
		{"noconnect", false, errcode.PGLogin, `GRANT CONNECT ON DATABASE "postgres" TO "noconnect"`},
		{"norepl", true, errcode.SourcePrivileges, `ALTER ROLE "norepl" REPLICATION`},
	} {
		t.Run(c.user, func(t *testing.T) {
			conf := Config{DSN: pg.UserDSN(c.user, "postgres")}
			connect := func() error {
				cfg, err := conf.ConnConfig()
				if c.replication {
					cfg, err = conf.ReplicationConfig()
				}
				if err != nil {
					t.Fatal(err)
				}
				conn, err := pgconn.ConnectConfig(context.Background(), cfg)
				if err == nil {
					conn.Close(context.Background())
				}
				return err
			}
			err := Explain(connect())
			if errcode.Of(err) != c.code || !strings.Contains(err.Error(), "Fix: "+c.fix) {
				t.Fatalf("got %v, want code %s and the fix %q", err, c.code, c.fix)
			}
			pg.Exec(c.fix)
			if err := connect(); err != nil {
				t.Fatalf("after %s: %v", c.fix, err)
			}
		})
	}
}

// TestExplainConnectionFailuresOfARealServer connects with the settings a user most often gets
// wrong, to a PostgreSQL that wants passwords, and proves Explain codes each failure with its
// address, role or database and never prints the password: a port nothing listens on and a host
// name that does not resolve (pg_unreachable, transient: retried), a wrong password and none
// (pg_password), a database that does not exist (pg_database); the right settings connect, and a
// connection canceled by its caller stays uncoded.
func TestExplainConnectionFailuresOfARealServer(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.WithTLS("host all postgres 127.0.0.1/32 trust", "host all all 127.0.0.1/32 scram-sha-256"))
	pg.Exec(`CREATE ROLE pw LOGIN PASSWORD 'right-one'`)
	closed := func() int { // a port nothing listens on
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		return l.Addr().(*net.TCPAddr).Port
	}()
	good := Config{Host: "127.0.0.1", Port: pg.Port, User: "pw", Password: "right-one", Database: "postgres", TLSMode: "disable",
		ConnectTimeout: 5 * time.Second}
	with := func(change func(*Config)) Config {
		c := good
		change(&c)
		return c
	}
	for _, c := range []struct {
		name string
		conf Config
		code errcode.Code // "" when the connection must succeed
		want string       // in the error's text
	}{
		{"right", good, "", ""},
		{"nothing listens", with(func(c *Config) { c.Port = closed }), errcode.PGUnreachable, fmt.Sprintf("does not answer at 127.0.0.1:%d", closed)},
		{"no such host", with(func(c *Config) { c.Host = "no-such-host.invalid" }), errcode.PGUnreachable, "does not answer at no-such-host.invalid:"},
		// TLS first, then without (pgx: one line per attempt): one line, the refusal told once
		{"nothing listens, tls prefer", with(func(c *Config) { c.Port, c.TLSMode = closed, "prefer" }), errcode.PGUnreachable, fmt.Sprintf("does not answer at 127.0.0.1:%d", closed)},
		{"wrong password", with(func(c *Config) { c.Password = "wrong-one" }), errcode.PGPassword, "refused the password of role pw"},
		{"no password", with(func(c *Config) { c.Password = "" }), errcode.PGPassword, "password: ${PGPASSWORD}"},
		{"no such database", with(func(c *Config) { c.Database = "nodb" }), errcode.PGDatabase, `CREATE DATABASE "nodb"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := c.conf.ConnConfig()
			if err != nil {
				t.Fatal(err)
			}
			conn, err := pgconn.ConnectConfig(context.Background(), cfg)
			if err == nil {
				conn.Close(context.Background())
			}
			err = Explain(err)
			switch {
			case c.code == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case c.code == "":
			case errcode.Of(err) != c.code || !strings.Contains(err.Error(), "Fix: ") || !strings.Contains(err.Error(), c.want):
				t.Errorf("got %v, want code %s and %q", err, c.code, c.want)
			case strings.Contains(err.Error(), "-one"):
				t.Errorf("the password is in %v", err)
			case strings.Contains(err.Error(), "\n") || strings.Count(err.Error(), "connection refused") > 1:
				t.Errorf("not one line, or a repeated attempt: %q", err)
			default:
				t.Logf("%v", err)
			}
			if c.code != "" && c.code.Transient() != (c.code == errcode.PGUnreachable) {
				t.Errorf("%s: Transient %v", c.code, c.code.Transient())
			}
		})
	}
	t.Run("canceled by the caller", func(t *testing.T) {
		cfg, err := with(func(c *Config) { c.Port = closed }).ConnConfig()
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, err = pgconn.ConnectConfig(ctx, cfg)
		if err == nil || errcode.Of(Explain(err)) != "" {
			t.Errorf("a canceled connection: %v", Explain(err))
		}
	})
}

// TestExplainLimitsOfARealServer fills a server's one WAL sender and one replication slot and
// proves the next replication connection and the next slot are refused as pg_limit, naming the
// setting; with the first connection closed and the slot dropped, both succeed.
func TestExplainLimitsOfARealServer(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.WithPGSetting("max_wal_senders = 1"), testenv.WithPGSetting("max_replication_slots = 1"))
	ctx := context.Background()
	conf := Config{DSN: pg.DSN()}
	replicate := func() (*pgconn.PgConn, error) {
		cfg, err := conf.ReplicationConfig()
		if err != nil {
			t.Fatal(err)
		}
		return pgconn.ConnectConfig(ctx, cfg)
	}
	first, err := replicate()
	if err != nil {
		t.Fatal(err)
	}
	second, err := replicate()
	if err == nil {
		second.Close(ctx)
		t.Fatal("a second replication connection with max_wal_senders = 1")
	}
	if err := Explain(err); errcode.Of(err) != errcode.PGLimit || !strings.Contains(err.Error(), "raise max_wal_senders") {
		t.Errorf("second WAL sender: %v", err)
	}
	first.Close(ctx)
	cdctest.WaitEvery(t, 10*time.Second, 50*time.Millisecond, "the WAL sender to end", func() (bool, string) {
		c, err := replicate()
		if err == nil {
			c.Close(ctx)
		}
		return err == nil, fmt.Sprint(err)
	})

	pg.Exec(`SELECT pg_create_logical_replication_slot('one', 'pgoutput')`)
	_, err = pg.Pool().Exec(ctx, `SELECT pg_create_logical_replication_slot('two', 'pgoutput')`)
	if err := Explain(err); errcode.Of(err) != errcode.PGLimit || !strings.Contains(err.Error(), "raise max_replication_slots") {
		t.Errorf("second slot: %v", err)
	}
	pg.Exec(`SELECT pg_drop_replication_slot('one')`)
	pg.Exec(`SELECT pg_create_logical_replication_slot('two', 'pgoutput')`)
}

// TestReadOnlyServers: a standby and a database whose sessions are read-only take no writes, and
// both CheckWritable and Explain of a refused write say pg_read_only with the fix naming the
// primary; the primary's own database passes.
func TestReadOnlyServers(t *testing.T) {
	pg := testenv.StartPostgres(t)
	pg.CreateDatabase("ro")
	pg.Exec(`ALTER DATABASE ro SET default_transaction_read_only = on`)
	standby := testenv.StartStandby(t, pg)
	ctx := context.Background()
	for _, c := range []struct {
		name     string
		dsn      string
		readOnly bool
	}{
		{"primary", pg.DSN(), false},
		{"read-only database", pg.DatabaseDSN("ro"), true},
		{"standby", standby.DSN(), true},
	} {
		t.Run(c.name, func(t *testing.T) {
			conn, err := pgx.Connect(ctx, c.dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			err = CheckWritable(ctx, conn)
			if !c.readOnly {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if errcode.Of(err) != errcode.PGReadOnly || !strings.Contains(err.Error(), "Fix: point dsn at the primary") {
				t.Errorf("CheckWritable: %v", err)
			}
			_, err = conn.Exec(ctx, `CREATE TABLE t (id int)`)
			if err := Explain(err); errcode.Of(err) != errcode.PGReadOnly {
				t.Errorf("a refused write: %v", err)
			}
		})
	}
}
