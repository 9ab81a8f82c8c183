package pgconnect

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgrelay/pgrelay/internal/errcode"
)

// Explain gives a connection failure the user can fix in the connection's fields, in
// postgresql.conf or pg_hba.conf, or with a GRANT its code and fix sentence (docs/errors.md):
// `pg_unreachable` for a server that does not answer (refused, no such host, timed out),
// `pg_password` for a password refused or missing, `pg_database` for a database that does not
// exist, `pg_limit` for every WAL sender or replication slot the server allows in use,
// `pg_read_only` for a write refused by a standby or a read-only session, `pg_tls` for
// a TLS handshake or certificate that failed, `pg_hba` for a connection pg_hba.conf turned away,
// `pg_login` for a role without LOGIN or without CONNECT on the database, `source_privileges` for a
// role without REPLICATION (a replication connection, or a slot function). The fixes name the role,
// database or address of the failed connection (never its password). An error already coded
// comes back unchanged, any other with its text on one line (oneLine); the cause stays wrapped, so
// errors.As still finds pgx's errors.
//
// An expired or otherwise refused client certificate is known by the server's TLS alert; under TLS
// 1.3 a connection reset sometimes arrives before it, and that plain reset stays uncoded (the next
// attempt usually gets the alert).
func Explain(err error) error {
	if err == nil || errcode.Of(err) != "" {
		return err
	}
	err = oneLine(err)
	tlsErr := func(msg, fix string) error { return errcode.Wrap(errcode.PGTLS, err, msg, fix) }
	var pe *pgconn.PgError
	text := err.Error()
	switch {
	case strings.Contains(text, "x509: certificate signed by unknown authority"):
		return tlsErr("PostgreSQL's certificate is not signed by the CA in tls.root_ca_file",
			"set tls.root_ca_file to the CA that signed the server's certificate (ssl_cert_file)")
	case strings.Contains(text, "x509: certificate is valid for"), strings.Contains(text, "x509: cannot validate certificate for"):
		return tlsErr("PostgreSQL's certificate does not name the host connected to",
			"connect to a host name or IP address the certificate lists, or use tls.mode verify-ca (which skips the name check)")
	case strings.Contains(text, "x509: certificate has expired or is not yet valid"):
		return tlsErr("PostgreSQL's certificate has expired or is not valid yet",
			"renew the server's certificate (or check this machine's clock)")
	case strings.Contains(text, "x509: "), strings.Contains(text, "tls: failed to verify certificate"):
		return tlsErr("PostgreSQL's certificate could not be verified",
			"check that tls.root_ca_file holds the CA that signed the server's certificate")
	case strings.Contains(text, "server refused TLS connection"):
		return tlsErr("PostgreSQL does not accept TLS (ssl is off)",
			"turn ssl on in postgresql.conf, or set tls.mode to disable or prefer")
	case strings.Contains(text, "remote error: tls:"):
		return tlsErr("PostgreSQL refused the TLS handshake (it could not verify the client certificate)",
			"set tls.client_cert_file and tls.client_key_file to a valid, unexpired certificate signed by a CA in the server's ssl_ca_file")
	case unreachable(err):
		return errcode.Wrap(errcode.PGUnreachable, err, "PostgreSQL does not answer"+at(err),
			"check the host and port of dsn (or host and port), that PostgreSQL runs and listens there (listen_addresses and port in postgresql.conf) and that no firewall drops the connection; pgrelay keeps retrying")
	case !errors.As(err, &pe):
		return err
	case pe.Code == "28P01":
		user, _ := target(err)
		return errcode.Wrap(errcode.PGPassword, err, "PostgreSQL refused the password of role "+user+" (or wanted one and got none)",
			"set password (from the environment: password: ${PGPASSWORD}) or the dsn's password to the role's password")
	case pe.Code == "3D000":
		_, db := target(err)
		return errcode.Wrap(errcode.PGDatabase, err, "database "+db+" does not exist",
			"name an existing database in dsn (or database), or CREATE DATABASE "+pgx.Identifier{db}.Sanitize())
	case pe.Code == "53300" && strings.Contains(pe.Message, "max_wal_senders"):
		return errcode.Wrap(errcode.PGLimit, err, "every WAL sender PostgreSQL allows is in use (max_wal_senders)",
			"end replication connections nothing needs (pg_stat_replication), or raise max_wal_senders in postgresql.conf and restart PostgreSQL")
	case pe.Code == "53400" && strings.Contains(pe.Message, "replication slots"):
		return errcode.Wrap(errcode.PGLimit, err, "every replication slot PostgreSQL allows is in use (max_replication_slots)",
			"drop slots nothing reads (SELECT slot_name FROM pg_replication_slots WHERE NOT active; then pg_drop_replication_slot), or raise max_replication_slots in postgresql.conf and restart PostgreSQL")
	case pe.Code == "25006":
		return ReadOnly(err)
	case pe.Code == "42501" || pe.Code == "28000" && strings.Contains(pe.Message, "not permitted to log in"):
		return explainPrivilege(err, pe)
	case pe.Code != "28000":
		return err
	case strings.Contains(pe.Message, "requires a valid client certificate"):
		return tlsErr("PostgreSQL requires a client certificate and got none it trusts",
			"set tls.client_cert_file and tls.client_key_file to a certificate signed by a CA in the server's ssl_ca_file (a certificate of another CA is never sent)")
	case strings.Contains(pe.Message, "certificate authentication failed"):
		return tlsErr("the client certificate's common name (CN) is not the user connecting",
			"use a certificate whose CN is the user name, or map it in pg_ident.conf")
	case strings.Contains(pe.Message, "pg_hba.conf") && strings.HasSuffix(pe.Message, "no encryption"):
		return errcode.Wrap(errcode.PGHBA, err, "pg_hba.conf refuses connections without TLS from this host",
			"set tls.mode to require, verify-ca or verify-full")
	case strings.Contains(pe.Message, "pg_hba.conf") && strings.HasSuffix(pe.Message, "SSL encryption"):
		return errcode.Wrap(errcode.PGHBA, err, "pg_hba.conf refuses TLS connections from this host",
			"set tls.mode to disable, or add a hostssl line to pg_hba.conf")
	case strings.Contains(pe.Message, "pg_hba.conf"):
		return errcode.Wrap(errcode.PGHBA, err, "pg_hba.conf lets no connection in for this host, user and database",
			"add a line to pg_hba.conf (and reload PostgreSQL), or connect as a user or to a database it allows")
	}
	return err
}

