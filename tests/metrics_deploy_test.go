package tests

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/pgrelay/pgrelay/internal/cdctest"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

const (
	rulesFile     = "deploy/prometheus/pgrelay-rules.yml"
	rulesTestFile = "deploy/prometheus/pgrelay-rules.test.yml"
	dashboardFile = "deploy/grafana/pgrelay-dashboard.json"
)

// promtool finds Debian's promtool (scripts/setup installs the prometheus package).
func promtool(t *testing.T) string {
	p, err := exec.LookPath("promtool")
	if err != nil {
		if testenv.InCI() {
			t.Fatal("promtool not found (run scripts/setup)")
		}
		t.Skip("promtool not found (run scripts/setup)")
	}
	return p
}

// TestPrometheusRules checks the shipped rules with promtool and runs their unit tests.
func TestPrometheusRules(t *testing.T) {
	bin := promtool(t)
	root := testenv.RepoRoot()
	for _, args := range [][]string{{"check", "rules", rulesFile}, {"test", "rules", rulesTestFile}} {
		cmd := exec.Command(bin, args...)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "SUCCESS") {
			t.Errorf("promtool %v: %v\n%s", args, err, out)
		}
	}
}

// promKeywords are the PromQL words that look like metric names.
var promKeywords = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true,
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true, "inf": true, "nan": true}

var (
	promStrings   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'`)
	promMatchers  = regexp.MustCompile(`\{[^}]*\}|\[[^\]]*\]`)
	promGrouping  = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promIdent     = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	scrapedSeries = regexp.MustCompile(`(?m)^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]`)
)

// promMetricNames lists the metric names a PromQL expression reads: identifiers that are not
// functions, keywords, label names or parts of strings, ranges and numbers.
func promMetricNames(expr string) []string {
	e := promStrings.ReplaceAllString(expr, `""`)
	e = promMatchers.ReplaceAllString(e, " ")
	e = promGrouping.ReplaceAllString(e, " ")
	var names []string
	for _, loc := range promIdent.FindAllStringIndex(e, -1) {
		if i := loc[0]; i > 0 && strings.ContainsRune("0123456789.$_", rune(e[i-1])) {
			continue // part of a number (1e9), a duration (15m) or a Grafana variable
		}
		if strings.HasPrefix(strings.TrimLeft(e[loc[1]:], " \t\n"), "(") {
			continue // a function
		}
		if n := e[loc[0]:loc[1]]; !promKeywords[strings.ToLower(n)] {
			names = append(names, n)
		}
	}
	return names
}

func TestPromMetricNames(t *testing.T) {
	cases := map[string]string{
		`sum by (source) (pgrelay_source_owner) < 1`:                                                   "pgrelay_source_owner",
		`max by (source, phase) (pgrelay_source_phase{phase="snapshot"}) == 1 and on (source) x_total`: "pgrelay_source_phase x_total",
		`sum by (sink) (rate(pg_sink_applied[$__rate_interval])) > 1e9`:                                "pg_sink_applied",
		`histogram_quantile(0.99, sum by (le) (rate(output_latency_ns_bucket{path=~"a.b"}[5m])))`:      "output_latency_ns_bucket",
		`a offset 15m unless ignoring(code) b`:                                                         "a b",
	}
	for expr, want := range cases {
		if got := strings.Join(promMetricNames(expr), " "); got != want {
			t.Errorf("%s: %q, want %q", expr, got, want)
		}
	}
}

// deployedMetricNames reads every metric name the rules and the dashboard query.
func deployedMetricNames(t *testing.T) map[string][]string {
	root := testenv.RepoRoot()
	used := map[string][]string{} // name → where
	raw, err := os.ReadFile(filepath.Join(root, rulesFile))
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert, Record, Expr string
			}
		}
	}
	if err := yaml.Unmarshal(raw, &rules); err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			for _, n := range promMetricNames(r.Expr) {
				used[n] = append(used[n], "rule "+r.Alert+r.Record)
			}
		}
	}
	raw, err = os.ReadFile(filepath.Join(root, dashboardFile))
	if err != nil {
		t.Fatal(err)
	}
	type panel struct {
		Title   string
		Targets []struct{ Expr string }
		Panels  []json.RawMessage
	}
	var dash struct {
		Panels     []panel
		Templating struct {
			List []struct {
				Name  string
				Type  string
				Query any
			}
		}
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	queries := 0
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			queries++
			for _, n := range promMetricNames(tg.Expr) {
				used[n] = append(used[n], "panel "+p.Title)
			}
		}
		if len(p.Panels) > 0 {
			t.Errorf("panel %q: keep rows expanded (collapsed rows hide their panels from this test)", p.Title)
		}
	}
	for _, v := range dash.Templating.List {
		if q, ok := v.Query.(string); ok && v.Type == "query" {
			for _, n := range promMetricNames(strings.TrimSuffix(strings.TrimPrefix(q, "label_values("), ")")) {
				used[n] = append(used[n], "variable "+v.Name)
			}
		}
	}
	if len(rules.Groups) == 0 || queries == 0 {
		t.Fatalf("no rules (%d groups) or no dashboard queries (%d)", len(rules.Groups), queries)
	}
	return used
}

