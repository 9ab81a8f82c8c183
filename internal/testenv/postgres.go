package testenv

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Postgres is a throwaway PostgreSQL server with wal_level=logical and trust auth on loopback
// (WithTLS may replace the loopback rules).
type Postgres struct {
	t       testing.TB
	BinDir  string // the bin directory the server runs from
	Version int    // major version
	Port    int
	DataDir string
	TLS     *TLSFiles // the certificates, when started WithTLS
	// StandbyName is, on a server started by StartStandby, its application_name and the name of
	// the physical slot it streams from on the primary (empty otherwise).
	StandbyName string
	proc        procSlot
	mu          sync.Mutex // guards pool
	pool        *pgxpool.Pool
}

// PGOption changes how StartPostgres starts a server.
type PGOption func(*pgOptions)

type pgOptions struct {
	binDir string
	conf   []string
	tls    bool
	hba    []string
	port   int // the first port tried instead of a free one (tests of the retry)
}

// WithPGBin runs the server from the given bin directory instead of the default.
func WithPGBin(dir string) PGOption { return func(o *pgOptions) { o.binDir = dir } }

// WithPGVersion runs the given major version (15, 17, 18, ...), found as PostgresBins does.
func WithPGVersion(major int) PGOption {
	return func(o *pgOptions) { o.binDir = PostgresBins()[major] }
}

// WithPGSetting adds a server setting (`name=value`) to the command line.
func WithPGSetting(kv string) PGOption { return func(o *pgOptions) { o.conf = append(o.conf, kv) } }

// PostgresBins lists installed PostgreSQL bin directories by major version: the cache that
// scripts/setup fills (.cache/pg/<major>/bin) and Debian's /usr/lib/postgresql/<major>/bin.
func PostgresBins() map[int]string {
	out := map[int]string{}
	candidates, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	more, _ := filepath.Glob(filepath.Join(RepoRoot(), ".cache", "pg", "*", "bin"))
	candidates = append(candidates, more...)
	for _, dir := range candidates {
		major, err := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
		if err != nil {
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, "postgres")); err == nil {
			out[major] = dir
		}
	}
	return out
}

// DefaultPostgresBin is PGRELAY_PG_BIN when set, else the newest installed version.
func DefaultPostgresBin() string {
	if d := os.Getenv("PGRELAY_PG_BIN"); d != "" {
		return d
	}
	bins := PostgresBins()
	var majors []int
	for m := range bins {
		majors = append(majors, m)
	}
	if len(majors) == 0 {
		return ""
	}
	sort.Ints(majors)
	return bins[majors[len(majors)-1]]
}

// StartPostgres initialises and starts a new server; it is stopped when the test ends.
func StartPostgres(t testing.TB, opts ...PGOption) *Postgres {
	t.Helper()
	o := pgOptions{binDir: DefaultPostgresBin()}
	for _, opt := range opts {
		opt(&o)
	}
	if o.binDir == "" {
		missing(t, "PostgreSQL (set PGRELAY_PG_BIN or install one)")
	}
	if _, err := os.Stat(filepath.Join(o.binDir, "postgres")); err != nil {
		missing(t, "PostgreSQL in "+o.binDir)
	}
	base := tempDir(t, "pg")
	pg := &Postgres{t: t, BinDir: o.binDir, DataDir: filepath.Join(base, "data"), Port: o.port}
	if pg.Port == 0 {
		pg.Port = FreePort(t)
	}
	if err := newDataDir(o.binDir, pg.DataDir); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	conf := []string{
		"listen_addresses = '127.0.0.1'",
		fmt.Sprintf("port = %d", pg.Port),
		fmt.Sprintf("unix_socket_directories = '%s'", base),
		"wal_level = logical",
		"max_replication_slots = 64",
		"max_wal_senders = 64",
		"max_connections = 300",
		"shared_buffers = 64MB",
		"fsync = off", // a SIGKILLed server keeps its data in the page cache; only the OS could lose it
		"full_page_writes = off",
		"wal_sender_timeout = 60s",
		"log_min_messages = warning",
		"log_line_prefix = '%m [%p] '",
	}
	if o.tls {
		conf = append(conf, startTLS(t, pg, o.hba)...)
	}
	for _, kv := range o.conf {
		conf = append(conf, kv)
	}
	if err := appendConf(pg.DataDir, conf...); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	pg.Version = pgVersion(pg.DataDir)
	pg.startFirst()
	t.Cleanup(pg.Stop)
	return pg
}

