package tests

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/redis/go-redis/v9"

	"github.com/pgrelay/pgrelay/internal/cdctest"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// secret is the password of every DSN and URL in TestSecretsNeverPrinted. It is what a leak looks
// like: the test searches every output for it.
const secret = "Pw7kQz3xSecretV9"

// secretEnv is PostgreSQL and Redis that accept the user relay only with secret (scram-sha-256 in
// pg_hba; a Redis ACL user, the default user disabled), plus a user stranger whose real password is
// another, so the same secret fails authentication.
type secretEnv struct {
	t   *testing.T
	pg  *testenv.Postgres
	rd  *testenv.Redis
	rdb *redis.Client // relay's client (the default user is off)
}

func newSecretEnv(t *testing.T) *secretEnv {
	e := &secretEnv{t: t, pg: testenv.StartPostgres(t), rd: testenv.StartRedis(t)}
	e.pg.Exec(`CREATE ROLE relay LOGIN SUPERUSER PASSWORD '` + secret + `'`)
	e.pg.Exec(`CREATE ROLE stranger LOGIN REPLICATION PASSWORD 'not-the-secret'`)
	hba := filepath.Join(e.pg.DataDir, "pg_hba.conf")
	old, err := os.ReadFile(hba)
	if err != nil {
		t.Fatal(err)
	}
	lines := "host all relay,stranger 127.0.0.1/32 scram-sha-256\nhost replication relay,stranger 127.0.0.1/32 scram-sha-256\n"
	if err := os.WriteFile(hba, append([]byte(lines), old...), 0o600); err != nil {
		t.Fatal(err)
	}
	e.pg.Exec(`SELECT pg_reload_conf()`)
	// the server now asks relay for the password: a wrong one is refused
	cdctest.WaitEvery(t, 10*time.Second, 100*time.Millisecond, "password authentication enforced", func() (bool, string) {
		c, err := pgx.Connect(context.Background(), fmt.Sprintf("postgres://relay:wrong@127.0.0.1:%d/postgres?sslmode=disable", e.pg.Port))
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "28P01" {
			return true, ""
		}
		if c != nil {
			c.Close(context.Background())
		}
		return false, fmt.Sprint(err)
	})

	admin := e.rd.Client()
	for _, cmd := range [][]any{
		{"ACL", "SETUSER", "relay", "on", ">" + secret, "~*", "&*", "+@all"},
		{"ACL", "SETUSER", "stranger", "on", ">not-the-secret", "~*", "&*", "+@all"},
		{"ACL", "SETUSER", "default", "off"},
	} {
		if err := admin.Do(context.Background(), cmd...).Err(); err != nil {
			t.Fatalf("%v: %v", cmd, err)
		}
	}
	e.rdb = redis.NewClient(&redis.Options{Addr: e.rd.Addr(), Username: "relay", Password: secret})
	t.Cleanup(func() { e.rdb.Close() })
	if err := e.rdb.Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *secretEnv) dsn(user string) string {
	return fmt.Sprintf("postgres://%s:%s@127.0.0.1:%d/postgres?sslmode=disable", user, secret, e.pg.Port)
}

func (e *secretEnv) redisURL(user string) string {
	return fmt.Sprintf("redis://%s:%s@%s", user, secret, e.rd.Addr())
}

// sourceConfig is pg_cdc → redis_queue with the given connections; sinkConfig is redis_queue → pg_sink.
func sourceConfig(name, dsn, redisURL string, port int) string {
	return fmt.Sprintf(`http: { address: 127.0.0.1:%d }
metrics: { prometheus: {} }
logger: { level: debug }
input:
  pg_cdc:
    name: %s
    dsn: %s
    tables: [ { table: public.accounts, queue: accts } ]
    redis: { url: %s }
    snapshot: initial
    lease_ttl: 3s
    heartbeat: 1s
output:
  redis_queue:
    url: %s
shutdown_timeout: 5s
`, port, name, dsn, redisURL, redisURL)
}

