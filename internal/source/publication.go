package source

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgrelay/pgrelay/internal/errcode"
)

// publishOps is what a publication publishes (pg_publication's pubinsert, pubupdate, pubdelete,
// pubtruncate).
type publishOps struct{ insert, update, delete, truncate bool }

var (
	allOps     = publishOps{true, true, true, true}   // the main publication: every operation
	insertOps  = publishOps{true, false, false, true} // the append-only tables': no update or delete
	allOpsText = "insert, update, delete, truncate"
	insertText = "insert, truncate"
)

// Publications are the publications pgoutput reads, as EnsurePublications settled them.
type Publications struct {
	Main   string // every operation of the tables with a key
	Insert string // inserts and truncates of the append-only tables; "" when there are none
	// Broader says, per unmanaged publication that publishes tables the source does not stream
	// ("p: FOR ALL TABLES"), what else it publishes: PostgreSQL decodes and sends those tables'
	// changes, and pg_cdc drops them.
	Broader []string
}

// Names lists the publications for pgoutput's publication_names.
func (p Publications) Names() []string {
	if p.Insert == "" {
		return []string{p.Main}
	}
	return []string{p.Main, p.Insert}
}

// EnsurePublications creates or corrects the managed publications, or verifies unmanaged ones. A
// table's publish operations are per publication, so the append-only tables have their own:
// the main publication holds the other tables, with every operation; the insert publication the
// append-only tables, publishing insert and truncate only (so PostgreSQL lets their updates and
// deletes run without a replica identity, and does not send them). A table is published whole,
// or with exactly its columns list as the column list; row filters are refused. A managed
// publication holds exactly its tables. An unmanaged one may publish more (other tables listed,
// FOR TABLES IN SCHEMA, FOR ALL TABLES: their changes are sent and dropped), but never an
// append-only table in the main publication, which would publish its updates and deletes.
func EnsurePublications(ctx context.Context, q queryer, cfg *Config, tables []TableInfo, refused []Refusal, version int) (Publications, error) {
	var main, ins []pubRel
	var mainRoot, insRoot bool // a partitioned table: its partitions' changes published as its own
	for _, t := range tables {
		r := newPubRel(t.Schema, t.Name, t.ColumnList)
		if t.AppendOnly {
			ins, insRoot = append(ins, r), insRoot || t.Partitioned
		} else {
			main, mainRoot = append(main, r), mainRoot || t.Partitioned
		}
	}
	var others []string
	for _, r := range refused {
		schema, table := ParseTable(r.Table)
		others = append(others, newPubRel(schema, table, nil).table)
	}
	pubs := Publications{Main: cfg.Publication}
	settle := func(name string, want, forbid []pubRel, ops publishOps, viaRoot bool) error {
		p := pubSpec{name: name, want: want, forbid: forbid, may: others, ops: ops, viaRoot: viaRoot}
		broader, err := ensurePublication(ctx, q, p, cfg.ManagePublication, version)
		if broader != "" {
			pubs.Broader = append(pubs.Broader, name+": "+broader)
		}
		return err
	}
	if err := settle(cfg.Publication, main, ins, allOps, mainRoot); err != nil {
		return pubs, err
	}
	if len(ins) == 0 {
		if cfg.ManagePublication { // a table that was append-only is no longer: nothing may stay in it
			if _, err := q.Exec(ctx, "DROP PUBLICATION IF EXISTS "+pgx.Identifier{cfg.InsertPublication}.Sanitize()); err != nil {
				return pubs, publicationErr(err, cfg.InsertPublication)
			}
		}
		return pubs, nil
	}
	pubs.Insert = cfg.InsertPublication
	return pubs, settle(cfg.InsertPublication, ins, nil, insertOps, insRoot)
}

// pubRel is a table of a publication as ALTER PUBLICATION … SET TABLE names it: the quoted table,
// and its column list (` ("a", "b")`, in table order) or "" for the whole table; schema is the
// table's schema, unquoted (FOR TABLES IN SCHEMA publishes by it).
type pubRel struct{ schema, table, cols string }

func newPubRel(schema, name string, cols []string) pubRel {
	return pubRel{schema: schema, table: pgx.Identifier{schema, name}.Sanitize(), cols: columnListSQL(cols)}
}

// columnListSQL is cols as a publication's column list, ` ("a", "b")`; "" for none.
func columnListSQL(cols []string) string {
	if len(cols) == 0 {
		return ""
	}
	q := make([]string, len(cols))
	for i, c := range cols {
		q[i] = pgx.Identifier{c}.Sanitize()
	}
	return " (" + strings.Join(q, ", ") + ")"
}