// TestDeployedMetricsAreExported runs pg_cdc → redis_queue and redis_queue → pg_sink, each with the
// prometheus exporter, makes every metric appear (a snapshot, a keyless table refused, a sink paused by a missing target
// table, a target without one of the source's columns, a row the target's CHECK refuses so it is
// dead-lettered and the rows behind it blocked, a terminated walsender), and checks that each metric name the alert rules and the Grafana
// dashboard query is on one of the two /metrics pages.
func TestDeployedMetricsAreExported(t *testing.T) {
	used := deployedMetricNames(t)
	e := newCDCEnv(t, "metrics", `[{table: w, queue: q}, {table: w_nokey, queue: q}]`, "snapshot: initial\nchunk_rows: 10")
	srcPort, sinkPort := testenv.FreePort(t), testenv.FreePort(t)
	raw, _ := os.ReadFile(e.config)
	cfg := strings.Replace(string(raw), "http:\n  enabled: false\n", fmt.Sprintf("http:\n  address: 127.0.0.1:%d\nmetrics:\n  prometheus: {}\n", srcPort), 1)
	cfg = strings.Replace(cfg, "durability: aof\n", "durability: aof\n    shards: 1\n", 1)
	if err := os.WriteFile(e.config, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	e.pg.Exec(writerTable)
	e.pg.Exec(`INSERT INTO w (id, v) SELECT g, 'x' FROM generate_series(1, 30) g`)
	e.pg.Exec(`CREATE TABLE w_nokey (v text)`) // refused (no key, not append-only); w streams

	// the sink starts before its target table exists: paused
	sink := startSinkPipeline(t, fmt.Sprintf(`http: {address: "127.0.0.1:%d"}
metrics: {prometheus: {}}
logger: {level: warn}
input:
  redis_queue: {url: %s, queue: q, group: copy, max_attempts: 1, lease_ttl: 3s}
output:
  pg_sink: {dsn: %q, name: copy, table: public.w_copy, mode: cdc}
`, sinkPort, e.rd.URL(), e.pg.DSN()))
	scrape := func(port int) string {
		body, err := testenv.HTTPGet(e.ctx, fmt.Sprintf("http://127.0.0.1:%d/metrics", port), 10*time.Second)
		if err != nil {
			t.Fatalf("scrape :%d: %v", port, err)
		}
		return body
	}
	paused := func(v string) *regexp.Regexp {
		return regexp.MustCompile(`(?m)^pg_sink_paused\{[^}]*sink="copy"[^}]*\} ` + v + `$`)
	}
	cdctest.WaitEvery(t, 60*time.Second, 250*time.Millisecond, "pg_sink_paused 1 while the target is missing", func() (bool, string) {
		body := scrape(sinkPort)
		return paused("1").MatchString(body), lastBytes(sink.Output(), 1000)
	})
	// without g: the sink leaves it out and counts it (pg_sink_unknown_keys)
	e.pg.Exec(`CREATE TABLE w_copy (id int PRIMARY KEY, v text CHECK (v NOT LIKE 'poison%'), n numeric, j jsonb)`)

	e.start()
	e.waitPointer()
	// The snapshot ends first: a chunk read after the insert would carry the poison row again (a
	// second dead letter).
	cdctest.Wait(t, 60*time.Second, "the snapshot done", func() (bool, string) {
		c, ok := e.snapshotCursor()
		return ok && c == nil, fmt.Sprintf("cursor %+v", c)
	})
	e.pg.Exec(`BEGIN; INSERT INTO w (id, v) VALUES (100, 'poison'), (101, 'a'), (102, 'b'); COMMIT`)
	cdctest.WaitEvery(t, 60*time.Second, 250*time.Millisecond, "a dead letter", func() (bool, string) {
		n, _ := e.rd.Client().XLen(e.ctx, "pgrelay:{q}:dlq").Result()
		return n == 1, fmt.Sprintf("%d dead letters", n)
	})
	// a terminated walsender is a transient source error
	e.pg.Exec(`SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE active_pid IS NOT NULL`)

	var missing []string
	cdctest.WaitEvery(t, 90*time.Second, 250*time.Millisecond, "every metric of the rules and the dashboard", func() (bool, string) {
		exported := map[string]bool{}
		both := scrape(srcPort) + scrape(sinkPort)
		for _, m := range scrapedSeries.FindAllStringSubmatch(both, -1) {
			exported[m[1]] = true
		}
		missing = missing[:0]
		for n, where := range used {
			if !exported[n] {
				missing = append(missing, fmt.Sprintf("%s (%s)", n, strings.Join(where, ", ")))
			}
		}
		sort.Strings(missing)
		return len(missing) == 0 && paused("0").MatchString(both), strings.Join(missing, "; ")
	})
	t.Logf("%d metric names of the rules and the dashboard are exported", len(used))
	var rows int
	if err := e.pg.Pool().QueryRow(e.ctx, `SELECT count(*) FROM w_copy`).Scan(&rows); err != nil || rows != 32 {
		t.Errorf("w_copy has %d rows (%v), want the 30 snapshotted and the 2 after the poison", rows, err)
	}
}
