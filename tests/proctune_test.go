package tests

import (
	"context"
	"fmt"
	"regexp"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay/internal/cdctest"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

var gomaxprocsSeries = regexp.MustCompile(`(?m)^go_sched_gomaxprocs_threads (\d+)$`)

// TestBinaryGoProcessors: the binary starts on one Go processor (internal/proctune) and an idle
// pipeline stays there, as go_sched_gomaxprocs_threads shows on /metrics (add_go_metrics);
// GOMAXPROCS in the environment leaves the processors to Go. (The switch to Go's default under
// load and back is TestRunFollowsTheProcessCPU's, from injected CPU readings.)
func TestBinaryGoProcessors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, env, want string
	}{
		{name: "tuned", env: "GOMAXPROCS=", want: "1"},
		{name: "GOMAXPROCS set", env: "GOMAXPROCS=3", want: "3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			port := testenv.FreePort(t)
			cfg := writeConfig(t, "procs.yaml", fmt.Sprintf(`http:
  address: 127.0.0.1:%d
metrics:
  prometheus:
    add_go_metrics: true
input:
  generate:
    mapping: 'root = "x"'
    interval: 100ms
output:
  drop: {}
logger:
  level: warn
`, port))
			p := testenv.StartProcess(t, []string{tc.env}, testenv.Binary(t), "-c", cfg)
			url := fmt.Sprintf("http://127.0.0.1:%d/metrics", port)
			read := func() (string, string) {
				body, err := testenv.HTTPGet(context.Background(), url, 5*time.Second)
				if m := gomaxprocsSeries.FindStringSubmatch(body); err == nil && m != nil {
					return m[1], body
				}
				return "", fmt.Sprintf("%v\n%s", err, body)
			}
			var got, seen string
			cdctest.WaitEvery(t, 30*time.Second, 100*time.Millisecond, "go_sched_gomaxprocs_threads on /metrics", func() (bool, string) {
				got, seen = read()
				return got != "", seen
			})
			if got != tc.want {
				t.Fatalf("at start: go_sched_gomaxprocs_threads %s, want %s", got, tc.want)
			}
			time.Sleep(4 * time.Second) // longer than the tuner's RaiseAfter intervals
			if got, seen = read(); got != tc.want {
				t.Fatalf("after 4 s idle: go_sched_gomaxprocs_threads %q, want %s\n%s", got, tc.want, seen)
			}
			if p.Exited() {
				t.Fatalf("the binary exited:\n%s", p.Output())
			}
		})
	}
}