func sinkConfig(dsn, redisURL string, port int) string {
	return fmt.Sprintf(`http: { address: 127.0.0.1:%d }
metrics: { prometheus: {} }
logger: { level: debug }
input:
  redis_queue:
    url: %s
    queue: accts
    group: accts_copy
    start_from: earliest
    max_attempts: 2
output:
  pg_sink:
    dsn: %s
    name: accts_copy
    table: public.accounts_copy
    mode: cdc
shutdown_timeout: 5s
`, port, redisURL, dsn)
}

// leakCheck collects every text pgrelay showed and fails the test for each that holds the secret.
type leakCheck struct {
	t    *testing.T
	seen int
}

func (l *leakCheck) check(what, text string) {
	l.t.Helper()
	l.seen++
	if i := strings.Index(text, secret); i >= 0 {
		from, to := max(0, i-200), min(len(text), i+len(secret)+100)
		l.t.Errorf("the password appears in %s: ...%s...", what, text[from:to])
	}
}

// pgrelayOutput runs the binary to completion (bounded) and returns stdout+stderr.
func pgrelayOutput(t *testing.T, env []string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, testenv.Binary(t), args...)
	cmd.Env = append(os.Environ(), env...)
	out, _ := cmd.CombinedOutput()
	return string(out)
}

