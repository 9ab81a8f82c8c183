package tests

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"syscall"
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

// TestReadAgainCountsAPublicationError: a table taken out of the publication while pgrelay was
// stopped is read again at the next start, and that start counts one publication error on /metrics
// (pgrelay_source_errors{code="publication"}), so the PgrelaySourceErrorCodes alert fires although
// no session ended on it.
func TestReadAgainCountsAPublicationError(t *testing.T) {
	e := newCDCEnv(t, "rejoinmetric", `[{table: w, queue: q}]`, "snapshot: initial")
	port := testenv.FreePort(t)
	raw, _ := os.ReadFile(e.config)
	cfg := strings.Replace(string(raw), "http:\n  enabled: false\n", fmt.Sprintf("http:\n  address: 127.0.0.1:%d\nmetrics:\n  prometheus: {}\n", port), 1)
	if err := os.WriteFile(e.config, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	e.pg.Exec(writerTable)
	e.pg.Exec(`INSERT INTO w SELECT g, 'x' FROM generate_series(1, 5) g`)
	p := e.start()
	e.waitPointer()
	e.converge("public.w", "id")
	p.Signal(syscall.SIGTERM)
	if err := p.Wait(60 * time.Second); err != nil && !strings.Contains(err.Error(), "exit status") {
		t.Fatalf("pgrelay did not stop within 60 s of SIGTERM: %v", err)
	}
	var pub string
	if err := e.pg.Pool().QueryRow(e.ctx, `SELECT pubname FROM pg_publication_tables WHERE tablename = 'w'`).Scan(&pub); err != nil {
		t.Fatal(err)
	}
	e.pg.Exec(fmt.Sprintf(`ALTER PUBLICATION %q DROP TABLE w`, pub))
	e.pg.Exec(`INSERT INTO w SELECT g, 'y' FROM generate_series(6, 8) g`) // while out: never sent
	e.start()
	errors := regexp.MustCompile(`(?m)^pgrelay_source_errors\{[^}]*code="publication"[^}]*\} 1$`)
	cdctest.WaitEvery(t, 30*time.Second, 200*time.Millisecond, "one publication error on /metrics", func() (bool, string) {
		body, err := testenv.HTTPGet(e.ctx, fmt.Sprintf("http://127.0.0.1:%d/metrics", port), 5*time.Second)
		return err == nil && errors.MatchString(body), fmt.Sprintf("%v\n%s", err, body)
	})
	e.converge("public.w", "id") // rows 6–8 only through the re-read
}
