package source

import (
	"context"
	"strings"
	"testing"

	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// EnsurePublications keeps the append-only tables in their own insert-only publication: managed
// publications are created and corrected (a table moving between them, a publication left with
// no table, the insert publication dropped when no table is append-only); unmanaged ones are
// only checked, a refused table being allowed to stay in them.
func TestEnsurePublications(t *testing.T) {
	pg := testenv.StartPostgres(t)
	ctx := context.Background()
	pg.Exec(`CREATE TABLE k (id int PRIMARY KEY); CREATE TABLE l (v text); CREATE TABLE nokey (v text)`)
	table := func(name string, appendOnly bool) TableInfo {
		return TableInfo{Table: Table{Schema: "public", Name: name, AppendOnly: appendOnly}}
	}
	var version int
	if err := pg.Pool().QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&version); err != nil {
		t.Fatal(err)
	}
	k, kAO, l := table("k", false), table("k", true), table("l", true)
	refused := []Refusal{{Table: "public.nokey", Err: errcode.New(errcode.ReplicaIdentity, "no key", "")}}
	for _, c := range []struct {
		name    string
		setup   string
		pub     string
		manage  bool
		tables  []TableInfo
		refused []Refusal
		code    errcode.Code      // the error's code, "" for none
		want    map[string]string // publication → "insert,update,delete,truncate:tables" afterwards
	}{
		{"managed: created", "", "p", true, []TableInfo{k, l}, nil, "",
			map[string]string{"p": "t,t,t,t:k", "p_insert": "t,f,f,t:l"}},
		{"managed: k becomes append-only, p keeps no table", "", "p", true, []TableInfo{kAO, l}, nil, "",
			map[string]string{"p": "t,t,t,t:", "p_insert": "t,f,f,t:k,l"}},
		{"managed: no append-only table left, p_insert dropped", "", "p", true, []TableInfo{k}, nil, "",
			map[string]string{"p": "t,t,t,t:k"}},
		{"unmanaged: no insert publication", "CREATE PUBLICATION u1 FOR TABLE k", "u1", false, []TableInfo{k, l}, nil, errcode.Publication,
			map[string]string{"u1": "t,t,t,t:k"}},
		{"unmanaged: insert publication publishes updates",
			"CREATE PUBLICATION u2 FOR TABLE k; CREATE PUBLICATION u2_insert FOR TABLE l WITH (publish = 'insert, update')",
			"u2", false, []TableInfo{k, l}, nil, errcode.Publication, map[string]string{"u2": "t,t,t,t:k", "u2_insert": "t,t,f,f:l"}},
		{"unmanaged: the main publication holds the append-only table",
			"CREATE PUBLICATION u3 FOR TABLE k, l; CREATE PUBLICATION u3_insert FOR TABLE l WITH (publish = 'insert, truncate')",
			"u3", false, []TableInfo{k, l}, nil, errcode.Publication, map[string]string{"u3": "t,t,t,t:k,l", "u3_insert": "t,f,f,t:l"}},
		{"unmanaged: a refused table may stay",
			"CREATE PUBLICATION u4 FOR TABLE k, nokey; CREATE PUBLICATION u4_insert FOR TABLE l WITH (publish = 'insert, truncate')",
			"u4", false, []TableInfo{k, l}, refused, "", map[string]string{"u4": "t,t,t,t:k,nokey", "u4_insert": "t,f,f,t:l"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.setup != "" {
				pg.Exec(c.setup)
			}
			cfg := &Config{Publication: c.pub, InsertPublication: c.pub + InsertPublicationSuffix, ManagePublication: c.manage}
			pubs, err := EnsurePublications(ctx, pg.Pool(), cfg, c.tables, c.refused, version)
			if errcode.Of(err) != c.code || (c.code == "" && err != nil) {
				t.Fatalf("error %v, want code %q", err, c.code)
			}
			if c.code == "" && len(pubs.Names()) != len(c.want) {
				t.Errorf("publication_names %v", pubs.Names())
			}
			got, err := PublicationSummary(ctx, pg.Pool(), c.pub, c.pub+InsertPublicationSuffix)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(c.want) {
				t.Errorf("publications %v, want %v", got, c.want)
			}
			for p, w := range c.want {
				if got[p] != w {
					t.Errorf("publication %s: %q, want %q", p, got[p], w)
				}
			}
		})
	}
}

