package tests

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay/internal/cdctest"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// TestSourceStatusAndTeardown runs `pgrelay status` against a streaming source, then stops it
// and runs `pgrelay teardown`: the slot, the publication and the pointer are gone.
func TestSourceStatusAndTeardown(t *testing.T) {
	e := newCDCEnv(t, "cli", `[{table: w, queue: q}]`, "")
	e.pg.Exec(writerTable)
	p := e.start()
	e.waitPointer()
	var st struct {
		Owner      string                     `json:"owner"`
		SlotExists bool                       `json:"slot_exists"`
		Pointer    json.RawMessage            `json:"pointer"`
		Replicas   map[string]json.RawMessage `json:"replicas"`
		Lag        *int64                     `json:"slot_lag_bytes"`
	}
	cdctest.WaitEvery(t, 20*time.Second, 200*time.Millisecond, "the status to show a streaming owner", func() (bool, string) {
		out := runCLI(t, "status", "-c", e.config, "--json")
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			t.Fatalf("status output: %v\n%s", err, out)
		}
		streaming := false
		for _, v := range st.Replicas {
			streaming = streaming || strings.Contains(string(v), `"streaming"`)
		}
		return st.Owner != "" && st.SlotExists && len(st.Pointer) > 0 && st.Lag != nil && streaming, out
	})
	if out, err := exec.Command(testenv.Binary(t), "teardown", "-c", e.config).CombinedOutput(); err == nil {
		t.Fatalf("teardown while the source runs succeeded: %s", out)
	}
	p.Signal(syscall.SIGTERM)
	if err := p.Wait(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	runCLI(t, "teardown", "-c", e.config)
	var slots, pubs int
	e.pg.Pool().QueryRow(e.ctx, `SELECT count(*) FROM pg_replication_slots`).Scan(&slots)
	e.pg.Pool().QueryRow(e.ctx, `SELECT count(*) FROM pg_publication`).Scan(&pubs)
	if slots != 0 || pubs != 0 || e.pointer() != nil {
		t.Errorf("after teardown: %d slots, %d publications, pointer %v", slots, pubs, e.pointer())
	}
}

// TestSourceMetrics scrapes /metrics of a running pg_cdc: the source's counters and gauges move.
func TestSourceMetrics(t *testing.T) {
	e := newCDCEnv(t, "metrics", `[{table: w, queue: q}]`, "")
	port := testenv.FreePort(t)
	raw, _ := os.ReadFile(e.config)
	cfg := strings.Replace(string(raw), "http:\n  enabled: false\n", fmt.Sprintf("http:\n  address: 127.0.0.1:%d\nmetrics:\n  prometheus: {}\n", port), 1)
	os.WriteFile(e.config, []byte(cfg), 0o644)
	e.pg.Exec(writerTable)
	e.start()
	e.waitPointer()
	e.pg.Exec(`INSERT INTO w SELECT g, 'x' FROM generate_series(1, 10) g`)
	cdctest.WaitEvery(t, 30*time.Second, 200*time.Millisecond, "the source's metrics", func() (bool, string) {
		body, err := testenv.HTTPGet(e.ctx, fmt.Sprintf("http://127.0.0.1:%d/metrics", port), 5*time.Second)
		return err == nil && regexp.MustCompile(`(?m)^pgrelay_source_messages\{[^}]*\} 10$`).MatchString(body) &&
			regexp.MustCompile(`(?m)^pgrelay_source_owner\{[^}]*\} 1$`).MatchString(body) &&
			regexp.MustCompile(`(?m)^pgrelay_source_transactions\{[^}]*\} 1$`).MatchString(body) &&
			regexp.MustCompile(`(?m)^pgrelay_source_slot_lag_bytes\{[^}]*\} `).MatchString(body) &&
			regexp.MustCompile(`(?m)^pgrelay_source_pointer_lsn\{[^}]*\} [1-9]`).MatchString(body), fmt.Sprintf("%v\n%s", err, body)
	})
}
