package source

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// TestLoadTablesChecksColumnLists: a table that does not exist is refused (table_missing), naming
// the one that differs only in letter case if there is one, and so is an UNLOGGED one. A table's columns list is put in table order and refused
// (column_list) when it cannot be a publication column list: before PostgreSQL 15, a listed
// column missing or generated, a key or partition_by column left out, REPLICA IDENTITY FULL on a
// table that is not append-only. SELECT on the listed columns is enough; without it on one of
// them the table is refused (source_privileges) with the column GRANT that fixes it.
func TestLoadTablesChecksColumnLists(t *testing.T) {
	pg := testenv.StartPostgres(t)
	ctx := context.Background()
	pg.Exec(`CREATE TABLE t (id int PRIMARY KEY, v text, secret text);
		CREATE TABLE gen (id int PRIMARY KEY, v int, g int GENERATED ALWAYS AS (v * 2) STORED);
		CREATE TABLE full_ident (id int PRIMARY KEY, v text, secret text);
		ALTER TABLE full_ident REPLICA IDENTITY FULL;
		CREATE TABLE log (cat text, v text, secret text);
		CREATE UNLOGGED TABLE scratch (id int PRIMARY KEY)`)
	table := func(name string, cols ...string) Table {
		return Table{Schema: "public", Name: name, Queue: "q", ColumnList: cols}
	}
	appendOnly := func(tb Table, mode PartitionMode, part ...string) Table {
		tb.AppendOnly, tb.Mode, tb.Columns = true, mode, part
		return tb
	}
	cases := []struct {
		name  string
		table Table
		code  errcode.Code // "" when loaded
		want  string       // the error's text contains it, or the loaded list joined by ","
	}{
		{"whole table", table("t"), "", ""},
		{"no such table", table("nosuch"), errcode.TableMissing, "table public.nosuch does not exist. Fix: create it"},
		{"another letter case", table("T"), errcode.TableMissing, "table public.T does not exist, but public.t does. Fix: names are case-sensitive and taken as written: set tables[].table to public.t"},
		{"unlogged", table("scratch"), errcode.TableMissing, `public.scratch is UNLOGGED: PostgreSQL writes no WAL for its changes, so none can be streamed. Fix: ALTER TABLE "public"."scratch" SET LOGGED`},
		{"put in table order", table("t", "v", "id"), "", "id,v"},
		{"key column left out", table("t", "v"), errcode.ColumnList, "key column id is not listed"},
		{"missing column", table("t", "id", "nope"), errcode.ColumnList, "column nope does not exist"},
		{"generated column", table("gen", "id", "g"), errcode.ColumnList, "column g is generated"},
		{"replica identity full", table("full_ident", "id", "v"), errcode.ColumnList, "REPLICA IDENTITY FULL"},
		{"full, append-only", appendOnly(table("full_ident", "v", "id"), PartitionByKey), "", "id,v"},
		{"append-only without key, partition column left out", appendOnly(table("log", "v"), PartitionByColumns, "cat"), errcode.ColumnList, "partition_by column cat is not listed"},
		{"append-only without key", appendOnly(table("log", "v", "cat"), PartitionByColumns, "cat"), "", "cat,v"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if pg.Version < 15 && len(c.table.ColumnList) > 0 {
				c.code, c.want = errcode.ColumnList, "needs PostgreSQL 15"
			}
			ok, refused, err := LoadTables(ctx, pg.Pool(), []Table{c.table}, pg.Version*10000)
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case c.code == "" && (len(ok) != 1 || strings.Join(ok[0].ColumnList, ",") != c.want):
				t.Fatalf("loaded %+v refused %+v, want columns %q", ok, refused, c.want)
			case c.code != "" && (len(refused) != 1 || errcode.Of(refused[0].Err) != c.code || !strings.Contains(refused[0].Err.Error(), c.want)):
				t.Fatalf("refused %+v, want %s containing %q", refused, c.code, c.want)
			}
		})
	}
	if pg.Version < 15 {
		return
	}

	// Column privileges: SELECT on the listed columns only is enough; one missing names its GRANT.
	pg.CreateRole("some_cols", "LOGIN", `GRANT SELECT (id, v) ON t TO %s`)
	pool, err := pgxpool.New(ctx, pg.UserDSN("some_cols", "postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	ok, refused, err := LoadTables(ctx, pool, []Table{table("t", "id", "v")}, pg.Version*10000)
	if err != nil || len(ok) != 1 || len(refused) != 0 {
		t.Fatalf("SELECT (id, v) with columns [id, v]: ok %+v refused %+v err %v", ok, refused, err)
	}
	for _, tb := range []Table{table("t", "id", "v", "secret"), table("t")} {
		_, refused, err = LoadTables(ctx, pool, []Table{tb}, pg.Version*10000)
		fix := `GRANT SELECT ("secret") ON "public"."t" TO "some_cols"`
		if len(tb.ColumnList) == 0 {
			fix = `GRANT SELECT ON "public"."t" TO "some_cols"`
		}
		if err != nil || len(refused) != 1 || errcode.Of(refused[0].Err) != errcode.SourcePrivileges || !strings.Contains(refused[0].Err.Error(), fix) {
			t.Fatalf("columns %v: refused %+v err %v, want source_privileges naming %s", tb.ColumnList, refused, err, fix)
		}
	}
}

// TestEnsurePublicationsColumnLists: a managed publication gets each table's columns list as its
// column list, and is corrected when the list changes or goes; an unmanaged one must have exactly
// the configured lists (none for a table streamed whole).
func TestEnsurePublicationsColumnLists(t *testing.T) {
	pg := testenv.StartPostgres(t)
	if pg.Version < 15 {
		t.Skip("publication column lists came with PostgreSQL 15 (LoadTables refuses columns before it)")
	}
	ctx := context.Background()
	pg.Exec(`CREATE TABLE t (id int PRIMARY KEY, v text, secret text); CREATE TABLE u (id int PRIMARY KEY, w text)`)
	info := func(name string, cols ...string) TableInfo {
		return TableInfo{Table: Table{Schema: "public", Name: name, ColumnList: cols}}
	}
	// lists is the publication's tables with their column lists ("t(id,v)", "u(*)" for none).
	lists := func(pub string) string {
		var out string
		err := pg.Pool().QueryRow(ctx, `SELECT coalesce(string_agg(c.relname || '(' || coalesce(
			(SELECT string_agg(a.attname, ',' ORDER BY a.attnum) FROM pg_attribute a WHERE a.attrelid = r.prrelid AND a.attnum = ANY(r.prattrs::int2[])), '*') || ')',
			' ' ORDER BY c.relname), '') FROM pg_publication_rel r JOIN pg_publication p ON p.oid = r.prpubid
			JOIN pg_class c ON c.oid = r.prrelid WHERE p.pubname = $1`, pub).Scan(&out)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	for _, c := range []struct {
		name   string
		setup  string
		pub    string
		manage bool
		tables []TableInfo
		code   errcode.Code
		want   string // lists(pub) afterwards
	}{
		{"managed: created with the list", "", "m", true, []TableInfo{info("t", "id", "v"), info("u")}, "", "t(id,v) u(*)"},
		{"managed: the list changes", "", "m", true, []TableInfo{info("t", "id", "secret"), info("u", "id")}, "", "t(id,secret) u(id)"},
		{"managed: the list goes", "", "m", true, []TableInfo{info("t"), info("u")}, "", "t(*) u(*)"},
		{"unmanaged: exactly the lists", "CREATE PUBLICATION x1 FOR TABLE t (v, id), u", "x1", false, []TableInfo{info("t", "id", "v"), info("u")}, "", "t(id,v) u(*)"},
		{"unmanaged: another list", "CREATE PUBLICATION x2 FOR TABLE t (id, secret)", "x2", false, []TableInfo{info("t", "id", "v")}, errcode.Publication, "t(id,secret)"},
		{"unmanaged: a list where none is configured", "CREATE PUBLICATION x3 FOR TABLE t (id, v)", "x3", false, []TableInfo{info("t")}, errcode.Publication, "t(id,v)"},
		{"unmanaged: no list where one is configured", "CREATE PUBLICATION x4 FOR TABLE t", "x4", false, []TableInfo{info("t", "id", "v")}, errcode.Publication, "t(*)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.setup != "" {
				pg.Exec(c.setup)
			}
			cfg := &Config{Publication: c.pub, InsertPublication: c.pub + InsertPublicationSuffix, ManagePublication: c.manage}
			_, err := EnsurePublications(ctx, pg.Pool(), cfg, c.tables, nil, pg.Version*10000)
			if errcode.Of(err) != c.code || (c.code == "" && err != nil) {
				t.Fatalf("error %v, want code %q", err, c.code)
			}
			if c.code != "" && len(c.tables[0].ColumnList) > 0 && !strings.Contains(err.Error(), `ALTER PUBLICATION "`+c.pub+`" ADD TABLE "public"."t" ("id", "v")`) {
				t.Errorf("the fix does not name the configured list: %v", err)
			}
			if got := lists(c.pub); got != c.want {
				t.Errorf("publication %s: %s, want %s", c.pub, got, c.want)
			}
		})
	}
}

