package source

import (
	"context"
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