// CheckWritable returns pg_read_only when the session takes no writes: the server is a standby
// (in recovery) or the session is read-only (default_transaction_read_only).
func CheckWritable(ctx context.Context, q interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}) error {
	var standby bool
	var readOnly string
	if err := q.QueryRow(ctx, `SELECT pg_catalog.pg_is_in_recovery(), pg_catalog.current_setting('transaction_read_only')`).Scan(&standby, &readOnly); err != nil {
		return fmt.Errorf("read whether the server takes writes: %w", err)
	}
	if standby || readOnly == "on" {
		return ReadOnly(fmt.Errorf("pg_is_in_recovery() %v, transaction_read_only %s", standby, readOnly))
	}
	return nil
}

// ReadOnly is the pg_read_only error of a server that takes no writes (err: what showed it, a
// refused write (SQLSTATE 25006) or the session's settings).
func ReadOnly(err error) error {
	return errcode.Wrap(errcode.PGReadOnly, err, "PostgreSQL takes no writes here: a standby, or a session made read-only (default_transaction_read_only)",
		"point dsn at the primary (with several hosts: target_session_attrs=read-write; on RDS and Aurora the writer or cluster endpoint, not a reader), or turn default_transaction_read_only off for the role or database")
}

// unreachable reports a connection attempt that reached no server: refused, no route, a host
// name that does not resolve, or a timeout before the server answered.
func unreachable(err error) bool {
	var ce *pgconn.ConnectError
	if !errors.As(err, &ce) || errors.Is(err, context.Canceled) { // canceled: pgrelay is stopping
		return false
	}
	var op *net.OpError
	var dns *net.DNSError
	return errors.As(err, &dns) || errors.As(err, &op) && op.Op == "dial" || pgconn.Timeout(err)
}

// at names the address a failed connection tried (" at host:port"), or nothing when unknown.
func at(err error) string {
	var ce *pgconn.ConnectError
	if !errors.As(err, &ce) || ce.Config == nil || ce.Config.Host == "" {
		return ""
	}
	if strings.HasPrefix(ce.Config.Host, "/") { // a Unix socket's directory
		return " at " + ce.Config.Host + "/.s.PGSQL." + strconv.Itoa(int(ce.Config.Port))
	}
	return " at " + net.JoinHostPort(ce.Config.Host, strconv.Itoa(int(ce.Config.Port)))
}

// target is the role and database a failed connection asked for.
func target(err error) (user, db string) {
	user, db = "<role>", "<database>"
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) && ce.Config != nil {
		user, db = ce.Config.User, ce.Config.Database
		if db == "" {
			db = user // libpq's default, as the server applies it
		}
	}
	return user, db
}

// explainPrivilege codes a refusal for want of a role attribute or the database's CONNECT privilege.
func explainPrivilege(err error, pe *pgconn.PgError) error {
	user, db := target(err)
	role, dbName := pgx.Identifier{user}.Sanitize(), pgx.Identifier{db}.Sanitize()
	switch msg := pe.Message; {
	case pe.Code == "28000":
		return errcode.Wrap(errcode.PGLogin, err, "role "+user+" may not log in",
			"ALTER ROLE "+role+" LOGIN")
	case strings.HasPrefix(msg, "permission denied for database"):
		return errcode.Wrap(errcode.PGLogin, err, "role "+user+" may not connect to database "+db,
			"GRANT CONNECT ON DATABASE "+dbName+" TO "+role)
	case strings.Contains(msg, "WAL sender"), strings.Contains(msg, "walsender"), strings.Contains(msg, "replication slots"):
		// 16+: "permission denied to start WAL sender" / "... to use replication slots";
		// 14, 15: "must be superuser or replication role to start walsender" / "... to use replication slots".
		return errcode.Wrap(errcode.SourcePrivileges, err, "role "+user+" lacks the REPLICATION attribute that logical replication needs",
			"ALTER ROLE "+role+" REPLICATION (as a superuser; on Amazon RDS and Aurora: GRANT rds_replication TO "+role+")")
	}
	return err
}

// oneLine wraps err so that its text is one line: pgx reports a connect that tried several ways
// (TLS, then without it, with sslmode prefer; several hosts) as one line per attempt after a colon,
// often the same twice. The attempts are joined with "; ", each told once. An error of one line
// comes back as it is; errors.As and errors.Is see through the wrapper.
func oneLine(err error) error {
	text := err.Error()
	head, rest, ok := strings.Cut(text, "\n")
	if !ok {
		return err
	}
	seen := map[string]bool{}
	var parts []string
	for _, l := range strings.Split(rest, "\n") {
		if l = strings.TrimSpace(l); l != "" && !seen[l] {
			seen[l] = true
			parts = append(parts, l)
		}
	}
	return errcode.Retold(err, strings.TrimSuffix(strings.TrimSpace(head), ":")+": "+strings.Join(parts, "; "))
}
