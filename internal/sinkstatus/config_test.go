package sinkstatus

import (
	"os"
	"path/filepath"
	"testing"
)

func TestPartsFromFile(t *testing.T) {
	t.Setenv("SST_DSN", "postgres://u@127.0.0.1:5499/copy")
	cases := []struct {
		name, yaml                   string
		sinks, groups                int
		source                       bool
		sinkName, progress, dsn      string
		queue, group, prefix, rdbURL string
		wantErr                      bool
	}{
		{name: "pipeline", yaml: `
input:
  redis_queue:
    url: ${SST_REDIS:redis://127.0.0.1:6390}
    queue: orders
    group: orders_copy
    batch_count: 10
output:
  pg_sink:
    dsn: ${SST_DSN}
    name: orders_copy
    table: public.orders_copy
    mode: cdc
    max_in_flight: 2
`, sinks: 1, groups: 1, sinkName: "orders_copy", progress: "pgrelay.sink_progress", dsn: "postgres://u@127.0.0.1:5499/copy",
			queue: "orders", group: "orders_copy", prefix: "pgrelay", rdbURL: "redis://127.0.0.1:6390"},
		{name: "producer output is not a group, custom progress table and prefix", yaml: `
input:
  pg_cdc: {name: src}
output:
  broker:
    outputs:
      - redis_queue: {url: "redis://127.0.0.1:1", prefix: x}
      - pg_sink: {host: db, name: s2, mode: sql, statement: "SELECT 1", progress_table: ops.progress}
`, sinks: 1, source: true, sinkName: "s2", progress: "ops.progress"},
		{name: "source only", yaml: "input:\n  pg_cdc: {name: src}\noutput:\n  drop: {}\n", source: true},
		{name: "sink without connection", yaml: "output:\n  pg_sink: {name: s, table: t, mode: cdc}\n", wantErr: true},
		{name: "not yaml", yaml: "input: [", wantErr: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "c.yaml")
			if err := os.WriteFile(path, []byte(c.yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			p, err := PartsFromFile(path)
			if c.wantErr {
				if err == nil {
					t.Fatalf("no error; parts %+v", p)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(p.Sinks) != c.sinks || len(p.Groups) != c.groups || p.HasSource != c.source {
				t.Fatalf("sinks %d groups %d source %v", len(p.Sinks), len(p.Groups), p.HasSource)
			}
			if c.sinks > 0 {
				s := p.Sinks[0]
				if s.Name != c.sinkName || s.ProgressTable != c.progress || (c.dsn != "" && s.Conn.DSN != c.dsn) {
					t.Errorf("sink %+v", s)
				}
			}
			if c.groups > 0 {
				g := p.Groups[0]
				if g.Queue != c.queue || g.Group != c.group || g.Redis.Prefix != c.prefix || g.Redis.URL != c.rdbURL {
					t.Errorf("group %+v", g)
				}
			}
		})
	}
}
