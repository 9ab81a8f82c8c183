package tests

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgrelay/pgrelay/internal/queue"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// sinkStatusJSON is the part of `pgrelay status --json` for a sink config that the test reads.
type sinkStatusJSON struct {
	Sinks []struct {
		Name     string `json:"name"`
		Progress []struct {
			Queue      string `json:"queue"`
			Shard      int    `json:"shard"`
			LastOffset int64  `json:"last_offset"`
		} `json:"progress"`
		Live *struct {
			Applied int64  `json:"applied"`
			Skipped int64  `json:"skipped"`
			Batches int64  `json:"batches"`
			Problem string `json:"scrape_error"`
		} `json:"live"`
		Problem string `json:"postgres_error"`
	} `json:"sinks"`
	Groups []struct {
		Queue       string `json:"queue"`
		Group       string `json:"group"`
		Shards      int    `json:"shards"`
		Lag         int64  `json:"lag"`
		Pending     int64  `json:"pending"`
		DeadLetters int64  `json:"dead_letters"`
		Replicas    int64  `json:"replicas"`
		Problem     string `json:"redis_error"`
		ShardInfo   []struct {
			Shard      int    `json:"shard"`
			LastOffset int64  `json:"last_offset"`
			Applied    *int64 `json:"applied_offset"`
			Behind     *int64 `json:"behind"`
			Owner      string `json:"owner"`
		} `json:"shard_info"`
	} `json:"groups"`
}

// runStatus runs `pgrelay status -c config [--json]` and returns its output and exit code.
func runStatus(t *testing.T, config string, asJSON bool) (string, int) {
	t.Helper()
	args := []string{"status", "-c", config}
	if asJSON {
		args = append(args, "--json")
	}
	cmd := exec.Command(testenv.Binary(t), args...)
	out, err := cmd.Output()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
		out = append(out, ee.Stderr...)
	} else if err != nil {
		t.Fatal(err)
	}
	return string(out), code
}

// TestSinkStatusThroughTheBinary: `pgrelay status -c <sink config>` before the sink ever ran says
// what is missing (exit 1); once the sink has copied A into B it shows, per shard, the offset applied
// (equal to the progress rows and to the shard's last offset), the group's lag and pending (0), the
// shard owners and this group's dead letters only, as JSON and as text.
func TestSinkStatusThroughTheBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test")
	}
	rt := newRoundTrip(t, "status")
	dsnB := rt.database("b")
	port := testenv.FreePort(t)
	config := writeConfig(t, "sink.yaml", strings.Replace(rt.sinkConfig(dsnB, "copy_b", "copy_b"), "http: { enabled: false }",
		fmt.Sprintf("http: { address: 127.0.0.1:%d }\nmetrics: { prometheus: {} }", port), 1))

	out, code := runStatus(t, config, false)
	if code != 1 || !strings.Contains(out, "progress table pgrelay.sink_progress does not exist") {
		t.Fatalf("status before the sink ran: exit %d\n%s", code, out)
	}

	p := testenv.StartProcess(t, nil, testenv.Binary(t), "-c", config)
	committed := rt.writers(3, 2*time.Second)()
	rt.waitSourceDone()
	rt.waitApplied("b", "copy_b", p)
	t.Logf("%d transactions copied", committed)

	// two dead letters in the queue's dead-letter stream, one of this group
	for _, g := range []string{"copy_b", "another_group"} {
		rt.rd.Client().XAdd(rt.ctx, &redis.XAddArgs{Stream: queue.NewLayout("pgrelay").DLQ("q"),
			Values: []string{"off", "1", "p", "x", "id", "dead-" + g, "tx", "", "ts", "0", "h", "", "d", "{}",
				"group", g, "error", "23514: test", "attempts", "3", "failed_at", "0"}})
	}

	out, code = runStatus(t, config, true)
	if code != 0 {
		t.Fatalf("status --json: exit %d\n%s", code, out)
	}
	var st sinkStatusJSON
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	info, err := queue.Inspect(rt.ctx, rt.rd.Client(), queue.NewLayout("pgrelay"), "q")
	if err != nil {
		t.Fatal(err)
	}
	progress := rt.progress("b", "copy_b")
	if len(st.Sinks) != 1 || st.Sinks[0].Name != "copy_b" || st.Sinks[0].Problem != "" || len(st.Sinks[0].Progress) != len(progress) {
		t.Fatalf("sinks: %s", out)
	}
	var sum int64
	for _, pr := range st.Sinks[0].Progress {
		if pr.Queue != "q" || progress[pr.Shard] != pr.LastOffset {
			t.Errorf("progress row %+v, table says %d", pr, progress[pr.Shard])
		}
		sum += pr.LastOffset
	}
	// one process, never restarted: it applied every entry once and skipped none
	if l := st.Sinks[0].Live; l == nil || l.Problem != "" || l.Applied != sum || l.Skipped != 0 || l.Batches == 0 {
		t.Errorf("live counters %+v, want applied %d (the sum of the progress rows)", l, sum)
	}
	if len(st.Groups) != 1 {
		t.Fatalf("groups: %s", out)
	}
	g := st.Groups[0]
	if g.Group != "copy_b" || g.Queue != "q" || g.Shards != info.Shards || g.Lag != 0 || g.Pending != 0 || g.DeadLetters != 1 || g.Replicas != 1 || g.Problem != "" {
		t.Fatalf("group: %+v", g)
	}
	for i, s := range g.ShardInfo {
		want := info.ShardInfo[i].LastOffset
		if s.Shard != i || s.LastOffset != want || s.Applied == nil || *s.Applied != progress[i] || *s.Applied != want || *s.Behind != 0 || s.Owner == "" {
			t.Errorf("shard %d: %+v (last offset %d, progress %d)", i, s, want, progress[i])
		}
	}

	out, code = runStatus(t, config, false)
	if code != 0 || !strings.Contains(out, "sink copy_b (mode cdc into public.rt; progress in pgrelay.sink_progress)") ||
		!strings.Contains(out, "group copy_b on queue q: 16 shards, lag 0, pending 0, dead letters 1, live replicas 1") {
		t.Fatalf("status: exit %d\n%s", code, out)
	}
	t.Logf("pgrelay status:\n%s", out)
}