// TestPublicationDrift: while a source streams, a configured table that leaves its publication
// (ALTER PUBLICATION … DROP TABLE, DROP COLUMN … CASCADE of a listed column) or gets another column
// list there is a publication error naming it; a table dropped altogether is not.
func TestPublicationDrift(t *testing.T) {
	pg := testenv.StartPostgres(t)
	ctx := context.Background()
	lists := pg.Version >= 15
	pg.Exec(`CREATE TABLE t (id int PRIMARY KEY, v text, w text); CREATE TABLE u (id int PRIMARY KEY);
		CREATE TABLE l (v text); CREATE TABLE gone (id int PRIMARY KEY)`)
	tcols := []Table{{Schema: "public", Name: "t", Queue: "q"}}
	if lists {
		tcols[0].ColumnList = []string{"id", "v"}
	}
	tables, refused, err := LoadTables(ctx, pg.Pool(), append(tcols,
		Table{Schema: "public", Name: "u", Queue: "q"},
		Table{Schema: "public", Name: "l", Queue: "q", AppendOnly: true, Mode: PartitionBySingle},
		Table{Schema: "public", Name: "gone", Queue: "q"}), pg.Version*10000)
	if err != nil || len(refused) > 0 {
		t.Fatal(err, refused)
	}
	cfg := &Config{Publication: "p", InsertPublication: "p" + InsertPublicationSuffix, ManagePublication: true}
	dropped := false // gone is dropped: settle leaves it out
	settle := func() Publications {
		t.Helper()
		var left []TableInfo
		for _, ti := range tables {
			if ti.Name != "gone" || !dropped {
				left = append(left, ti)
			}
		}
		pubs, err := EnsurePublications(ctx, pg.Pool(), cfg, left, nil, pg.Version*10000)
		if err != nil {
			t.Fatal(err)
		}
		return pubs
	}
	pubs := settle()
	steps := []struct {
		name, sql string
		drift     string // the error names it; "" for no error
	}{
		{"as settled", "", ""},
		{"a table dropped altogether", "DROP TABLE gone", ""},
		{"dropped from the publication", "ALTER PUBLICATION p DROP TABLE u", `publication p no longer holds public.u`},
		{"dropped from the insert publication", "ALTER PUBLICATION p_insert DROP TABLE l", `publication p_insert no longer holds public.l`},
	}
	if lists {
		steps = append(steps,
			struct{ name, sql, drift string }{"another column list", `ALTER PUBLICATION p SET TABLE t (id), u`, `publication p has another column list for public.t`},
			struct{ name, sql, drift string }{"a listed column dropped with CASCADE", `ALTER TABLE t DROP COLUMN v CASCADE`, `publication p no longer holds public.t`})
	}
	for _, s := range steps {
		if s.sql != "" {
			pg.Exec(s.sql)
		}
		dropped = dropped || s.sql == "DROP TABLE gone"
		err := PublicationDrift(ctx, pg.Pool(), pubs, tables, pg.Version*10000)
		switch {
		case s.drift == "" && err != nil:
			t.Fatalf("%s: %v", s.name, err)
		case s.drift != "" && (errcode.Of(err) != errcode.Publication || !strings.Contains(err.Error(), s.drift)):
			t.Fatalf("%s: %v, want a publication error containing %q", s.name, err, s.drift)
		}
		if s.drift != "" && !strings.Contains(s.sql, "DROP COLUMN") {
			out, err := outOfPublications(ctx, pg.Pool(), pubs.Names(), tables[:3], pg.Version*10000)
			left := strings.Contains(s.drift, "no longer holds") // out of the publications, not only another list
			if got := strings.Join(out, ","); err != nil || left != (got != "") || left && !strings.HasSuffix(s.drift, got) {
				t.Fatalf("%s: out of the publications %q %v", s.name, got, err)
			}
			pubs = settle() // put back as configured
		}
	}
}

