package sinkstatus

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/pgrelay/pgrelay/internal/pgconnect"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// `pgrelay status` of a sink whose tls settings the server refuses names the code and the fix
// (pg_tls, pg_hba), like the sink itself, instead of a bare driver error.
func TestStatusExplainsTLSAndHBARefusals(t *testing.T) {
	pg := testenv.StartPostgres(t, testenv.WithTLS("hostssl all all 127.0.0.1/32 cert", "hostnossl all all 0.0.0.0/0 reject"))
	base := pgconnect.Config{Host: "127.0.0.1", Port: pg.Port, User: "postgres", Database: "postgres"}
	for _, c := range []struct {
		name string
		edit func(*pgconnect.Config)
		want string
	}{
		{"untrusted CA", func(c *pgconnect.Config) {
			c.TLSMode, c.RootCAFile, c.CertFile, c.KeyFile = "verify-full", pg.TLS.OtherCAFile, pg.TLS.ClientCertFile, pg.TLS.ClientKeyFile
		}, "pg_tls:"},
		{"TLS off", func(c *pgconnect.Config) { c.TLSMode = "disable" }, "pg_hba:"},
	} {
		conn := base
		c.edit(&conn)
		st := Read(context.Background(), Parts{Sinks: []SinkRef{{Name: "s", Table: "public.t", Mode: "upsert",
			ProgressTable: "pgrelay.sink_progress", Conn: conn}}})
		got := fmt.Sprint(st.Problems())
		if !strings.Contains(got, c.want) || !strings.Contains(got, "Fix:") {
			t.Errorf("%s: problems %s, want the code %s and a fix", c.name, got, c.want)
		}
	}
}
