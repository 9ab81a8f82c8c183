package tests

import (
	"encoding/json"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

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
	deadline := time.Now().Add(20 * time.Second)
	for {
		out, err := exec.Command(testenv.Binary(t), "status", "-c", e.config, "--json").CombinedOutput()
		if err != nil {
			t.Fatalf("status: %v\n%s", err, out)
		}
		if err := json.Unmarshal(out, &st); err != nil {
			t.Fatalf("status output: %v\n%s", err, out)
		}
		streaming := false
		for _, v := range st.Replicas {
			streaming = streaming || strings.Contains(string(v), `"streaming"`)
		}
		if st.Owner != "" && st.SlotExists && len(st.Pointer) > 0 && st.Lag != nil && streaming {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status never showed a streaming owner: %s", out)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if out, err := exec.Command(testenv.Binary(t), "teardown", "-c", e.config).CombinedOutput(); err == nil {
		t.Fatalf("teardown while the source runs succeeded: %s", out)
	}
	p.Signal(syscall.SIGTERM)
	if err := p.Wait(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(testenv.Binary(t), "teardown", "-c", e.config).CombinedOutput(); err != nil {
		t.Fatalf("teardown: %v\n%s", err, out)
	}
	var slots, pubs int
	e.pg.Pool().QueryRow(e.ctx, `SELECT count(*) FROM pg_replication_slots`).Scan(&slots)
	e.pg.Pool().QueryRow(e.ctx, `SELECT count(*) FROM pg_publication`).Scan(&pubs)
	if slots != 0 || pubs != 0 || e.pointer() != nil {
		t.Errorf("after teardown: %d slots, %d publications, pointer %v", slots, pubs, e.pointer())
	}
}
