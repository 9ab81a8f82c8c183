// Package tests holds end-to-end and fault tests that run the real pgrelay binary.
package tests

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay/internal/cdctest"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

func TestVersionNamesPgrelayAndEngine(t *testing.T) {
	out, err := exec.Command(testenv.Binary(t), "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	first, _, _ := strings.Cut(string(out), "\n")
	if !regexp.MustCompile(`^pgrelay \S+ \(benthos engine v4\.60\.0\)$`).MatchString(first) {
		t.Fatalf("--version printed %q, want `pgrelay <version> (benthos engine v4.60.0)` first", out)
	}
}

func TestLintReportsUnknownFieldWithFileAndLine(t *testing.T) {
	bad := writeConfig(t, "bad.yaml", "input:\n  generate:\n    mapping: 'root = 1'\n    cuont: 3\noutput:\n  drop: {}\n")
	out, err := exec.Command(testenv.Binary(t), "lint", bad).CombinedOutput()
	if err == nil {
		t.Fatalf("lint passed a bad config: %s", out)
	}
	if !regexp.MustCompile(regexp.QuoteMeta(bad) + `\(4,\d+\) .*cuont`).Match(out) {
		t.Fatalf("lint output lacks file(line,col): %s", out)
	}
}

func TestLintPassesShippedConfigs(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join(testenv.RepoRoot(), "config", "*.yaml"))
	demo, _ := filepath.Glob(filepath.Join(testenv.RepoRoot(), "config", "demo", "*.yaml"))
	files = append(files, demo...)
	if len(files) == 0 {
		t.Fatal("no configs in config/")
	}
	args := append([]string{"lint"}, files...)
	runCLI(t, args...)
}

// TestMetricsEndpointServesPrometheus runs pgrelay and scrapes /metrics.
func TestMetricsEndpointServesPrometheus(t *testing.T) {
	port := testenv.FreePort(t)
	cfg := writeConfig(t, "c.yaml", fmt.Sprintf(`
http:
  address: 127.0.0.1:%d
input:
  label: gen
  generate:
    interval: 10ms
    mapping: 'root = {"n": counter()}'
output:
  label: sink
  drop: {}
metrics:
  prometheus: {}
`, port))
	testenv.StartProcess(t, nil, testenv.Binary(t), "-c", cfg)
	re := regexp.MustCompile(`(?m)^output_sent\{label="sink",path="root.output"\} ([0-9.e+]+)$`)
	cdctest.WaitEvery(t, 30*time.Second, 200*time.Millisecond, "Benthos counters in /metrics", func() (bool, string) {
		body, err := testenv.HTTPGet(context.Background(), fmt.Sprintf("http://127.0.0.1:%d/metrics", port), 20*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		m := re.FindStringSubmatch(body)
		return m != nil && m[1] != "0" &&
			strings.Contains(body, "# TYPE input_received counter") &&
			strings.Contains(body, `input_received{label="gen",path="root.input"}`), body
	})
}

// TestCLIOutputCarriesNoRedisClientLog: against a Redis that cannot be reached, `pgrelay queue` and
// `pgrelay status` print their one error, without go-redis' own log lines (its pool logs every
// failed dial).
func TestCLIOutputCarriesNoRedisClientLog(t *testing.T) {
	url := fmt.Sprintf("redis://127.0.0.1:%d", testenv.FreePort(t)) // nothing listens there
	cfg := writeConfig(t, "c.yaml", fmt.Sprintf("input:\n  redis_queue: {url: %q, queue: q, group: g}\noutput:\n  drop: {}\n", url))
	for _, args := range [][]string{
		{"queue", "info", "--url", url, "--timeout", "3s", "q"},
		{"queue", "dlq", "-c", cfg, "--timeout", "3s"},
		{"status", "-c", cfg},
	} {
		out, err := exec.Command(testenv.Binary(t), args...).CombinedOutput()
		if err == nil {
			t.Fatalf("pgrelay %s succeeded without Redis: %s", strings.Join(args, " "), out)
		}
		if !strings.Contains(string(out), "connection refused") || strings.Contains(string(out), "redis: 20") || strings.Contains(string(out), "connection pool") {
			t.Errorf("pgrelay %s printed:\n%s\nwant its own error only, without go-redis log lines", strings.Join(args, " "), out)
		}
	}
}
