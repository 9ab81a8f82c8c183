package source_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay/internal/cdctest"
)

// TestTablePatterns: `public.t_*` streams every table it matches (a partitioned one whole, never a
// partition or an UNLOGGED table, which no publication takes) but those its exclude list names, beside a table listed by name, snapshot first; a
// table created later that the pattern matches is published and read within a heartbeat tick (rows
// inserted before that arrive as r events, later ones as changes), one it does not match or that
// is excluded never is; every table replays exactly.
func TestTablePatterns(t *testing.T) {
	e := newEnv(t)
	e.pg.Exec(`CREATE TABLE t_a (id int PRIMARY KEY, v text); INSERT INTO t_a SELECT g, 'a' || g FROM generate_series(1, 20) g;
		CREATE TABLE t_b (id int PRIMARY KEY, v text); INSERT INTO t_b SELECT g, 'b' || g FROM generate_series(1, 10) g;
		CREATE TABLE t_p (id int, at int, PRIMARY KEY (id, at)) PARTITION BY RANGE (at);
		CREATE TABLE t_p_low PARTITION OF t_p FOR VALUES FROM (0) TO (100); INSERT INTO t_p SELECT g, g FROM generate_series(1, 30) g;
		CREATE TABLE x_c (id int PRIMARY KEY); INSERT INTO x_c SELECT generate_series(1, 5);
		CREATE TABLE u_d (id int PRIMARY KEY); INSERT INTO u_d VALUES (1);
		CREATE TABLE t_skip_a (id int PRIMARY KEY); INSERT INTO t_skip_a VALUES (1);
		CREATE UNLOGGED TABLE t_scratch (id int PRIMARY KEY); INSERT INTO t_scratch VALUES (1)`)
	e.run("pat", `[{table: "public.t_*", queue: qt, exclude: ["t_skip_*"]}, {table: x_c, queue: qt}]`, "snapshot: initial")
	e.waitSnapshotDone("pat", "qt", 60*time.Second)
	reads := func() map[string]int { return e.opCounts("qt") }
	if n := reads(); n["r public.t_a"] != 20 || n["r public.t_b"] != 10 || n["r public.t_p"] != 30 || n["r public.x_c"] != 5 || len(n) != 4 {
		t.Fatalf("the first snapshot: %v", n)
	}
	e.pg.Exec(`CREATE TABLE t_new (id int PRIMARY KEY, v text); INSERT INTO t_new SELECT g, 'n' || g FROM generate_series(1, 7) g;
		CREATE TABLE y_new (id int PRIMARY KEY); INSERT INTO y_new VALUES (1);
		CREATE TABLE t_skip_new (id int PRIMARY KEY); INSERT INTO t_skip_new VALUES (1);
		INSERT INTO t_a VALUES (21, 'a21'); INSERT INTO t_p VALUES (31, 31)`)
	cdctest.Wait(t, 30*time.Second, "t_new read", func() (bool, string) {
		n := reads()
		return n["r public.t_new"] == 7, fmt.Sprint(n)
	})
	e.pg.Exec(`INSERT INTO t_new VALUES (8, 'n8'); UPDATE t_new SET v = 'changed' WHERE id = 1; INSERT INTO y_new VALUES (2)`)
	cdctest.Wait(t, 30*time.Second, "t_new's changes", func() (bool, string) {
		n := reads()
		return n["c public.t_new"] == 1 && n["u public.t_new"] == 1, fmt.Sprint(n)
	})
	for k := range reads() {
		if k[2:] == "public.y_new" || k[2:] == "public.u_d" || k[2:] == "public.t_p_low" || k[2:] == "public.t_skip_a" || k[2:] == "public.t_skip_new" {
			t.Errorf("events of %s, which no entry names", k)
		}
	}
	for _, table := range []string{"public.t_a", "public.t_b", "public.x_c", "public.t_new"} {
		e.checkOracle("qt", table, "id")
	}
	e.checkOracle("qt", "public.t_p", "id", "at")
}

// TestTablePatternWithUnmanagedPublication: with publication.manage: false, a new table the pattern
// matches that the administrator has not put in the publication is refused by itself (the other
// tables stream on); once it is added, the source reads it and streams it within a heartbeat tick.
func TestTablePatternWithUnmanagedPublication(t *testing.T) {
	e := newEnv(t)
	e.pg.Exec(`CREATE TABLE p_a (id int PRIMARY KEY); CREATE TABLE p_b (id int PRIMARY KEY);
		INSERT INTO p_a VALUES (1); INSERT INTO p_b VALUES (1);
		CREATE PUBLICATION pp FOR TABLE p_a, p_b`)
	e.run("pun", `[{table: "public.p_*", queue: qu}]`, "snapshot: initial\npublication: {name: pp, manage: false}")
	e.waitSnapshotDone("pun", "qu", 60*time.Second)
	count := func(what string) int { return e.opCounts("qu")[what] }
	e.pg.Exec(`CREATE TABLE p_c (id int PRIMARY KEY); INSERT INTO p_c SELECT generate_series(1, 3)`)
	e.waitStatus("qu", "pun", `public.p_c (matched by public.p_*) is not in publication pp`)
	e.waitStatus("qu", "pun", `"phase":"streaming"`)
	e.pg.Exec(`INSERT INTO p_a VALUES (2)`)
	cdctest.Wait(t, 30*time.Second, "p_a streaming beside the refused p_c", func() (bool, string) {
		return count("c public.p_a") == 1, fmt.Sprint(count("c public.p_a"))
	})
	e.pg.Exec(`ALTER PUBLICATION pp ADD TABLE p_c`)
	cdctest.Wait(t, 30*time.Second, "p_c read once in the publication", func() (bool, string) {
		return count("r public.p_c") == 3, fmt.Sprint(count("r public.p_c"))
	})
	e.pg.Exec(`INSERT INTO p_c VALUES (4)`)
	cdctest.Wait(t, 30*time.Second, "p_c streaming", func() (bool, string) {
		return count("c public.p_c") == 1, fmt.Sprint(count("c public.p_c"))
	})
	for _, table := range []string{"public.p_a", "public.p_b", "public.p_c"} {
		e.checkOracle("qu", table, "id")
	}
}
