package source_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/pgrelay/pgrelay/input"
	"github.com/pgrelay/pgrelay/internal/cdctest"
	"github.com/pgrelay/pgrelay/internal/source"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

var progressLine = regexp.MustCompile(`snapshot of public\.p \(table 1 of 1\): (\d+) of ~(\d+) rows \(([0-9.]+)%\), (\d+) rows/s(, ETA ([0-9hms.]+))?`)

// A snapshot logs its progress (table, rows of the estimate, percent, rate, time left) and records
// it in the status, where `pgrelay status` reads it with the pointer's fields. The progress period
// is shortened to every chunk here; the output holds a batch so the status is read mid-snapshot.
func TestSnapshotProgressInTheLogAndTheStatus(t *testing.T) {
	defer source.SetProgressEvery(source.SetProgressEvery(0))
	e := newEnv(t)
	e.pg.Exec(`CREATE TABLE p (id int PRIMARY KEY, v text);
		INSERT INTO p SELECT g, 'row ' || g FROM generate_series(1, 1200) g;
		ANALYZE p`)
	section := e.section("prog", "p", "snapshot: initial\nchunk_rows: 100\nmax_bundle_messages: 100")
	logs := &testenv.SyncBuffer{}
	b := service.NewStreamBuilder()
	b.SetLogger(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})))
	if err := b.AddInputYAML("pg_cdc:\n" + indent(section)); err != nil {
		t.Fatal(err)
	}
	hold, release := make(chan struct{}), make(chan struct{})
	var batches int
	if err := b.AddBatchConsumerFunc(func(ctx context.Context, batch service.MessageBatch) error {
		if batches++; batches == 8 {
			close(hold)
			<-release
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	stream, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		stream.Run(context.Background())
	}()
	defer func() {
		cdctest.StopAndWait(t, stream, done, 20*time.Second)
	}()
	select {
	case <-hold:
	case <-time.After(60 * time.Second):
		t.Fatalf("the snapshot never reached its 8th batch; logs:\n%s", logs)
	}

	// The status, as `pgrelay status --json` prints it, while the 8th chunk is held.
	cfg := sourceConfig(t, section)
	st, err := source.ReadStatus(e.ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(st)
	var got struct {
		Phase      string `json:"phase"`
		Epoch      string `json:"epoch"`
		Generation int    `json:"generation"`
		LSN        string `json:"lsn"`
		LagBytes   *int64 `json:"lag_bytes"`
		Snapshot   *struct {
			Table      string  `json:"table"`
			RowsDone   int64   `json:"rows_done"`
			Estimate   int64   `json:"estimate"`
			Percent    float64 `json:"percent"`
			RowsPerSec float64 `json:"rows_per_s"`
			At         string  `json:"at"`
		} `json:"snapshot"`
	}
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatal(err)
	}
	_, lsnErr := pglogrepl.ParseLSN(got.LSN)
	if got.Phase != "snapshot" || !regexp.MustCompile(`^[0-9a-f]{8}$`).MatchString(got.Epoch) || got.Generation != 1 || lsnErr != nil ||
		got.LagBytes == nil || *got.LagBytes < 0 {
		t.Errorf("status fields: %s", raw)
	}
	if s := got.Snapshot; s == nil || s.Table != "public.p" || s.Estimate != 1200 || s.RowsDone < 100 || s.RowsDone >= 1200 ||
		s.Percent != float64(s.RowsDone)*100/1200 || s.RowsPerSec <= 0 || s.At == "" {
		t.Errorf("status snapshot: %s", raw)
	}
	close(release)
	e.waitSnapshotDone("prog", "q", 60*time.Second)

	// The log's progress lines: every field present and plausible, rows growing.
	lines := progressLine.FindAllStringSubmatch(logs.String(), -1)
	if len(lines) < 7 {
		t.Fatalf("%d progress lines, want one per chunk; logs:\n%s", len(lines), logs)
	}
	var last int64
	for _, l := range lines {
		rows, _ := strconv.ParseInt(l[1], 10, 64)
		est, _ := strconv.ParseInt(l[2], 10, 64)
		pct, _ := strconv.ParseFloat(l[3], 64)
		rate, _ := strconv.ParseInt(l[4], 10, 64)
		if rows < last || rows > 1200 || est != 1200 || fmt.Sprintf("%.1f", float64(rows)*100/1200) != l[3] || pct > 100 || rate <= 0 ||
			(rows < 1200 && l[6] == "") {
			t.Errorf("progress line: %s", l[0])
		}
		last = rows
	}
}

// TestQueueLagIsZeroWhenCaughtUp: the status's lag_bytes of an idle source that has caught up
// reaches 0 (the pointer's lsn is inclusive: an idle advance to WAL end W stores W−1), and is never
// negative.
func TestQueueLagIsZeroWhenCaughtUp(t *testing.T) {
	e := newEnv(t)
	e.pg.Exec(`CREATE TABLE idle (id int PRIMARY KEY)`)
	section := e.section("idle", "idle", "")
	stop := startStream(t, "input:\n  pg_cdc:\n"+cdctest.Indent(section, "    ")+"output:\n  drop: {}\n")
	defer stop()
	e.pg.Exec(`INSERT INTO idle VALUES (1)`)
	cfg := sourceConfig(t, section)
	var seen []int64
	cdctest.WaitEvery(t, 60*time.Second, 50*time.Millisecond, "lag_bytes 0", func() (bool, string) {
		st, err := source.ReadStatus(e.ctx, cfg)
		if err != nil || st.LagBytes == nil {
			return false, fmt.Sprint(err)
		}
		if *st.LagBytes < 0 {
			t.Fatalf("lag_bytes %d", *st.LagBytes)
		}
		if len(seen) < 20 {
			seen = append(seen, *st.LagBytes)
		}
		return *st.LagBytes == 0, fmt.Sprint(seen)
	})
}

// sourceConfig is the source config of a pg_cdc section, as `pgrelay status` reads it.
// section is the pg_cdc config section of source name streaming table into queue q on e's servers
// (lease_ttl 3s, heartbeat 1s), then the lines of extra.
func (e *env) section(name, table, extra string) string {
	s := fmt.Sprintf("name: %s\ndsn: %s\ntls: {mode: disable}\ntables: [{table: %s, queue: q}]\nredis: {url: %s}\nlease_ttl: 3s\nheartbeat: 1s",
		name, e.pg.DSN(), table, e.rd.URL())
	if extra != "" {
		s += "\n" + extra
	}
	return s
}

func sourceConfig(t *testing.T, section string) source.Config {
	t.Helper()
	parsed, err := input.PgCDCSpec().ParseYAML(section, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := input.PgCDCConfigFromParsed(parsed)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}