// TestUnmanagedBroaderPublications: an unmanaged publication may publish more than the configured
// tables (others listed by name, FOR TABLES IN SCHEMA, FOR ALL TABLES) and say so, but never an
// append-only table in the main publication or a row filter on a configured table; a managed one
// is never FOR ALL TABLES and is narrowed to exactly its tables. Through such a publication no
// table is out of the publications, and the heartbeat's drift check stays quiet until a
// configured table really leaves it or a row filter narrows it.
func TestUnmanagedBroaderPublications(t *testing.T) {
	pg := testenv.StartPostgres(t)
	ctx := context.Background()
	version := pg.Version * 10000
	pg.Exec(`CREATE SCHEMA other; CREATE TABLE k (id int PRIMARY KEY); CREATE TABLE l (v text);
		CREATE TABLE x (id int PRIMARY KEY); CREATE TABLE other.y (id int PRIMARY KEY)`)
	tables, refused, err := LoadTables(ctx, pg.Pool(), []Table{{Schema: "public", Name: "k", Queue: "q"},
		{Schema: "public", Name: "l", Queue: "q", AppendOnly: true, Mode: PartitionBySingle}}, version)
	if err != nil || len(refused) > 0 {
		t.Fatal(err, refused)
	}
	k, l := tables[:1], tables
	for _, c := range []struct {
		name    string
		min     int // the oldest major version that has it
		setup   string
		pub     string
		manage  bool
		tables  []TableInfo
		code    errcode.Code
		broader string // Publications.Broader, joined by " | "
		want    string // PublicationSummary of pub afterwards
	}{
		{"other tables listed", 14, "CREATE PUBLICATION b1 FOR TABLE k, x", "b1", false, k, "", "b1: 1 other tables listed", "t,t,t,t:k,x"},
		{"FOR ALL TABLES", 14, "CREATE PUBLICATION b2 FOR ALL TABLES", "b2", false, k, "", "b2: FOR ALL TABLES", "t,t,t,t:k,l,x,y"},
		{"FOR ALL TABLES holds the append-only table", 14, "CREATE PUBLICATION b3 FOR ALL TABLES; CREATE PUBLICATION b3_insert FOR TABLE l WITH (publish = 'insert, truncate')",
			"b3", false, l, errcode.Publication, "", "t,t,t,t:k,l,x,y"},
		{"FOR ALL TABLES as the insert publication", 14, "CREATE PUBLICATION b4 FOR TABLE k; CREATE PUBLICATION b4_insert FOR ALL TABLES WITH (publish = 'insert, truncate')",
			"b4", false, l, "", "b4_insert: FOR ALL TABLES", "t,t,t,t:k"},
		{"FOR ALL TABLES without a configured operation", 14, "CREATE PUBLICATION b5 FOR ALL TABLES WITH (publish = 'insert, update, delete')",
			"b5", false, k, errcode.Publication, "", "t,t,t,f:k,l,x,y"},
		{"FOR TABLES IN SCHEMA", 15, "CREATE PUBLICATION b6 FOR TABLES IN SCHEMA public, other", "b6", false, k, "", "b6: FOR TABLES IN SCHEMA other, public", "t,t,t,t:k,l,x,y"},
		{"FOR TABLES IN SCHEMA of another schema", 15, "CREATE PUBLICATION b7 FOR TABLES IN SCHEMA other", "b7", false, k, errcode.Publication, "", "t,t,t,t:y"},
		{"a row filter on another table", 15, "CREATE PUBLICATION b8 FOR TABLE k, x WHERE (id > 1)", "b8", false, k, "", "b8: 1 other tables listed", "t,t,t,t:k,x"},
		{"a row filter on a configured table", 15, "CREATE PUBLICATION b9 FOR TABLE k WHERE (id > 1), x", "b9", false, k, errcode.Publication, "", "t,t,t,t:k,x"},
		{"managed: FOR ALL TABLES is refused", 14, "CREATE PUBLICATION m1 FOR ALL TABLES", "m1", true, k, errcode.Publication, "", "t,t,t,t:k,l,x,y"},
		{"managed: FOR TABLES IN SCHEMA narrowed", 15, "CREATE PUBLICATION m2 FOR TABLES IN SCHEMA public, other", "m2", true, k, "", "", "t,t,t,t:k"},
		{"managed: only a schema, no table wanted", 15, "CREATE PUBLICATION m3 FOR TABLES IN SCHEMA other", "m3", true, nil, "", "", "t,t,t,t:"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if pg.Version < c.min {
				t.Skipf("needs PostgreSQL %d", c.min)
			}
			pg.Exec(c.setup)
			cfg := &Config{Publication: c.pub, InsertPublication: c.pub + InsertPublicationSuffix, ManagePublication: c.manage}
			pubs, err := EnsurePublications(ctx, pg.Pool(), cfg, c.tables, nil, version)
			if errcode.Of(err) != c.code || (c.code == "" && err != nil) {
				t.Fatalf("error %v, want code %q", err, c.code)
			}
			if got := strings.Join(pubs.Broader, " | "); c.code == "" && got != c.broader {
				t.Errorf("broader %q, want %q", got, c.broader)
			}
			if got, err := PublicationSummary(ctx, pg.Pool(), c.pub); err != nil || got[c.pub] != c.want {
				t.Errorf("publication %s: %q (%v), want %q", c.pub, got[c.pub], err, c.want)
			}
			if c.code != "" {
				return
			}
			if out, err := outOfPublications(ctx, pg.Pool(), pubs.Names(), c.tables, version); err != nil || len(out) > 0 {
				t.Errorf("out of the publications: %v %v", out, err)
			}
			if err := PublicationDrift(ctx, pg.Pool(), pubs, c.tables, version); err != nil {
				t.Errorf("drift: %v", err)
			}
		})
	}
	if pg.Version < 15 {
		return
	}
	// Drift through a schema publication: the schema's going is drift, as is a row filter.
	pg.Exec(`CREATE PUBLICATION d FOR TABLES IN SCHEMA public`)
	pubs := Publications{Main: "d"}
	for _, s := range []struct{ sql, drift string }{
		{"", ""},
		{"ALTER PUBLICATION d ADD TABLE other.y", ""},
		{"ALTER PUBLICATION d DROP TABLES IN SCHEMA public", "publication d no longer holds public.k"},
		{"ALTER PUBLICATION d ADD TABLE k WHERE (id > 1)", "publication d has a row filter on public.k"},
		{"ALTER PUBLICATION d SET TABLE k", ""},
	} {
		if s.sql != "" {
			pg.Exec(s.sql)
		}
		err := PublicationDrift(ctx, pg.Pool(), pubs, k, version)
		if s.drift == "" && err != nil || s.drift != "" && (errcode.Of(err) != errcode.Publication || !strings.Contains(err.Error(), s.drift)) {
			t.Fatalf("after %q: drift %v, want %q", s.sql, err, s.drift)
		}
	}
}