// startFirst is the first start of a new server, on another port if its own was taken
// (portStarts); the last `port` line of postgresql.conf wins.
func (pg *Postgres) startFirst() {
	pg.t.Helper()
	for attempt := 1; ; attempt++ {
		err := pg.tryStart()
		if err == nil {
			return
		}
		if attempt == portStarts || !portTaken(err) {
			pg.t.Fatalf("testenv: postgres %s: %v", pg.BinDir, err)
		}
		pg.Port = FreePort(pg.t)
		if err := appendConf(pg.DataDir, fmt.Sprintf("port = %d", pg.Port)); err != nil {
			pg.t.Fatalf("testenv: %v", err)
		}
	}
}

// appendConf appends lines to the server's postgresql.conf (a later setting wins).
func appendConf(dataDir string, lines ...string) error {
	f, err := os.OpenFile(filepath.Join(dataDir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintln(f, strings.Join(lines, "\n")); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func pgVersion(dataDir string) int {
	b, _ := os.ReadFile(filepath.Join(dataDir, "PG_VERSION"))
	v, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return v
}

func (pg *Postgres) start() {
	pg.t.Helper()
	if err := pg.tryStart(); err != nil {
		pg.t.Fatalf("testenv: postgres %s: %v", pg.BinDir, err)
	}
}

// tryStart starts the server and waits until it accepts connections.
func (pg *Postgres) tryStart() error {
	cmd, err := command(filepath.Join(pg.BinDir, "postgres"), "-D", pg.DataDir)
	if err != nil {
		return err
	}
	p, err := startProc(cmd, filepath.Join(filepath.Dir(pg.DataDir), "postgres.log"))
	if err != nil {
		return fmt.Errorf("start: %w", err)
	}
	pg.proc.set(p)
	return pg.waitReady(60 * time.Second)
}

func (pg *Postgres) waitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		if p := pg.proc.current(); p.exited() {
			return fmt.Errorf("exited: %s", tail(p.log))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err := pg.answers(ctx)
		cancel()
		if err == nil {
			return nil
		}
		last = err
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("not ready after %s: %v\n%s", timeout, last, tail(pg.proc.current().log))
}

// answers reports whether this server takes connections on its port. The server must be this one
// (its data directory): tests of other processes start servers too, and one of theirs may hold the
// port this server is about to find taken, whose exit waitReady then reads.
func (pg *Postgres) answers(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, pg.DSN())
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	var dir string
	if err := conn.QueryRow(ctx, `SHOW data_directory`).Scan(&dir); err != nil {
		return err
	}
	if !samePath(dir, pg.DataDir) {
		return fmt.Errorf("port %d is answered by another server (data directory %s)", pg.Port, dir)
	}
	return nil
}

// samePath reports whether a and b name the same directory (symbolic links resolved).
func samePath(a, b string) bool {
	ra, errA := filepath.EvalSymlinks(a)
	rb, errB := filepath.EvalSymlinks(b)
	if errA != nil || errB != nil {
		return filepath.Clean(a) == filepath.Clean(b)
	}
	return ra == rb
}

// DSN is the connection string of the postgres database as the postgres superuser.
func (pg *Postgres) DSN() string { return pg.DatabaseDSN("postgres") }

// DatabaseDSN is the connection string of another database on the same server. On a server
// started WithTLS it verifies the server (verify-full) and presents the client certificate.
func (pg *Postgres) DatabaseDSN(db string) string { return pg.UserDSN("postgres", db) }

// UserDSN is the connection string of database db as role user (trust auth: no password), for
// tests that run pgrelay as a role with only the privileges it needs (CreateRole).
func (pg *Postgres) UserDSN(user, db string) string {
	params := "sslmode=disable"
	if pg.TLS != nil {
		params = pg.TLS.dsnParams()
	}
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?%s", url.PathEscape(user), pg.Port, db, params)
}

// SocketDSN is DSN over the server's Unix socket (its directory holds the data directory) instead
// of TCP on 127.0.0.1, without TLS.
func (pg *Postgres) SocketDSN() string {
	return fmt.Sprintf("postgres://postgres@/postgres?host=%s&port=%d&sslmode=disable", url.QueryEscape(filepath.Dir(pg.DataDir)), pg.Port)
}

// CreateRole creates a role with the given attributes (e.g. "LOGIN REPLICATION") and runs the
// grants (whole statements, "%[1]s" standing for the quoted role name) as the superuser.
func (pg *Postgres) CreateRole(name, attributes string, grants ...string) {
	pg.t.Helper()
	role := pgx.Identifier{name}.Sanitize()
	pg.Exec("CREATE ROLE " + role + " " + attributes)
	for _, g := range grants {
		pg.Exec(fmt.Sprintf(g, role))
	}
}

// Pool returns a superuser connection pool to the postgres database, closed when the test ends.
// After Kill and Restart the pool reconnects on its own.
func (pg *Postgres) Pool() *pgxpool.Pool {
	pg.mu.Lock()
	defer pg.mu.Unlock()
	if pg.pool == nil {
		pool, err := pgxpool.New(context.Background(), pg.DSN())
		if err != nil {
			pg.t.Fatalf("testenv: pool: %v", err)
		}
		pg.pool = pool
	}
	return pg.pool
}

// Exec runs SQL statements as the superuser and fails the test on error.
func (pg *Postgres) Exec(sql string, args ...any) {
	pg.t.Helper()
	if _, err := pg.Pool().Exec(context.Background(), sql, args...); err != nil {
		pg.t.Fatalf("testenv: exec %q: %v", sql, err)
	}
}

// DropSlot drops replication slot name by hand, as an operator would: it ends the walsender still
// using it (a stopped client's takes a moment to exit, a running one would hold it for good) and
// retries for up to 30 s. A slot already gone is fine.
func (pg *Postgres) DropSlot(name string) {
	pg.t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, _ = pg.Pool().Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, name)
		_, err := pg.Pool().Exec(ctx, `SELECT pg_drop_replication_slot($1)`, name)
		if err == nil || strings.Contains(err.Error(), "does not exist") {
			return
		}
		if time.Now().After(deadline) {
			pg.t.Fatalf("testenv: could not drop slot %s: %v", name, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

var dbName = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// CreateDatabase creates a second database on the server and returns its DSN.
func (pg *Postgres) CreateDatabase(name string) string {
	pg.t.Helper()
	if !dbName.MatchString(name) {
		pg.t.Fatalf("testenv: database name %q: use [a-z0-9_]", name)
	}
	pg.Exec("CREATE DATABASE " + pgx.Identifier{name}.Sanitize())
	return pg.DatabaseDSN(name)
}

// Kill stops the server with SIGKILL (the whole process group), as a crash would.
func (pg *Postgres) Kill() { pg.proc.signal(syscall.SIGKILL, 10*time.Second) }

// Restart starts the server again on the same data directory and port (after Kill or Stop).
func (pg *Postgres) Restart() {
	pg.t.Helper()
	pg.proc.signal(syscall.SIGINT, 30*time.Second) // when it still runs
	// A SIGKILLed postmaster leaves its pid file: PostgreSQL recovers from it by itself.
	pg.start()
	pg.mu.Lock()
	if pg.pool != nil {
		pg.pool.Reset() // drop the connections to the old server
	}
	pg.mu.Unlock()
}

// Stop shuts the server down (fast shutdown, SIGKILL if it does not stop in time).
func (pg *Postgres) Stop() {
	pg.mu.Lock()
	pool := pg.pool
	pg.pool = nil
	pg.mu.Unlock()
	if pool != nil {
		pool.Close()
	}
	pg.proc.signal(syscall.SIGINT, 15*time.Second)
}