// TestSecretsNeverPrinted runs both pipelines (pg_cdc → redis_queue, redis_queue → pg_sink) with the
// password in every DSN and URL, the CLI against them, and starts that fail (wrong password,
// unreachable server, malformed URL), and finds the password in no log line, no CLI output (text and
// --json), no metric, no error text and nothing pgrelay stored in Redis.
func TestSecretsNeverPrinted(t *testing.T) {
	e := newSecretEnv(t)
	ctx := context.Background()
	leaks := &leakCheck{t: t}
	e.pg.Exec(`CREATE TABLE accounts (id int PRIMARY KEY, owner text, balance numeric)`)
	e.pg.Exec(`CREATE TABLE accounts_copy (id int PRIMARY KEY, owner text, balance numeric)`)
	e.pg.Exec(`INSERT INTO accounts SELECT g, 'owner ' || g, g * 1.5 FROM generate_series(1, 50) g`)

	srcPort, sinkPort := testenv.FreePort(t), testenv.FreePort(t)
	srcConf := writeConfig(t, "source.yaml", sourceConfig("secret-src", e.dsn("relay"), e.redisURL("relay"), srcPort))
	sinkConf := writeConfig(t, "sink.yaml", sinkConfig(e.dsn("relay"), e.redisURL("relay"), sinkPort))
	src := testenv.StartProcess(t, nil, testenv.Binary(t), "-c", srcConf)
	sink := testenv.StartProcess(t, nil, testenv.Binary(t), "-c", sinkConf)
	e.pg.Exec(`INSERT INTO accounts SELECT g, 'owner ' || g, g * 1.5 FROM generate_series(51, 60) g`)
	cdctest.WaitEvery(t, 90*time.Second, 250*time.Millisecond, "the copy holds all 60 rows", func() (bool, string) {
		var n int
		if err := e.pg.Pool().QueryRow(ctx, `SELECT count(*) FROM accounts_copy`).Scan(&n); err != nil {
			return false, err.Error()
		}
		return n == 60, fmt.Sprintf("%d rows; source: %s; sink: %s", n, sinkLastLines(src.Output(), 3), sinkLastLines(sink.Output(), 3))
	})

	for name, port := range map[string]int{"source": srcPort, "sink": sinkPort} {
		body, err := testenv.HTTPGet(ctx, fmt.Sprintf("http://127.0.0.1:%d/metrics", port), 20*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(body, "input_received") {
			t.Fatalf("%s /metrics has no input_received:\n%s", name, body)
		}
		leaks.check(name+" /metrics", body)
	}
	// a metrics URL may carry credentials too (a proxy with basic auth in front of /metrics)
	metricsEnv := []string{fmt.Sprintf("PGRELAY_METRICS_URL=http://relay:%s@127.0.0.1:%d/metrics", secret, sinkPort)}
	deadMetricsEnv := []string{fmt.Sprintf("PGRELAY_METRICS_URL=http://relay:%s@127.0.0.1:%d/metrics", secret, testenv.FreePort(t))}
	badMetricsEnv := []string{fmt.Sprintf("PGRELAY_METRICS_URL=http://relay:%s@127.0.0.1:notaport/metrics", secret)}
	for _, c := range []struct {
		what string
		env  []string
		args []string
		want string // a sign the command did its job
	}{
		{"status (source)", nil, []string{"status", "-c", srcConf}, "secret-src"},
		{"status --json (source)", nil, []string{"status", "-c", srcConf, "--json"}, "secret-src"},
		{"status (sink)", metricsEnv, []string{"status", "-c", sinkConf}, "accts_copy"},
		{"status --json (sink)", metricsEnv, []string{"status", "-c", sinkConf, "--json"}, "accts_copy"},
		{"status (sink, metrics unreachable)", deadMetricsEnv, []string{"status", "-c", sinkConf}, "connection refused"},
		{"status --json (sink, metrics URL malformed)", badMetricsEnv, []string{"status", "-c", sinkConf, "--json"}, "does not parse"},
		{"queue info --url", nil, []string{"queue", "info", "--url", e.redisURL("relay"), "accts"}, "accts"},
		{"queue info --json -c", nil, []string{"queue", "info", "-c", sinkConf, "--json"}, "accts"},
		{"queue dlq --json", nil, []string{"queue", "dlq", "--url", e.redisURL("relay"), "--json", "accts"}, "["},
		{"queue info (REDIS_URL)", []string{"REDIS_URL=" + e.redisURL("relay")}, []string{"queue", "info", "accts"}, "accts"},
		{"echo", nil, []string{"echo", sinkConf}, "pg_sink"},
		{"lint", nil, []string{"lint", srcConf, sinkConf}, ""},
	} {
		out := pgrelayOutput(t, c.env, c.args...)
		if !strings.Contains(out, c.want) {
			t.Errorf("%s printed no %q:\n%s", c.what, c.want, out)
		}
		leaks.check(c.what, out)
	}
	src.Signal(15)
	sink.Signal(15)
	src.Wait(30 * time.Second)
	sink.Wait(30 * time.Second)
	leaks.check("source log", src.Output())
	leaks.check("sink log", sink.Output())

	// starts that fail: each runs until it has logged its failure (or exits), then is stopped
	closed := testenv.FreePort(t)
	wrongPG := e.dsn("stranger")
	closedPG := fmt.Sprintf("postgres://relay:%s@127.0.0.1:%d/postgres?sslmode=disable", secret, closed)
	closedRedis := fmt.Sprintf("redis://relay:%s@127.0.0.1:%d", secret, closed)
	badRedisURL := fmt.Sprintf("redis://relay:%s@127.0.0.1:notaport", secret)
	badPGDSN := fmt.Sprintf("postgres://relay:%s@127.0.0.1:notaport/postgres", secret)
	keyValuePG := fmt.Sprintf("'host=127.0.0.1 port=%d user=stranger password=%s dbname=postgres sslmode=disable'", e.pg.Port, secret)
	t.Run("failing starts", func(t *testing.T) { // in parallel; returns when all are done
		for _, c := range []struct {
			what, config string
			want         []string // what the failure says (any of them)
		}{
			{"source, wrong PostgreSQL password", sourceConfig("failing-1", wrongPG, e.redisURL("relay"), testenv.FreePort(t)), []string{"password authentication failed"}},
			{"source, wrong Redis password", sourceConfig("failing-2", e.dsn("relay"), e.redisURL("stranger"), testenv.FreePort(t)), []string{"WRONGPASS"}},
			{"source, PostgreSQL unreachable", sourceConfig("failing-3", closedPG, e.redisURL("relay"), testenv.FreePort(t)), []string{"connection refused"}},
			{"source, Redis unreachable", sourceConfig("failing-4", e.dsn("relay"), closedRedis, testenv.FreePort(t)), []string{"connection refused"}},
			{"source, malformed Redis URL", sourceConfig("failing-5", e.dsn("relay"), badRedisURL, testenv.FreePort(t)), []string{"invalid port", "Config lint error"}},
			{"source, malformed DSN", sourceConfig("failing-6", badPGDSN, e.redisURL("relay"), testenv.FreePort(t)), []string{"invalid port", "Config lint error"}},
			{"sink, wrong PostgreSQL password", sinkConfig(wrongPG, e.redisURL("relay"), testenv.FreePort(t)), []string{"password authentication failed"}},
			{"sink, wrong password in a key=value DSN", sinkConfig(keyValuePG, e.redisURL("relay"), testenv.FreePort(t)), []string{"password authentication failed"}},
			{"sink, wrong Redis password", sinkConfig(e.dsn("relay"), e.redisURL("stranger"), testenv.FreePort(t)), []string{"WRONGPASS"}},
			{"sink, PostgreSQL unreachable", sinkConfig(closedPG, e.redisURL("relay"), testenv.FreePort(t)), []string{"connection refused"}},
			{"sink, malformed Redis URL", sinkConfig(e.dsn("relay"), badRedisURL, testenv.FreePort(t)), []string{"invalid port", "Config lint error"}},
		} {
			t.Run(c.what, func(t *testing.T) {
				t.Parallel()
				leaks := &leakCheck{t: t}
				conf := writeConfig(t, "failing.yaml", c.config)
				p := testenv.StartProcess(t, nil, testenv.Binary(t), "-c", conf)
				deadline := time.Now().Add(60 * time.Second)
				for !containsAny(p.Output(), c.want) && !p.Exited() && time.Now().Before(deadline) {
					time.Sleep(100 * time.Millisecond)
				}
				time.Sleep(200 * time.Millisecond) // let the failure's follow-up lines out
				p.Kill()
				out := p.Output()
				if !containsAny(out, c.want) {
					t.Errorf("the failure names none of %q:\n%s", c.want, sinkLastLines(out, 20))
				}
				leaks.check("log", out)
				for _, args := range [][]string{{"status", "-c", conf}, {"status", "-c", conf, "--json"}, {"queue", "info", "-c", conf, "accts"}} {
					leaks.check(strings.Join(args[:2], " ")+" of the failing config", pgrelayOutput(t, nil, args...))
				}
			})
		}
	})

	// the CLI reads a URL without the linter in between
	out := pgrelayOutput(t, nil, "queue", "info", "--url", badRedisURL, "accts")
	if !strings.Contains(out, "relay:xxxxx@") {
		t.Errorf("queue info --url with a malformed URL does not show it redacted:\n%s", out)
	}
	leaks.check("queue info --url with a malformed URL", out)

	// everything pgrelay stored in Redis (pointers, leases, status hashes, streams, dead letters)
	keys, err := e.rdb.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	var stored strings.Builder
	for _, k := range keys {
		stored.WriteString(k + "\n")
		switch typ := e.rdb.Type(ctx, k).Val(); typ {
		case "string":
			stored.WriteString(e.rdb.Get(ctx, k).Val())
		case "hash":
			for f, v := range e.rdb.HGetAll(ctx, k).Val() {
				stored.WriteString(f + "=" + v + "\n")
			}
		case "stream":
			for _, m := range e.rdb.XRange(ctx, k, "-", "+").Val() {
				stored.WriteString(fmt.Sprint(m.Values) + "\n")
			}
		case "zset":
			stored.WriteString(strings.Join(e.rdb.ZRange(ctx, k, 0, -1).Val(), "\n"))
		case "set":
			stored.WriteString(strings.Join(e.rdb.SMembers(ctx, k).Val(), "\n"))
		case "list":
			stored.WriteString(strings.Join(e.rdb.LRange(ctx, k, 0, -1).Val(), "\n"))
		}
	}
	if !strings.Contains(stored.String(), "password authentication failed") {
		t.Errorf("no source status hash holds the failed start's error; keys: %v", keys)
	}
	leaks.check("Redis keys and values", stored.String())
	t.Logf("%d outputs checked", leaks.seen)
}

func containsAny(s string, subs []string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}