// sqlList is rels as a FOR TABLE / SET TABLE list, sorted.
func sqlList(rels []pubRel) string {
	out := make([]string, len(rels))
	for i, r := range rels {
		out[i] = r.table + r.cols
	}
	sort.Strings(out)
	return strings.Join(out, ", ")
}

// pubSpec is what one publication must publish: the tables want (each with its column list), the
// operations ops, partitions' changes as their root's when viaRoot (want holds a partitioned
// table: else PostgreSQL sends them as the partitions', which no configured table names), and
// none of the tables forbid. may are tables (quoted) an unmanaged one may hold without a word:
// the refused ones.
type pubSpec struct {
	name         string
	want, forbid []pubRel
	may          []string
	ops          publishOps
	viaRoot      bool
}

func (p pubSpec) with() string {
	opsText := allOpsText
	if p.ops == insertOps {
		opsText = insertText
	}
	with := "publish = '" + opsText + "'"
	if p.viaRoot {
		with += ", publish_via_partition_root = true"
	}
	return with
}

// ensurePublication makes a managed publication publish exactly p, or checks that an unmanaged
// one publishes at least p's tables as p says. It returns what else an unmanaged one publishes
// ("" when nothing but p's tables and the refused ones).
func ensurePublication(ctx context.Context, q queryer, p pubSpec, manage bool, version int) (string, error) {
	sc, err := readPublication(ctx, q, p.name, version)
	if err != nil {
		return "", err
	}
	pub := pgx.Identifier{p.name}.Sanitize()
	if !sc.exists {
		if !manage {
			return "", errcode.New(errcode.Publication, "publication "+p.name+" does not exist",
				fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE %s WITH (%s), or set publication.manage: true", pub, sqlList(p.want), p.with()))
		}
		sql := "CREATE PUBLICATION " + pub
		if len(p.want) > 0 {
			sql += " FOR TABLE " + sqlList(p.want)
		}
		_, err := q.Exec(ctx, sql+" WITH ("+p.with()+")")
		return "", publicationErr(err, p.name)
	}
	if !manage {
		if what, fix := sc.refusal(p); what != "" {
			return "", errcode.New(errcode.Publication, "publication "+p.name+" "+what, fix+", or set publication.manage: true")
		}
		return sc.broader(p), nil
	}
	if sc.all {
		return "", errcode.New(errcode.Publication, "publication "+p.name+" is FOR ALL TABLES, which pg_cdc cannot narrow to the configured tables (publication.manage: true)",
			"set publication.manage: false to stream through it as it is (the changes of the other tables are sent and dropped), or set publication.name to a publication pg_cdc may create")
	}
	if sqlList(sc.rels) == sqlList(p.want) && len(sc.filtered) == 0 && len(sc.schemas) == 0 && sc.ops == p.ops && (sc.viaRoot || !p.viaRoot) {
		return "", nil
	}
	switch {
	case len(p.want) > 0:
		_, err = q.Exec(ctx, "ALTER PUBLICATION "+pub+" SET TABLE "+sqlList(p.want)) // schemas go too
	case len(sc.rels) > 0 || len(sc.schemas) > 0:
		var drop []string
		for _, r := range sc.rels {
			drop = append(drop, "TABLE "+r.table) // DROP TABLE takes no column list
		}
		for _, s := range sc.schemas {
			drop = append(drop, "TABLES IN SCHEMA "+pgx.Identifier{s}.Sanitize())
		}
		_, err = q.Exec(ctx, "ALTER PUBLICATION "+pub+" DROP "+strings.Join(drop, ", "))
	}
	if err != nil {
		return "", publicationErr(err, p.name)
	}
	_, err = q.Exec(ctx, "ALTER PUBLICATION "+pub+" SET ("+p.with()+")")
	return "", publicationErr(err, p.name)
}

// pubScope is what a publication publishes, as the catalog says.
type pubScope struct {
	exists   bool
	ops      publishOps
	viaRoot  bool            // publish_via_partition_root
	all      bool            // FOR ALL TABLES
	schemas  []string        // FOR TABLES IN SCHEMA (PostgreSQL 15+), unquoted
	rels     []pubRel        // the tables listed by name, each with its column list
	filtered map[string]bool // the listed tables (quoted) a row filter narrows
}

// holds reports whether the publication publishes r's table, and if so with which column list
// ("" whole: a table it publishes by its schema or as FOR ALL TABLES is always whole) and whether
// a row filter narrows it.
func (sc pubScope) holds(r pubRel) (held bool, cols string, filtered bool) {
	for _, h := range sc.rels {
		if h.table == r.table {
			return true, h.cols, sc.filtered[h.table]
		}
	}
	return sc.all || slices.Contains(sc.schemas, r.schema), "", false
}

// refusal says why an unmanaged publication cannot serve p, and the fix ("" when it can).
func (sc pubScope) refusal(p pubSpec) (what, fix string) {
	pub := pgx.Identifier{p.name}.Sanitize()
	for _, r := range p.want {
		held, cols, filtered := sc.holds(r)
		listed := slices.ContainsFunc(sc.rels, func(h pubRel) bool { return h.table == r.table })
		switch {
		case !held:
			return "does not publish " + r.table, fmt.Sprintf("ALTER PUBLICATION %s ADD TABLE %s", pub, r.table+r.cols)
		case filtered:
			return "publishes only the rows of " + r.table + " that its row filter passes (a filtered stream could not be made complete)",
				readd(pub, r)
		case cols != r.cols && listed:
			return fmt.Sprintf("publishes %s with another column list than its tables[].columns (%q, want %q)", r.table, strings.TrimSpace(cols), strings.TrimSpace(r.cols)),
				readd(pub, r)
		case cols != r.cols:
			return "publishes " + r.table + " whole (FOR ALL TABLES or TABLES IN SCHEMA), not only its tables[].columns",
				fmt.Sprintf("use a publication FOR TABLE %s", sqlList(p.want))
		}
	}
	for _, r := range p.forbid {
		if held, _, _ := sc.holds(r); held {
			return "publishes the append-only table " + r.table + " with its updates and deletes (PostgreSQL then needs a replica identity for them, and sends them)",
				fmt.Sprintf("publish %s in %s only: ALTER PUBLICATION %s DROP TABLE %s, or a publication FOR TABLE of the other tables", r.table, p.name+InsertPublicationSuffix, pub, r.table)
		}
	}
	switch {
	case sc.ops != p.ops:
		return "does not publish exactly " + strings.TrimSuffix(strings.TrimPrefix(p.with(), "publish = '"), "'"), fmt.Sprintf("ALTER PUBLICATION %s SET (%s)", pub, p.with())
	case p.viaRoot && !sc.viaRoot:
		return "publishes the changes of a partitioned table's partitions as theirs, not the table's (publish_via_partition_root is off)",
			fmt.Sprintf("ALTER PUBLICATION %s SET (%s)", pub, p.with())
	}
	return "", ""
}

// readd is the SQL that publishes r again as r says, in one transaction (so no change of it goes
// unpublished between the two).
func readd(pub string, r pubRel) string {
	return fmt.Sprintf("BEGIN; ALTER PUBLICATION %s DROP TABLE %s; ALTER PUBLICATION %s ADD TABLE %s; COMMIT", pub, r.table, pub, r.table+r.cols)
}

// broader says what else an unmanaged publication publishes beyond p's tables and the refused
// ones: "FOR ALL TABLES", its schemas, or how many other tables it lists ("" for nothing).
func (sc pubScope) broader(p pubSpec) string {
	var what []string
	if sc.all {
		what = append(what, "FOR ALL TABLES")
	}
	if len(sc.schemas) > 0 {
		what = append(what, "FOR TABLES IN SCHEMA "+strings.Join(sc.schemas, ", "))
	}
	n := 0
	for _, h := range sc.rels {
		if !slices.ContainsFunc(p.want, func(r pubRel) bool { return r.table == h.table }) && !slices.Contains(p.may, h.table) {
			n++
		}
	}
	if n > 0 && !sc.all {
		what = append(what, fmt.Sprintf("%d other tables listed", n))
	}
	return strings.Join(what, "; ")
}

// readPublication reads what publication name publishes (exists false when there is none).
func readPublication(ctx context.Context, q queryer, name string, version int) (pubScope, error) {
	sc := pubScope{filtered: map[string]bool{}}
	err := q.QueryRow(ctx, `SELECT true, pubinsert, pubupdate, pubdelete, pubtruncate, pubviaroot, puballtables
		FROM pg_catalog.pg_publication WHERE pubname = $1`, name).Scan(&sc.exists, &sc.ops.insert, &sc.ops.update, &sc.ops.delete, &sc.ops.truncate, &sc.viaRoot, &sc.all)
	if errors.Is(err, pgx.ErrNoRows) {
		return sc, nil
	}
	if err != nil {
		return sc, fmt.Errorf("read pg_publication: %w", err)
	}
	filterExpr := "false"
	if version >= 150000 {
		filterExpr = "pr.prqual IS NOT NULL"
	}
	rows, err := q.Query(ctx, `SELECT n.nspname, c.relname, `+filterExpr+`, `+columnListExpr(version)+` FROM pg_catalog.pg_publication_rel pr
		JOIN pg_catalog.pg_publication p ON p.oid = pr.prpubid
		JOIN pg_catalog.pg_class c ON c.oid = pr.prrelid JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		WHERE p.pubname = $1`, name)
	if err != nil {
		return sc, fmt.Errorf("read pg_publication_rel: %w", err)
	}
	for rows.Next() {
		var s, t string
		var f bool
		var cols []string
		if err := rows.Scan(&s, &t, &f, &cols); err != nil {
			rows.Close()
			return sc, fmt.Errorf("read pg_publication_rel: %w", err)
		}
		r := newPubRel(s, t, cols)
		sc.rels = append(sc.rels, r)
		if f {
			sc.filtered[r.table] = true
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return sc, fmt.Errorf("read pg_publication_rel: %w", err)
	}
	if version < 150000 {
		return sc, nil
	}
	rows, err = q.Query(ctx, `SELECT n.nspname FROM pg_catalog.pg_publication_namespace pn
		JOIN pg_catalog.pg_publication p ON p.oid = pn.pnpubid JOIN pg_catalog.pg_namespace n ON n.oid = pn.pnnspid
		WHERE p.pubname = $1 ORDER BY n.nspname`, name)
	if err != nil {
		return sc, fmt.Errorf("read pg_publication_namespace: %w", err)
	}
	sc.schemas, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return sc, fmt.Errorf("read pg_publication_namespace: %w", err)
	}
	return sc, nil
}

// columnListExpr is the SQL of the column list of pg_publication_rel pr: its column names in table
// order, NULL for the whole table (always before PostgreSQL 15, which has no column lists).
func columnListExpr(version int) string {
	if version < 150000 {
		return "NULL::text[]"
	}
	return `(SELECT array_agg(a.attname::text ORDER BY a.attnum) FROM pg_catalog.pg_attribute a
		WHERE a.attrelid = pr.prrelid AND a.attnum = ANY(pr.prattrs::int2[]))`
}

func publicationErr(err error, name string) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42501" {
		return errcode.Wrap(errcode.Publication, err, "not allowed to create or alter publication "+name,
			"own the tables (or be superuser), or create the publication by hand and set publication.manage: false")
	}
	if err != nil {
		return fmt.Errorf("publication %s: %w", name, err)
	}
	return nil
}

