package tests

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay/internal/cdctest"
	"github.com/pgrelay/pgrelay/internal/oracle"
	"github.com/pgrelay/pgrelay/internal/snapshot"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// snapshotCursor is the pointer's snapshot cursor (nil when none runs or no pointer).
func (e *cdcEnv) snapshotCursor() (*snapshot.Cursor, bool) {
	p := e.pointer()
	if p == nil {
		return nil, false
	}
	if len(p.Snapshot) == 0 || string(p.Snapshot) == "null" {
		return nil, true
	}
	var c snapshot.Cursor
	if err := json.Unmarshal(p.Snapshot, &c); err != nil {
		e.t.Fatalf("snapshot cursor %s: %v", p.Snapshot, err)
	}
	return &c, true
}

// waitSnapshotRows waits until the snapshot cursor has moved at least n rows past from, or the
// snapshot is over; it returns the rows done (-1 when over).
func (e *cdcEnv) waitSnapshotRows(from, n int64) int64 {
	e.t.Helper()
	rows := int64(-1)
	cdctest.WaitEvery(e.t, 60*time.Second, 20*time.Millisecond, fmt.Sprintf("the snapshot past %d rows", from+n), func() (bool, string) {
		c, ok := e.snapshotCursor()
		if ok && c == nil {
			return true, ""
		}
		if c != nil && c.Rows >= from+n {
			rows = c.Rows
			return true, ""
		}
		return false, fmt.Sprintf("cursor %+v", c)
	})
	return rows
}

// TestSnapshotSurvivesSIGKILL: a random writer starts before pgrelay and runs throughout; pgrelay
// (100-row chunks) is SIGKILLed twice inside the snapshot and three times in the stream. The queue
// holds one epoch, every id once, no key read twice by the snapshot (no re-snapshot, no repeated
// chunk), and replays to the table.
func TestSnapshotSurvivesSIGKILL(t *testing.T) {
	e := newCDCEnv(t, "snapkill", `[{table: w, queue: q}]`, "snapshot: initial\nchunk_rows: 100\nmax_bundle_messages: 50")
	e.pg.Exec(writerTable)
	e.pg.Exec(`INSERT INTO w SELECT i, 'pre' || i, i * 1.5, '{"a": 1}', i % 5 FROM generate_series(600, 40599) i`)
	e.pg.Exec(`ANALYZE w`)
	stopWriter := make(chan struct{})
	wait := e.randomWriter(99, stopWriter)
	time.Sleep(300 * time.Millisecond)
	p := e.start()
	e.waitPointer()
	rows := int64(0)
	for i := 0; i < 2; i++ {
		if rows = e.waitSnapshotRows(rows, 300); rows < 0 {
			t.Fatalf("the snapshot ended before kill %d: make the table bigger", i+1)
		}
		if i == 0 {
			e.checkSnapshotStatus(rows)
		}
		p.Kill()
		time.Sleep(200 * time.Millisecond)
		p = e.start()
		t.Logf("killed inside the snapshot at %d rows", rows)
	}
	cdctest.WaitEvery(t, 90*time.Second, 100*time.Millisecond, "the snapshot to finish", func() (bool, string) {
		c, ok := e.snapshotCursor()
		return ok && c == nil, fmt.Sprintf("cursor %+v", c)
	})
	rng := rand.New(rand.NewPCG(8, 8))
	for i := 0; i < 3; i++ {
		time.Sleep(time.Duration(700+rng.IntN(800)) * time.Millisecond)
		p.Kill()
		time.Sleep(time.Duration(rng.IntN(300)) * time.Millisecond)
		p = e.start()
	}
	time.Sleep(time.Second)
	close(stopWriter)
	committed := wait()
	res := e.converge("public.w", "id")
	entries, err := oracle.ReadQueue(e.ctx, e.rd.Client(), "pgrelay", e.queue)
	if err != nil {
		t.Fatal(err)
	}
	epochs := map[string]int{}
	readKeys := map[string]string{}
	reads := 0
	for _, en := range entries {
		parts := strings.Split(en.ID, ":")
		epochs[parts[1]]++
		if parts[2] != "s" {
			continue
		}
		var ev oracle.Event
		if err := json.Unmarshal(en.Payload, &ev); err != nil {
			t.Fatal(err)
		}
		if ev.Op != "r" {
			continue
		}
		reads++
		k := oracle.KeyText(ev.Key)
		if prev, seen := readKeys[k]; seen {
			t.Errorf("key %s read twice by the snapshot: %s and %s", k, prev, en.ID)
		}
		readKeys[k] = en.ID
	}
	if len(epochs) != 1 {
		t.Errorf("epochs in the queue: %v", epochs)
	}
	if ptr := e.pointer(); ptr == nil || ptr.Gen != 1 {
		t.Errorf("pointer generation: %+v", ptr)
	}
	if reads < 39000 {
		t.Errorf("only %d snapshot reads of ~40,000 rows", reads)
	}
	t.Logf("%d transactions, %d events, %d snapshot reads", committed, res.Events, reads)
}

// checkSnapshotStatus runs `pgrelay status --json` during the snapshot: the table, rows done (at
// least what the pointer showed), the reltuples estimate and the percent, and phase snapshot.
func (e *cdcEnv) checkSnapshotStatus(atLeast int64) {
	e.t.Helper()
	out, err := exec.Command(testenv.Binary(e.t), "status", "-c", e.config, "--json").CombinedOutput()
	if err != nil {
		e.t.Fatalf("status: %v\n%s", err, out)
	}
	var st struct {
		Replicas map[string]json.RawMessage `json:"replicas"`
		Snapshot *struct {
			Table    string  `json:"table"`
			RowsDone int64   `json:"rows_done"`
			Estimate int64   `json:"estimate"`
			Percent  float64 `json:"percent"`
		} `json:"snapshot"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		e.t.Fatalf("status output: %v\n%s", err, out)
	}
	sp := st.Snapshot
	if sp == nil || sp.Table != "public.w" || sp.RowsDone < atLeast || sp.Estimate < 30000 || sp.Percent <= 0 || sp.Percent >= 100 {
		e.t.Errorf("snapshot progress in status: %s", out)
	}
	phase := false
	for _, v := range st.Replicas {
		var r struct {
			Phase string `json:"phase"`
		}
		_ = json.Unmarshal(v, &r)
		phase = phase || r.Phase == "snapshot"
	}
	if !phase {
		e.t.Errorf("no replica in phase snapshot: %s", out)
	}
	e.t.Logf("status: %+v", *sp)
}
