package tests

import (
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay/internal/oracle"
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
	deadline := time.Now().Add(60 * time.Second)
	for c, ok := e.snapshotCursor(); !ok || c != nil; c, ok = e.snapshotCursor() {
		if time.Now().After(deadline) {
			t.Fatal("first snapshot never finished")
		}
		time.Sleep(100 * time.Millisecond)
	}
	first := e.pointer()
	e.pg.DropSlot("pgrelay_resync")
	for {
		st, _ := e.rd.Client().HGetAll(e.ctx, "pgrelay:{q}:src:resync:status").Result()
		found := false
		for _, v := range st {
			found = found || strings.Contains(v, `"code":"slot_lost"`)
		}
		if found {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no slot_lost: %v", st)
		}
		time.Sleep(100 * time.Millisecond)
	}
	out, err := exec.Command(testenv.Binary(t), "resync", "-c", e.config).CombinedOutput()
	if err != nil {
		t.Fatalf("resync: %v\n%s", err, out)
	}
	deadline = time.Now().Add(60 * time.Second)
	for {
		p := e.pointer()
		if c, _ := e.snapshotCursor(); p != nil && p.Epoch != first.Epoch && c == nil {
			if p.Gen != first.Gen+1 {
				t.Errorf("generation %d after %d", p.Gen, first.Gen)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("resync never finished: %+v", p)
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond)
	close(stopWriter)
	wait()
	epoch := e.pointer().Epoch
	conn := e.conn()
	deadline = time.Now().Add(60 * time.Second)
	for {
		all, err := oracle.ReadQueue(e.ctx, e.rd.Client(), "pgrelay", e.queue)
		if err != nil {
			t.Fatal(err)
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
		rows, err := oracle.TableRows(e.ctx, conn, "public.w", []string{"id"})
		if err != nil {
			t.Fatal(err)
		}
		diffs := append(res.Problems, oracle.Compare(res.Tables["public.w"], rows)...)
		if dup != "" {
			diffs = append(diffs, "id "+dup+" twice across epochs")
		}
		if len(diffs) == 0 {
			t.Logf("epoch %s: %d of %d entries", epoch, len(mine), len(all))
			return
		}
		if time.Now().After(deadline) {
			for i, d := range diffs {
				if i < 20 {
					t.Error(d)
				}
			}
			t.Fatalf("%d differences", len(diffs))
		}
		time.Sleep(250 * time.Millisecond)
	}
}
