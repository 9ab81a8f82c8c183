package source_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay/internal/oracle"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// TestPgCDCOverTLSWithClientCertificate runs five pg_cdc → redis_queue pipelines at once against a
// real PostgreSQL whose pg_hba.conf admits TCP only over TLS with a client certificate
// (`hostssl ... cert`, `hostnossl ... reject`), each with other tls settings, and reads the queues back:
//   - verify-full with the right CA and the client certificate streams every change, and the server
//     reports the walsender's connection as TLS with client DN /CN=postgres;
//   - require (no verification) with the client certificate streams too, certificate presented;
//   - verify-full against an untrusted CA is refused by pg_cdc itself: pg_tls, "tls.root_ca_file";
//   - verify-full without the client certificate is refused by the server: pg_tls, which proves the
//     first pipeline's certificate is what let it in;
//   - disable is refused by pg_hba.conf: pg_hba, "set tls.mode to require".
//
// The refused ones write nothing to their queues and create no slot, although the rows were
// committed while they ran.
func TestPgCDCOverTLSWithClientCertificate(t *testing.T) {
	t.Parallel()
	e := &env{t: t, pg: testenv.StartPostgres(t, testenv.WithTLS(
		"hostssl all all 127.0.0.1/32 cert", "hostnossl all all 0.0.0.0/0 reject")),
		rd: testenv.StartRedis(t), ctx: context.Background()}
	f := e.pg.TLS
	e.pg.Exec(`CREATE TABLE t (id int PRIMARY KEY, v text)`)
	cert := fmt.Sprintf("client_cert_file: %q, client_key_file: %q", f.ClientCertFile, f.ClientKeyFile)
	cases := []struct {
		name, tls  string
		code, text string // "" for a pipeline that must stream
	}{
		{"full", fmt.Sprintf("{mode: verify-full, root_ca_file: %q, %s}", f.CAFile, cert), "", ""},
		{"require", fmt.Sprintf("{mode: require, %s}", cert), "", ""},
		{"untrusted", fmt.Sprintf("{mode: verify-full, root_ca_file: %q, %s}", f.OtherCAFile, cert),
			"pg_tls", "not signed by the CA in tls.root_ca_file"},
		{"nocert", fmt.Sprintf("{mode: verify-full, root_ca_file: %q}", f.CAFile),
			"pg_tls", "requires a client certificate"},
		{"plain", "{mode: disable}", "pg_hba", "Fix: set tls.mode to require"},
	}
	for _, c := range cases {
		// Separate fields, not the test's DSN: that one carries the client certificate itself.
		startStream(t, fmt.Sprintf(`
input:
  pg_cdc:
    name: %s
    host: 127.0.0.1
    port: %d
    user: postgres
    database: postgres
    tls: %s
    tables: [{table: t, queue: q-%s}]
    redis: {url: %s}
    lease_ttl: 3s
    heartbeat: 1s
output:
  redis_queue:
    url: %s
logger:
  level: warn
`, c.name, e.pg.Port, c.tls, c.name, e.rd.URL(), e.rd.URL()))
	}
	for _, c := range cases {
		if c.code == "" {
			e.waitStatus("q-"+c.name, c.name, `"phase":"streaming"`)
			continue
		}
		e.waitStatus("q-"+c.name, c.name, `"code":"`+c.code+`"`)
		st, err := e.rd.Client().HGetAll(e.ctx, "pgrelay:{q-"+c.name+"}:src:"+c.name+":status").Result()
		if err != nil {
			t.Fatalf("read status of %s: %v", c.name, err)
		}
		found := false
		for _, v := range st {
			found = found || (strings.Contains(v, `"code":"`+c.code+`"`) && strings.Contains(v, c.text))
		}
		if !found {
			t.Errorf("%s: status %v lacks %s with %q", c.name, st, c.code, c.text)
		}
	}
	e.pg.Exec(`INSERT INTO t VALUES (1, 'a'), (2, 'b')`)
	e.pg.Exec(`UPDATE t SET v = 'c' WHERE id = 1`)
	for _, q := range []string{"q-full", "q-require"} {
		entries := e.waitEntries(q, 3)
		var ops []string
		for _, en := range entries {
			ev := event(t, en)
			ops = append(ops, string(ev["op"])+string(ev["key"])+string(ev["after"]))
		}
		got := strings.Join(ops, " ")
		for _, want := range []string{`"c"{"id":1}{"id":1,"v":"a"}`, `"c"{"id":2}{"id":2,"v":"b"}`, `"u"{"id":1}{"id":1,"v":"c"}`} {
			if !strings.Contains(got, want) {
				t.Errorf("%s: events %s lack %s", q, got, want)
			}
		}
		e.checkOracle(q, "public.t", "id")
	}
	// What the server saw: each streaming walsender's connection is TLS and carries the client certificate.
	for _, slot := range []string{"pgrelay_full", "pgrelay_require"} {
		var ssl bool
		var dn string
		if err := e.pg.Pool().QueryRow(e.ctx, `SELECT s.ssl, coalesce(s.client_dn, '') FROM pg_stat_ssl s
			JOIN pg_replication_slots r ON r.active_pid = s.pid WHERE r.slot_name = $1`, slot).Scan(&ssl, &dn); err != nil {
			t.Fatalf("pg_stat_ssl of %s's walsender: %v", slot, err)
		}
		if !ssl || dn != "/CN=postgres" {
			t.Errorf("%s's walsender: ssl=%v client_dn=%q, want TLS with /CN=postgres", slot, ssl, dn)
		}
	}
	// The rows were committed while the refused pipelines ran: nothing of them may have arrived.
	time.Sleep(time.Second)
	for _, c := range cases {
		if c.code == "" {
			continue
		}
		entries, err := oracle.ReadQueue(e.ctx, e.rd.Client(), "pgrelay", "q-"+c.name)
		if err != nil {
			t.Fatal(err)
		}
		var slots int
		if err := e.pg.Pool().QueryRow(e.ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, "pgrelay_"+c.name).Scan(&slots); err != nil {
			t.Fatal(err)
		}
		if len(entries) != 0 || slots != 0 {
			t.Errorf("%s was refused but wrote %d entries and has %d slots", c.name, len(entries), slots)
		}
	}
}
