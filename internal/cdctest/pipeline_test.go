package cdctest_test

import (
	"strings"
	"testing"

	"github.com/redpanda-data/benthos/v4/public/service"

	_ "github.com/pgrelay/pgrelay/input"
	"github.com/pgrelay/pgrelay/internal/cdctest"
	_ "github.com/pgrelay/pgrelay/output"
)

// TestPipelineYAML: every shape of the config the tests run passes the stream builder's linter and
// carries what was asked for.
func TestPipelineYAML(t *testing.T) {
	base := cdctest.Pipeline{Name: "s", DSN: "postgres://u@127.0.0.1:5432/db", Tables: "[{table: w, queue: q}]", Redis: "redis://127.0.0.1:6379"}
	cluster := base
	cluster.Redis, cluster.ClusterURLs = "", []string{"redis://127.0.0.1:7000", "redis://127.0.0.1:7001"}
	full := base
	full.Source, full.Durability, full.LogLevel = "snapshot: never\nslot:\n  failover: true", "aof", "info"
	full.Output = "max_in_flight: 2"
	full.Top = "http:\n  enabled: false\nshutdown_timeout: 20s"
	cases := []struct {
		name string
		p    cdctest.Pipeline
		want []string
	}{
		{"one redis", base, []string{"redis: {url: redis://127.0.0.1:6379}", "    url: redis://127.0.0.1:6379\n", "level: warn"}},
		{"cluster", cluster, []string{"redis: {cluster_urls: [redis://127.0.0.1:7000, redis://127.0.0.1:7001]}", "    cluster_urls: [redis://127.0.0.1:7000, redis://127.0.0.1:7001]\n"}},
		{"extra fields", full, []string{"    snapshot: never\n    slot:\n      failover: true\n", "    durability: aof\n    max_in_flight: 2\n", "level: info", "shutdown_timeout: 20s"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			yaml := c.p.YAML()
			if err := service.NewStreamBuilder().SetYAML(yaml); err != nil {
				t.Fatalf("%v\n%s", err, yaml)
			}
			for _, w := range c.want {
				if !strings.Contains(yaml, w) {
					t.Errorf("no %q in\n%s", w, yaml)
				}
			}
		})
	}
}
