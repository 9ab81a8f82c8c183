package tests

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay/internal/cdctest"
	"github.com/pgrelay/pgrelay/internal/oracle"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// TestSnapshotOnRequest: `pgrelay snapshot -c <config> public.w` while the binary streams two
// tables and two writers change w: the owner reads w again while it streams (its rows arrive as r
// events once more, in the same epoch), o (not named) is not read again, and the queue replays
// to w; `pgrelay status` shows the request as taken; a table the config does not stream is
// refused with exit code 2.
func TestSnapshotOnRequest(t *testing.T) {
	e := newCDCEnv(t, "reread", `[{table: w, queue: q}, {table: o, queue: q}]`, "snapshot: initial\nchunk_rows: 100")
	e.pg.Exec(writerTable)
	e.pg.Exec(`CREATE TABLE o (id int PRIMARY KEY, v text); INSERT INTO o SELECT g, 'o' || g FROM generate_series(1, 50) g`)
	e.pg.Exec(`INSERT INTO w SELECT i, 'pre' || i, i, '{}', 0 FROM generate_series(0, 999) i`)
	p := e.start()
	e.waitPointer()
	cdctest.WaitEvery(t, 60*time.Second, 100*time.Millisecond, "the first snapshot to finish", func() (bool, string) {
		c, ok := e.snapshotCursor()
		return ok && c == nil, fmt.Sprintf("cursor %+v", c)
	})
	reads := func() map[string]int {
		all, err := oracle.ReadQueue(e.ctx, e.rd.Client(), "pgrelay", e.queue)
		if err != nil {
			t.Fatal(err)
		}
		n := map[string]int{}
		for _, en := range all {
			var ev struct{ Op, Table string }
			if json.Unmarshal(en.Payload, &ev) == nil && ev.Op == "r" {
				n[ev.Table]++
			}
		}
		return n
	}
	if n := reads(); n["public.w"] != 1000 || n["public.o"] != 50 {
		t.Fatalf("first snapshot: %v r events, want 1000 of w and 50 of o", n)
	}
	epoch := e.pointer().Epoch

	stop := make(chan struct{})
	wait := e.randomWriter(7, stop)
	time.Sleep(300 * time.Millisecond)
	out, err := exec.Command(testenv.Binary(t), "snapshot", "-c", e.config, "public.w").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "re-read of public.w requested from source reread") {
		t.Fatalf("pgrelay snapshot: %v\n%s", err, out)
	}
	cdctest.WaitEvery(t, 60*time.Second, 200*time.Millisecond, "w read again", func() (bool, string) {
		c, ok := e.snapshotCursor()
		n := reads()
		return ok && c == nil && n["public.w"] >= 1500, fmt.Sprintf("%v r events, cursor %+v", n, c)
	})
	close(stop)
	wait()
	if n := reads(); n["public.o"] != 50 {
		t.Errorf("o was read again: %d r events", n["public.o"])
	}
	if got := e.pointer().Epoch; got != epoch {
		t.Errorf("epoch %s after the re-read, want %s (no new epoch)", got, epoch)
	}
	if !strings.Contains(p.Output(), "re-reading public.w as requested") {
		t.Errorf("no log line of the re-read: %s", sinkLastLines(p.Output(), 10))
	}
	if st, err := exec.Command(testenv.Binary(t), "status", "-c", e.config).CombinedOutput(); err != nil ||
		!strings.Contains(string(st), "re-read:     public.w, requested") || !strings.Contains(string(st), "taken by a start") {
		t.Errorf("pgrelay status does not show the re-read: %v\n%s", err, st)
	}
	e.convergeEpoch("public.w", "id")

	out, err = exec.Command(testenv.Binary(t), "snapshot", "-c", e.config, "public.nope").CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), "streams public.nope") {
		t.Fatalf("a table the config does not stream: %v\n%s", err, out)
	}
}
