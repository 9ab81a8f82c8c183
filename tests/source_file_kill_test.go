package tests

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay/internal/cdctest"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// fileRun is one life of pg_cdc → Benthos' file output (an output that does not write the
// source's pointer: pg_cdc writes it after the ack, in the background), each life into its own
// file so a line cut by a SIGKILL never merges with the next life's first line.
func (e *cdcEnv) fileRun(dir string, n int) *testenv.Process {
	e.t.Helper()
	cfg := filepath.Join(dir, fmt.Sprintf("run%d.yaml", n))
	yaml := fmt.Sprintf(`input:
  pg_cdc:
    name: %s
    dsn: %s
    tls: {mode: disable}
    tables: [{table: w, queue: %s}]
    redis: {url: %s}
    lease_ttl: 3s
    heartbeat: 1s
    snapshot: initial
    chunk_rows: 100
    max_bundle_messages: 20
pipeline:
  processors:
    - mapping: 'root = this.after.id.string() + " " + @lsn'
output:
  file:
    path: %s
    codec: lines
http: {enabled: false}
shutdown_timeout: 20s
logger: {level: info}
`, e.name, e.pg.DSN(), e.queue, e.rd.URL(), filepath.Join(dir, fmt.Sprintf("out%d.txt", n)))
	if err := os.WriteFile(cfg, []byte(yaml), 0o644); err != nil {
		e.t.Fatal(err)
	}
	return testenv.StartProcess(e.t, nil, testenv.Binary(e.t), "-c", cfg)
}

// delivered reads the ids every life's file holds (a line cut by a kill is skipped: its batch was
// not acknowledged, so it is delivered again).
func delivered(t *testing.T, dir string) map[int64]bool {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, "out*.txt"))
	ids := map[int64]bool{}
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			id, lsn, ok := strings.Cut(sc.Text(), " ")
			if !ok || !strings.Contains(lsn, "/") {
				continue
			}
			if v, err := strconv.ParseInt(id, 10, 64); err == nil {
				ids[v] = true
			}
		}
		fh.Close()
	}
	return ids
}

// TestFileOutputSurvivesSIGKILL: pg_cdc into the file output (at-least-once: pg_cdc writes the
// pointer after each ack, in the background) is SIGKILLed twice inside a snapshot and twice in the
// stream while a writer inserts rows throughout. Every row, snapshotted or streamed, is in the
// files in the end (each restart resumed at or before everything not yet delivered), and the
// slot's confirmed_flush_lsn was never past the pointer.
func TestFileOutputSurvivesSIGKILL(t *testing.T) {
	e := newCDCEnv(t, "filekill", `[{table: w, queue: q}]`, "")
	dir := t.TempDir()
	e.pg.Exec(`CREATE TABLE w (id bigint PRIMARY KEY, v text)`)
	e.pg.Exec(`INSERT INTO w SELECT i, repeat('x', 50) FROM generate_series(1, 40000) i`)
	stop := make(chan struct{})
	var inserted atomic.Int64 // ids 100001 .. 100000+inserted are committed
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		for id := int64(100001); ; id++ {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
			if _, err := e.pg.Pool().Exec(e.ctx, `INSERT INTO w VALUES ($1, 'y')`, id); err != nil {
				t.Errorf("insert %d: %v", id, err)
				return
			}
			inserted.Store(id - 100000)
		}
	}()
	slotStop := make(chan struct{})
	samples, waitSlot := e.sampleSlot(slotStop)
	run := 0
	p := e.fileRun(dir, run)
	e.waitPointer()
	rows := int64(0)
	for i := 0; i < 2; i++ {
		if rows = e.waitSnapshotRows(rows, 300); rows < 0 {
			t.Fatalf("the snapshot ended before kill %d: make the table bigger", i+1)
		}
		p.Kill()
		t.Logf("killed inside the snapshot at %d rows", rows)
		run++
		p = e.fileRun(dir, run)
	}
	cdctest.WaitEvery(t, 90*time.Second, 100*time.Millisecond, "the snapshot to finish", func() (bool, string) {
		c, ok := e.snapshotCursor()
		return ok && c == nil, fmt.Sprintf("cursor %+v", c)
	})
	rng := rand.New(rand.NewPCG(5, 5))
	for i := 0; i < 2; i++ {
		time.Sleep(time.Duration(500+rng.IntN(700)) * time.Millisecond)
		p.Kill()
		run++
		p = e.fileRun(dir, run)
	}
	time.Sleep(500 * time.Millisecond)
	close(stop)
	<-writerDone
	last := 100000 + inserted.Load()
	cdctest.WaitEvery(t, 90*time.Second, 250*time.Millisecond, "every row in the files", func() (bool, string) {
		ids := delivered(t, dir)
		missing, first := 0, int64(0)
		for id := int64(1); id <= last; id++ {
			if id == 40001 {
				id = 100001
			}
			if !ids[id] {
				if missing == 0 {
					first = id
				}
				missing++
			}
		}
		return missing == 0, fmt.Sprintf("%d rows missing, the first %d", missing, first)
	})
	p.Signal(syscall.SIGTERM)
	if err := p.Wait(30 * time.Second); err != nil {
		t.Errorf("stop: %v\n%s", err, p.Output())
	}
	close(slotStop)
	waitSlot()
	if samples.Load() < 10 {
		t.Errorf("only %d samples of the slot against the pointer", samples.Load())
	}
	t.Logf("%d lives, %d streamed rows, %d slot samples", run+1, last-100000, samples.Load())
}
