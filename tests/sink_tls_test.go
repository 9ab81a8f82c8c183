package tests

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay/internal/cdctest"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// pg_sink refused by the server's TLS rules logs the error's code and fix (pg_tls, pg_hba), the
// same as pg_cdc, instead of a bare driver error.
func TestSinkLogsTLSRefusalsWithCodes(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.WithTLS("hostssl all all 127.0.0.1/32 cert", "hostnossl all all 0.0.0.0/0 reject"))
	pg.Exec(`CREATE TABLE items (id int PRIMARY KEY, name text)`)
	for _, c := range []struct{ name, tls, want string }{
		{"untrusted CA", fmt.Sprintf("{mode: verify-full, root_ca_file: %q, client_cert_file: %q, client_key_file: %q}",
			pg.TLS.OtherCAFile, pg.TLS.ClientCertFile, pg.TLS.ClientKeyFile), "pg_tls:"},
		{"TLS off", "{mode: disable}", "pg_hba:"},
	} {
		config := writeConfig(t, "sink.yaml", fmt.Sprintf(`http:
  enabled: false
input:
  generate: {interval: 100ms, mapping: 'root = {"id": 1, "name": "x"}'}
output:
  pg_sink:
    host: 127.0.0.1
    port: %d
    user: postgres
    database: postgres
    tls: %s
    name: items
    table: items
    mode: upsert
    require_progress: false
logger:
  level: info
`, pg.Port, c.tls))
		p := testenv.StartProcess(t, nil, testenv.Binary(t), "-c", config)
		cdctest.WaitEvery(t, 20*time.Second, 100*time.Millisecond, c.name+": "+c.want+" in the log", func() (bool, string) {
			out := p.Output()
			return strings.Contains(out, c.want), out
		})
		if !strings.Contains(p.Output(), "Fix:") {
			t.Errorf("%s: the log names no fix:\n%s", c.name, p.Output())
		}
		p.Kill()
	}
}
