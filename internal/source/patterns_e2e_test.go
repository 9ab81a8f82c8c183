package source_test

import (
	"fmt"
	"strings"
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

// TestSchemaPatterns: `tenant_*.orders` streams the orders table of every tenant schema (snapshot
// first), not another table of those schemas, nor a table of that name elsewhere, nor the schema
// its exclude list names; a tenant schema created later is found by the heartbeat, read and
// streamed. Every table replays exactly.
func TestSchemaPatterns(t *testing.T) {
	e := newEnv(t)
	e.pg.Exec(`CREATE SCHEMA tenant_a; CREATE SCHEMA tenant_b; CREATE SCHEMA tenant_test;
		CREATE TABLE tenant_a.orders (id int PRIMARY KEY); INSERT INTO tenant_a.orders SELECT generate_series(1, 12);
		CREATE TABLE tenant_b.orders (id int PRIMARY KEY); INSERT INTO tenant_b.orders SELECT generate_series(1, 5);
		CREATE TABLE tenant_a.other (id int PRIMARY KEY); INSERT INTO tenant_a.other VALUES (1);
		CREATE TABLE tenant_test.orders (id int PRIMARY KEY); INSERT INTO tenant_test.orders VALUES (1);
		CREATE TABLE public.orders (id int PRIMARY KEY); INSERT INTO public.orders VALUES (1)`)
	e.run("schemas", `[{table: "tenant_*.orders", queue: qs, exclude: ["tenant_test.*"]}]`, "snapshot: initial")
	e.waitSnapshotDone("schemas", "qs", 60*time.Second)
	if n := e.opCounts("qs"); n["r tenant_a.orders"] != 12 || n["r tenant_b.orders"] != 5 || len(n) != 2 {
		t.Fatalf("the first snapshot: %v", n)
	}
	e.pg.Exec(`CREATE SCHEMA tenant_c; CREATE TABLE tenant_c.orders (id int PRIMARY KEY); INSERT INTO tenant_c.orders SELECT generate_series(1, 4);
		INSERT INTO tenant_b.orders VALUES (6); INSERT INTO tenant_test.orders VALUES (2); INSERT INTO public.orders VALUES (2)`)
	cdctest.Wait(t, 30*time.Second, "tenant_c read", func() (bool, string) {
		n := e.opCounts("qs")
		return n["r tenant_c.orders"] == 4 && n["c tenant_b.orders"] == 1, fmt.Sprint(n)
	})
	e.pg.Exec(`INSERT INTO tenant_c.orders VALUES (5); DELETE FROM tenant_a.orders WHERE id = 1`)
	cdctest.Wait(t, 30*time.Second, "tenant_c streaming", func() (bool, string) {
		n := e.opCounts("qs")
		return n["c tenant_c.orders"] == 1 && n["d tenant_a.orders"] == 1, fmt.Sprint(n)
	})
	for k := range e.opCounts("qs") {
		if !strings.HasSuffix(k, "_a.orders") && !strings.HasSuffix(k, "_b.orders") && !strings.HasSuffix(k, "_c.orders") {
			t.Errorf("events of %s, which the pattern does not name", k)
		}
	}
	for _, table := range []string{"tenant_a.orders", "tenant_b.orders", "tenant_c.orders"} {
		e.checkOracle("qs", table, "id")
	}
}