// TestOutOfPublications: the tables in none of the source's publications, all of them when the
// publications are gone; a table that moved between the main and the insert publication
// (append_only changed) is not out.
func TestOutOfPublications(t *testing.T) {
	pg := testenv.StartPostgres(t)
	ctx := context.Background()
	pg.Exec(`CREATE TABLE k (id int PRIMARY KEY); CREATE TABLE l (v text)`)
	k := TableInfo{Table: Table{Schema: "public", Name: "k"}}
	l := TableInfo{Table: Table{Schema: "public", Name: "l", AppendOnly: true}}
	cfg := &Config{Publication: "r", InsertPublication: "r" + InsertPublicationSuffix, ManagePublication: true}
	for _, c := range []struct {
		name   string
		sql    string
		tables []TableInfo
		want   string
	}{
		{"no publication yet", "", []TableInfo{k, l}, "public.k,public.l"},
		{"as settled", "", []TableInfo{k, l}, ""},
		{"k becomes append-only", "", []TableInfo{{Table: Table{Schema: "public", Name: "k", AppendOnly: true}}, l}, ""},
		{"l taken out", "ALTER PUBLICATION r_insert DROP TABLE l", []TableInfo{k, l}, "public.l"},
		{"publications dropped", "DROP PUBLICATION r; DROP PUBLICATION r_insert", []TableInfo{k, l}, "public.k,public.l"},
	} {
		if c.sql != "" {
			pg.Exec(c.sql)
		}
		out, err := outOfPublications(ctx, pg.Pool(), []string{"r", "r_insert"}, c.tables, pg.Version*10000)
		if err != nil || strings.Join(out, ",") != c.want {
			t.Fatalf("%s: out %v (%v), want %s", c.name, out, err, c.want)
		}
		if _, err := EnsurePublications(ctx, pg.Pool(), cfg, c.tables, nil, pg.Version*10000); err != nil {
			t.Fatal(err)
		}
	}
}
