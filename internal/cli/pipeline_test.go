package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeConfig(t *testing.T, yaml string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestReadPipeline reads each kind of section with its plugin's own parser: defaults, env
// references, nesting in brokers and switches, and input versus output.
func TestReadPipeline(t *testing.T) {
	t.Setenv("PGRELAY_T_DSN", "postgres://u@127.0.0.1:5499/copy")
	t.Setenv("PGRELAY_T_URL", "redis://10.0.0.1:6390")
	cases := []struct {
		name, yaml string
		check      func(t *testing.T, p *pipeline)
		errSub     string
	}{
		{name: "sink pipeline", yaml: `
input:
  redis_queue:
    url: ${PGRELAY_T_URL}
    queue: orders
    group: orders_copy
    batch_count: 10
output:
  pg_sink:
    dsn: ${PGRELAY_T_DSN}
    name: orders_copy
    table: public.orders_copy
    mode: cdc
    max_in_flight: 2
`, check: func(t *testing.T, p *pipeline) {
			if len(p.sinks) != 1 || len(p.queueInputs) != 1 || len(p.sources) != 0 || len(p.queueOutputs) != 0 {
				t.Fatalf("%+v", p)
			}
			s, q := p.sinks[0], p.queueInputs[0]
			if s.Sink.Name != "orders_copy" || s.Sink.ProgressTable != "pgrelay.sink_progress" || s.Conn.DSN != "postgres://u@127.0.0.1:5499/copy" || s.MaxInFlight != 2 {
				t.Errorf("sink %+v", s)
			}
			if q.Consumer.Queue != "orders" || q.Consumer.Group != "orders_copy" || q.Consumer.BatchCount != 10 || q.Conn.Prefix != "pgrelay" || q.Conn.URL != "redis://10.0.0.1:6390" || q.Conn.TLS != nil {
				t.Errorf("queue input %+v", q)
			}
		}},
		{name: "source, and outputs in a broker", yaml: `
input:
  pg_cdc:
    name: src
    host: db
    tables: [{table: t, queue: q}]
    redis: {url: "redis://127.0.0.1:1", prefix: x}
output:
  broker:
    outputs:
      - redis_queue: {url: "redis://127.0.0.1:1", prefix: x, queue: "${! meta(\"queue\") }"}
      - switch:
          cases:
            - output:
                pg_sink: {host: db, name: s2, mode: sql, statement: "SELECT 1", progress_table: ops.progress}
`, check: func(t *testing.T, p *pipeline) {
			if len(p.sources) != 1 || len(p.sinks) != 1 || len(p.queueOutputs) != 1 || len(p.queueInputs) != 0 {
				t.Fatalf("%+v", p)
			}
			if src := p.sources[0]; src.Name != "src" || src.Slot != "pgrelay_src" || src.Redis.Prefix != "x" || src.LeaseTTL.String() != "10s" {
				t.Errorf("source %+v", src)
			}
			if s := p.sinks[0]; s.Sink.Name != "s2" || s.Sink.ProgressTable != "ops.progress" {
				t.Errorf("sink %+v", s.Sink)
			}
			if q, static := p.queueOutputs[0].StaticQueue(); static || q != "" {
				t.Errorf("an interpolated queue read as %q", q)
			}
		}},
		{name: "env default, fixed queue of an output, cluster", yaml: `
output:
  redis_queue:
    cluster_urls: [ "${PGRELAY_T_UNSET:redis://a:1}", redis://b:2 ]
    prefix: app
    queue: q
`, check: func(t *testing.T, p *pipeline) {
			out := p.queueOutputs[0]
			if q, _ := out.StaticQueue(); q != "q" || strings.Join(out.Conn.ClusterURLs, ",") != "redis://a:1,redis://b:2" || out.Conn.Prefix != "app" {
				t.Errorf("queue output %+v", out)
			}
		}},
		{name: "the tls block of a redis_queue", yaml: `
input:
  redis_queue:
    url: rediss://127.0.0.1:6380
    queue: q
    group: g
    tls: {enabled: true, skip_cert_verify: true}
`, check: func(t *testing.T, p *pipeline) {
			if c := p.queueInputs[0].Conn; c.TLS == nil || !c.TLS.InsecureSkipVerify {
				t.Errorf("tls not read: %+v", c)
			}
		}},
		{name: "a resource redis_queue with a group is an input", yaml: "redis_queue:\n  queue: q\n  group: g\n", check: func(t *testing.T, p *pipeline) {
			if len(p.queueInputs) != 1 || len(p.queueOutputs) != 0 {
				t.Errorf("%+v", p)
			}
		}},
		{name: "a sink without connection is refused as the sink refuses it", yaml: "output:\n  pg_sink: {name: s, table: t, mode: cdc}\n", errSub: "line 2: pg_sink: "},
		{name: "a bad source field names the field", yaml: "input:\n  pg_cdc: {name: x, host: h, tables: [{table: t, queue: q}], lease_ttl: 1s}\n", errSub: "lease_ttl:"},
		{name: "not yaml", yaml: "input: [", errSub: "c.yaml: yaml:"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, err := readPipeline(writeConfig(t, c.yaml))
			if c.errSub != "" {
				if err == nil || !strings.Contains(err.Error(), c.errSub) {
					t.Fatalf("err %v, want %q", err, c.errSub)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			c.check(t, p)
		})
	}
}

// TestQueueFromConfig: `queue -c` takes the first redis_queue input, else the first output, and its
// queue when it is a fixed name.
func TestQueueFromConfig(t *testing.T) {
	cases := []struct {
		name, yaml, url, queue, errSub string
	}{
		{"input before output", "input:\n  redis_queue: {url: 'redis://i:1', queue: qi, group: g}\noutput:\n  redis_queue: {url: 'redis://o:1', queue: qo}\n", "redis://i:1", "qi", ""},
		{"output with an interpolated queue", "output:\n  redis_queue: {url: 'redis://o:1'}\n", "redis://o:1", "", ""},
		{"no redis_queue", "input:\n  generate:\n    mapping: root = 1\n", "", "", "no redis_queue"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			conn, q, err := queueFromConfig(writeConfig(t, c.yaml))
			if c.errSub != "" {
				if err == nil || !strings.Contains(err.Error(), c.errSub) {
					t.Fatalf("err %v, want %q", err, c.errSub)
				}
				return
			}
			if err != nil || conn.URL != c.url || q != c.queue {
				t.Fatalf("url %q queue %q err %v", conn.URL, q, err)
			}
		})
	}
}

func TestResolveEnv(t *testing.T) {
	t.Setenv("PGRELAY_T_SET", "value")
	t.Setenv("PGRELAY_T_EMPTY", "")
	cases := []struct{ in, want string }{
		{"${PGRELAY_T_SET}", "value"},
		{"${PGRELAY_T_SET:default}", "value"},
		{"${PGRELAY_T_UNSET:redis://127.0.0.1:6379}", "redis://127.0.0.1:6379"},
		{"${PGRELAY_T_EMPTY:fallback}", "fallback"},
		{"${PGRELAY_T_UNSET}", ""},
		{"a ${PGRELAY_T_SET} b ${PGRELAY_T_UNSET:c}", "a value b c"},
		{`${! meta("queue") }`, `${! meta("queue") }`}, // interpolation, not an env reference
	}
	for _, c := range cases {
		if got := resolveEnv(c.in); got != c.want {
			t.Errorf("resolveEnv(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestMetricsURL(t *testing.T) {
	cases := []struct {
		name string
		doc  map[string]any
		want string
	}{
		{"no metrics section", map[string]any{"http": map[string]any{"address": "127.0.0.1:9"}}, ""},
		{"prometheus on the default address", map[string]any{"metrics": map[string]any{"prometheus": map[string]any{}}}, "http://127.0.0.1:4195/metrics"},
		{"prometheus on a set address", map[string]any{"metrics": map[string]any{"prometheus": nil}, "http": map[string]any{"address": "10.1.2.3:4196"}}, "http://10.1.2.3:4196/metrics"},
		{"http disabled", map[string]any{"metrics": map[string]any{"prometheus": nil}, "http": map[string]any{"enabled": false}}, ""},
		{"another exporter", map[string]any{"metrics": map[string]any{"json_api": nil}}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := metricsURL(c.doc); got != c.want {
				t.Fatalf("got %q, want %q", got, c.want)
			}
		})
	}
	t.Setenv(MetricsURLEnv, "http://127.0.0.1:1/metrics")
	if got := metricsURL(nil); got != "http://127.0.0.1:1/metrics" {
		t.Fatalf("env override: %q", got)
	}
}
