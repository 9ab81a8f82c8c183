package tests

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay/internal/cdctest"
	"github.com/pgrelay/pgrelay/internal/oracle"
	"github.com/pgrelay/pgrelay/internal/pointer"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// TestSnapshotResyncAfterSlotLost: while two writers run, the slot is dropped under the running
// binary → slot_lost in the status; `pgrelay resync -c <config>` → a new epoch (generation 2) whose
// snapshot completes; the replay of the new epoch alone equals the table; no id repeats across
// the epochs.
func TestSnapshotResyncAfterSlotLost(t *testing.T) {
	e := newCDCEnv(t, "resync", `[{table: w, queue: q}]`, "snapshot: initial\nchunk_rows: 100")
	e.pg.Exec(writerTable)
	e.pg.Exec(`INSERT INTO w SELECT i, 'pre' || i, i, '{}', 0 FROM generate_series(0, 999) i`)
	stopWriter := make(chan struct{})
	wait := e.randomWriter(5, stopWriter)
	e.start()
	e.waitPointer()
	cdctest.WaitEvery(t, 60*time.Second, 100*time.Millisecond, "the first snapshot to finish", func() (bool, string) {
		c, ok := e.snapshotCursor()
		return ok && c == nil, fmt.Sprintf("cursor %+v", c)
	})
	first := e.pointer()
	e.pg.DropSlot("pgrelay_resync")
	e.waitStatus(`"code":"slot_lost"`)
	e.resync(first)
	time.Sleep(500 * time.Millisecond)
	close(stopWriter)
	wait()
	e.convergeEpoch("public.w", "id")
}

// waitStatus waits up to 60 s until a field of the source's status hash contains want.
func (e *cdcEnv) waitStatus(want string) {
	e.t.Helper()
	cdctest.WaitStatus(e.t, 60*time.Second, e.rd.Client(), e.queue, e.name, want)
}

// resync runs `pgrelay resync -c <config>` and waits until the source has a new epoch, one
// generation after first, whose snapshot has completed.
func (e *cdcEnv) resync(first *pointer.Pointer) {
	e.t.Helper()
	out, err := exec.Command(testenv.Binary(e.t), "resync", "-c", e.config).CombinedOutput()
	if err != nil {
		e.t.Fatalf("resync: %v\n%s", err, out)
	}
	var p *pointer.Pointer
	cdctest.WaitEvery(e.t, 60*time.Second, 100*time.Millisecond, "the resync to finish", func() (bool, string) {
		p = e.pointer()
		c, _ := e.snapshotCursor()
		return p != nil && p.Epoch != first.Epoch && c == nil, fmt.Sprintf("pointer %+v", p)
	})
	if p.Gen != first.Gen+1 {
		e.t.Errorf("generation %d after %d", p.Gen, first.Gen)
	}
}

// convergeEpoch waits until the replay of the pointer's epoch alone equals table, and checks that
// no id repeats across the epochs in the queue.
func (e *cdcEnv) convergeEpoch(table string, key ...string) {
	e.t.Helper()
	epoch := e.pointer().Epoch
	conn := e.conn()
	deadline := time.Now().Add(60 * time.Second)
	for {
		all, err := oracle.ReadQueue(e.ctx, e.rd.Client(), "pgrelay", e.queue)
		if err != nil {
			e.t.Fatal(err)
		}
		var mine []oracle.Entry
		seen := map[string]bool{}
		dup := ""
		for _, en := range all {
			if seen[en.ID] {
				dup = en.ID
			}
			seen[en.ID] = true
			if strings.HasPrefix(en.ID, "pg:"+epoch+":") {
				mine = append(mine, en)
			}
		}
		res := oracle.Replay(mine)
		rows, err := oracle.TableRows(e.ctx, conn, table, key)
		if err != nil {
			e.t.Fatal(err)
		}
		diffs := append(res.Problems, oracle.Compare(res.Tables[table], rows)...)
		if dup != "" {
			diffs = append(diffs, "id "+dup+" twice across epochs")
		}
		if len(diffs) == 0 {
			e.t.Logf("epoch %s: %d of %d entries", epoch, len(mine), len(all))
			return
		}
		if time.Now().After(deadline) {
			for i, d := range diffs {
				if i < 20 {
					e.t.Error(d)
				}
			}
			e.t.Fatalf("%d differences", len(diffs))
		}
		time.Sleep(250 * time.Millisecond)
	}
}
