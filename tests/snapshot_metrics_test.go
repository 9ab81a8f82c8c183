package tests

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay/internal/cdctest"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// TestSnapshotMetrics: a 250-row table snapshotted in 100-row chunks shows
// pgrelay_source_snapshot_rows 250 and pgrelay_source_snapshot_tables 1 on /metrics, and the
// queue holds 250 r events.
func TestSnapshotMetrics(t *testing.T) {
	e := newCDCEnv(t, "snapmetrics", `[{table: w, queue: q}]`, "snapshot: initial\nchunk_rows: 100")
	port := testenv.FreePort(t)
	raw, _ := os.ReadFile(e.config)
	cfg := strings.Replace(string(raw), "http:\n  enabled: false\n", fmt.Sprintf("http:\n  address: 127.0.0.1:%d\nmetrics:\n  prometheus: {}\n", port), 1)
	if err := os.WriteFile(e.config, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	e.pg.Exec(writerTable)
	e.pg.Exec(`INSERT INTO w SELECT g, 'x' FROM generate_series(1, 250) g`)
	e.start()
	e.waitPointer()
	cdctest.WaitEvery(t, 30*time.Second, 200*time.Millisecond, "the snapshot's metrics", func() (bool, string) {
		body, err := testenv.HTTPGet(e.ctx, fmt.Sprintf("http://127.0.0.1:%d/metrics", port), 5*time.Second)
		return err == nil && regexp.MustCompile(`(?m)^pgrelay_source_snapshot_rows\{[^}]*\} 250$`).MatchString(body) &&
			regexp.MustCompile(`(?m)^pgrelay_source_snapshot_tables\{[^}]*\} 1$`).MatchString(body), fmt.Sprintf("%v\n%s", err, body)
	})
	res := e.converge("public.w", "id")
	if res.Events != 250 {
		t.Errorf("%d events, want 250 r", res.Events)
	}
}