// PublicationDrift reports a configured table that left its publication, or whose column list
// changed, or that a row filter narrows, while the source streams (checked with the heartbeat): `ALTER PUBLICATION … DROP TABLE`,
// or `ALTER TABLE … DROP COLUMN … CASCADE` of a listed column, which takes the table out of the
// publication. pgoutput then stops sending the table's changes without a word, so the session
// ends with a publication error: the next start puts the table back (a managed publication) or is
// refused (an unmanaged one), and the error says that the changes made meanwhile were not sent. A
// table that no longer exists (DROP TABLE) is no drift: its changes up to the drop are still in the
// WAL, and the next start refuses it (table_missing). Unless a table of its name was created
// again outside the source's publications: PostgreSQL sends none of the new table's changes, so
// that is drift too, and the next start takes the new table (and reads it).
func PublicationDrift(ctx context.Context, q queryer, pubs Publications, tables []TableInfo, version int) error {
	oids := make([]uint32, len(tables))
	for i, t := range tables {
		oids[i] = t.OID
	}
	filterExpr, bySchema := "false", ""
	if version >= 150000 {
		filterExpr = "coalesce(pr.prqual IS NOT NULL, false)"
		bySchema = ` OR EXISTS (SELECT 1 FROM pg_catalog.pg_publication_namespace pn WHERE pn.pnpubid = p.oid AND pn.pnnspid = c.relnamespace)`
	}
	rows, err := q.Query(ctx, `SELECT c.oid, coalesce(p.pubname, ''), `+columnListExpr(version)+`, `+filterExpr+`
		FROM pg_catalog.pg_class c
		LEFT JOIN pg_catalog.pg_publication p ON p.pubname = ANY($2) AND (p.puballtables
			OR EXISTS (SELECT 1 FROM pg_catalog.pg_publication_rel r WHERE r.prpubid = p.oid AND r.prrelid = c.oid)`+bySchema+`)
		LEFT JOIN pg_catalog.pg_publication_rel pr ON pr.prrelid = c.oid AND pr.prpubid = p.oid
		WHERE c.oid = ANY($1)`, oids, pubs.Names())
	if err != nil {
		return fmt.Errorf("check the publications: %w", err)
	}
	type rel struct {
		pub string
		oid uint32
	}
	type membership struct {
		cols     string // its column list there ("" whole)
		filtered bool   // a row filter narrows it
	}
	exists := map[uint32]bool{}
	held := map[rel]membership{} // a publication's table → how it publishes it
	for rows.Next() {
		var oid uint32
		var pub string
		var cols []string
		var filtered bool
		if err := rows.Scan(&oid, &pub, &cols, &filtered); err != nil {
			rows.Close()
			return fmt.Errorf("check the publications: %w", err)
		}
		exists[oid] = true
		if pub != "" {
			held[rel{pub, oid}] = membership{columnListSQL(cols), filtered}
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("check the publications: %w", err)
	}
	for _, t := range tables {
		if !exists[t.OID] {
			if err := recreated(ctx, q, pubs, t); err != nil {
				return err
			}
			continue // dropped: not drift
		}
		want := pubs.Main
		if t.AppendOnly {
			want = pubs.Insert
		}
		m, ok := held[rel{want, t.OID}]
		fix := "none for a managed publication: the next start puts the table back and, with snapshot: initial, reads its rows again (with snapshot: never, pgrelay resync); an unmanaged one: ALTER PUBLICATION as the start error says, and the start after it reads the table again"
		var what string
		switch {
		case !ok:
			what = "no longer holds " + t.Full() + " while it was streamed (ALTER PUBLICATION, or ALTER TABLE … DROP COLUMN … CASCADE of a listed column): PostgreSQL did not send its changes made since then"
		case m.cols != columnListSQL(t.ColumnList):
			what = "has another column list for " + t.Full() + " while it was streamed (ALTER PUBLICATION): PostgreSQL sent its changes since then with other columns"
			fix = "the next start puts a managed publication's column list back (an unmanaged one is refused until ALTER PUBLICATION as the start error says); the rows changed meanwhile are read again by pgrelay snapshot -c <config> " + t.Full()
		case m.filtered:
			what = "has a row filter on " + t.Full() + " while it was streamed (ALTER PUBLICATION … WHERE): PostgreSQL did not send the changes it held back"
			fix = "the next start takes the filter off a managed publication (an unmanaged one is refused until ALTER PUBLICATION as the start error says); the rows it held back are read again by pgrelay snapshot -c <config> " + t.Full()
		default:
			continue
		}
		return errcode.New(errcode.Publication, "publication "+want+" "+what, fix)
	}
	return nil
}

// recreated reports, as drift, a table of t's name that is not t (dropped and created again) and
// that no publication of the source holds: PostgreSQL sends none of its changes.
func recreated(ctx context.Context, q queryer, pubs Publications, t TableInfo) error {
	var oid uint32
	var published bool
	err := q.QueryRow(ctx, `SELECT c.oid, EXISTS (SELECT 1 FROM pg_catalog.pg_publication_tables p
			WHERE p.pubname = ANY($3) AND p.schemaname = n.nspname AND p.tablename = c.relname)
		FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relname = $2`, t.Schema, t.Name, pubs.Names()).Scan(&oid, &published)
	if errors.Is(err, pgx.ErrNoRows) || err == nil && published {
		return nil
	}
	if err != nil {
		return fmt.Errorf("check the publications: %w", err)
	}
	return errcode.New(errcode.Publication,
		fmt.Sprintf("table %s was dropped and created again while it was streamed (oid %d, now %d): the new table is in no publication of the source, so PostgreSQL sends none of its changes", t.Full(), t.OID, oid),
		"none for a managed publication: the next start puts the new table in and, with snapshot: initial, reads its rows (with snapshot: never, pgrelay resync; rows of the dropped table get no d); an unmanaged one: ALTER PUBLICATION … ADD TABLE, and the start after it reads the table")
}
