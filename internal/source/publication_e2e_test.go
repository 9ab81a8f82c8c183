package source_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/pgrelay/pgrelay/internal/cdctest"
	"github.com/pgrelay/pgrelay/internal/source"
)

// TestStreamThroughAnAllTablesPublication: with publication.manage: false, a FOR ALL TABLES
// publication an administrator made serves the source as it is: the matched tables are read and
// streamed, a table the pattern matches later is taken at once (the publication already holds
// it), the other tables' changes are dropped, and the heartbeat's publication check does not end
// the session (a table published as FOR ALL TABLES is in its publication). Every table replays
// exactly.
func TestStreamThroughAnAllTablesPublication(t *testing.T) {
	e := newEnv(t)
	e.pg.Exec(`CREATE TABLE a_1 (id int PRIMARY KEY, v text); INSERT INTO a_1 SELECT g, 'a' || g FROM generate_series(1, 20) g;
		CREATE TABLE other (id int PRIMARY KEY); INSERT INTO other VALUES (1);
		CREATE PUBLICATION everything FOR ALL TABLES`)
	e.run("all", `[{table: "public.a_*", queue: qa}]`, "snapshot: initial\npublication: {name: everything, manage: false}")
	e.waitSnapshotDone("all", "qa", 60*time.Second)
	counts := func() map[string]int { return e.opCounts("qa") }
	e.pg.Exec(`INSERT INTO a_1 VALUES (21, 'a21'); UPDATE a_1 SET v = 'x' WHERE id = 1; INSERT INTO other VALUES (2);
		CREATE TABLE a_2 (id int PRIMARY KEY); INSERT INTO a_2 SELECT generate_series(1, 5)`)
	cdctest.Wait(t, 30*time.Second, "a_1's changes and a_2 read", func() (bool, string) {
		n := counts()
		return n["c public.a_1"] == 1 && n["u public.a_1"] == 1 && n["r public.a_2"] == 5, fmt.Sprint(n)
	})
	// Heartbeat ticks (every heartbeat/2 = 0.5 s) check the publication, and an idle source's tick
	// then emits a heartbeat message, which moves the pointer: at least 2 s and two such moves with
	// no publication error, so the checks did run (however slow the machine).
	lsn := func() pglogrepl.LSN {
		p, err := source.ReadPointer(e.ctx, e.rd.Client(), cdctest.SourceKey("qa", "all", "ptr"))
		if err != nil || p == nil {
			t.Fatalf("pointer: %v", err)
		}
		return p.LSNValue()
	}
	last, moves, start := lsn(), 0, time.Now()
	for moves < 2 || time.Since(start) < 2*time.Second {
		if time.Since(start) > 60*time.Second {
			t.Fatalf("the pointer moved %d times in 60 s of an idle source", moves)
		}
		st, _ := e.rd.Client().HGetAll(e.ctx, cdctest.SourceKey("qa", "all", "status")).Result()
		for _, v := range st {
			if strings.Contains(v, `"code":"publication"`) {
				t.Fatalf("the publication check ended the session: %s", v)
			}
		}
		if l := lsn(); l > last {
			last, moves = l, moves+1
		}
		time.Sleep(100 * time.Millisecond)
	}
	e.pg.Exec(`INSERT INTO a_2 VALUES (6); DELETE FROM a_1 WHERE id = 2`)
	cdctest.Wait(t, 30*time.Second, "a_2 streaming", func() (bool, string) {
		n := counts()
		return n["c public.a_2"] == 1 && n["d public.a_1"] == 1, fmt.Sprint(n)
	})
	for k := range counts() {
		if strings.HasSuffix(k, "public.other") {
			t.Errorf("events of public.other, which no entry names: %v", counts())
		}
	}
	e.checkOracle("qa", "public.a_1", "id")
	e.checkOracle("qa", "public.a_2", "id")
}
