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
// the main publication holds exactly the other tables, with every operation; the insert
// publication exactly the append-only tables, publishing insert and truncate only (so
// PostgreSQL lets their updates and deletes run without a replica identity, and does not send
// them). A table is published whole, or with exactly its columns list as the column list; row
// filters are refused. A refused table may stay in an unmanaged publication (its changes are
// dropped); a managed one never holds it.
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
	if err := ensurePublication(ctx, q, cfg.Publication, cfg.ManagePublication, main, others, allOps, mainRoot, version); err != nil {
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
	return pubs, ensurePublication(ctx, q, cfg.InsertPublication, cfg.ManagePublication, ins, others, insertOps, insRoot, version)
}

// pubRel is a table of a publication as ALTER PUBLICATION … SET TABLE names it: the quoted table,
// and its column list (` ("a", "b")`, in table order) or "" for the whole table.
type pubRel struct{ table, cols string }

func newPubRel(schema, name string, cols []string) pubRel {
	return pubRel{table: pgx.Identifier{schema, name}.Sanitize(), cols: columnListSQL(cols)}
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

// ensurePublication makes publication name hold exactly the tables want, each with its column
// list, and publish ops; an unmanaged one may also hold the tables of may (quoted). With viaRoot
// (want holds a partitioned table) it publishes partitions' changes as their root's
// (publish_via_partition_root): else PostgreSQL sends them as the partitions', which no
// configured table names.
func ensurePublication(ctx context.Context, q queryer, name string, manage bool, want []pubRel, may []string, ops publishOps, viaRoot bool, version int) error {
	opsText := allOpsText
	if ops == insertOps {
		opsText = insertText
	}
	with := "publish = '" + opsText + "'"
	if viaRoot {
		with += ", publish_via_partition_root = true"
	}
	var exists, haveRoot bool
	var have publishOps
	err := q.QueryRow(ctx, `SELECT true, pubinsert, pubupdate, pubdelete, pubtruncate, pubviaroot
		FROM pg_catalog.pg_publication WHERE pubname = $1`, name).Scan(&exists, &have.insert, &have.update, &have.delete, &have.truncate, &haveRoot)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("read pg_publication: %w", err)
	}
	pub := pgx.Identifier{name}.Sanitize()
	if !exists {
		if !manage {
			return errcode.New(errcode.Publication, "publication "+name+" does not exist",
				fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE %s WITH (%s), or set publication.manage: true", pub, sqlList(want), with))
		}
		sql := "CREATE PUBLICATION " + pub
		if len(want) > 0 {
			sql += " FOR TABLE " + sqlList(want)
		}
		_, err := q.Exec(ctx, sql+" WITH ("+with+")")
		return publicationErr(err, name)
	}
	haveRels, filtered, err := publicationTables(ctx, q, name, version)
	if err != nil {
		return err
	}
	exact := sqlList(haveRels) == sqlList(want)
	if !manage {
		missing, extra := false, false
		for _, r := range want {
			missing = missing || !slices.Contains(haveRels, r)
		}
		for _, r := range haveRels {
			extra = extra || !slices.Contains(want, r) && !slices.Contains(may, r.table)
		}
		what := ""
		switch {
		case filtered:
			what = "has a row filter, or is FOR ALL TABLES (a filtered stream could not be made complete)"
		case missing || extra:
			what = "does not publish exactly the tables (and column lists) " + sqlList(want)
		case have != ops:
			what = "does not publish exactly " + opsText
		case viaRoot && !haveRoot:
			what = "publishes the changes of a partitioned table's partitions as theirs, not the table's (publish_via_partition_root is off)"
		default:
			return nil
		}
		return errcode.New(errcode.Publication, "publication "+name+" "+what,
			fmt.Sprintf("ALTER PUBLICATION %s SET TABLE %s; ALTER PUBLICATION %s SET (%s), or set publication.manage: true",
				pub, sqlList(want), pub, with))
	}
	if exact && !filtered && have == ops && (haveRoot || !viaRoot) {
		return nil
	}
	if len(want) > 0 {
		_, err = q.Exec(ctx, "ALTER PUBLICATION "+pub+" SET TABLE "+sqlList(want))
	} else if len(haveRels) > 0 {
		tables := make([]string, len(haveRels))
		for i, r := range haveRels {
			tables[i] = r.table // DROP TABLE takes no column list
		}
		_, err = q.Exec(ctx, "ALTER PUBLICATION "+pub+" DROP TABLE "+strings.Join(tables, ", "))
	}
	if err != nil {
		return publicationErr(err, name)
	}
	_, err = q.Exec(ctx, "ALTER PUBLICATION "+pub+" SET ("+with+")")
	return publicationErr(err, name)
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

// publicationTables lists a publication's tables with their column lists, and whether any has a
// row filter (a FOR ALL TABLES publication counts as filtered: it is never exactly the tables).
func publicationTables(ctx context.Context, q queryer, name string, version int) ([]pubRel, bool, error) {
	filterExpr := "false"
	if version >= 150000 {
		filterExpr = "pr.prqual IS NOT NULL"
	}
	rows, err := q.Query(ctx, `SELECT n.nspname, c.relname, `+filterExpr+`, `+columnListExpr(version)+` FROM pg_catalog.pg_publication_rel pr
		JOIN pg_catalog.pg_publication p ON p.oid = pr.prpubid
		JOIN pg_catalog.pg_class c ON c.oid = pr.prrelid JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		WHERE p.pubname = $1`, name)
	if err != nil {
		return nil, false, fmt.Errorf("read pg_publication_rel: %w", err)
	}
	defer rows.Close()
	var have []pubRel
	filtered := false
	for rows.Next() {
		var s, t string
		var f bool
		var cols []string
		if err := rows.Scan(&s, &t, &f, &cols); err != nil {
			return nil, false, err
		}
		have = append(have, newPubRel(s, t, cols))
		filtered = filtered || f
	}
	var all bool
	if err := q.QueryRow(ctx, `SELECT puballtables FROM pg_catalog.pg_publication WHERE pubname = $1`, name).Scan(&all); err == nil && all {
		return nil, true, rows.Err()
	}
	return have, filtered, rows.Err()
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
// changed, while the source streams (checked with the heartbeat): `ALTER PUBLICATION … DROP TABLE`,
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
	rows, err := q.Query(ctx, `SELECT c.oid, coalesce(p.pubname, ''), `+columnListExpr(version)+`
		FROM pg_catalog.pg_class c
		LEFT JOIN pg_catalog.pg_publication_rel pr ON pr.prrelid = c.oid
			AND pr.prpubid IN (SELECT oid FROM pg_catalog.pg_publication WHERE pubname = ANY($2))
		LEFT JOIN pg_catalog.pg_publication p ON p.oid = pr.prpubid
		WHERE c.oid = ANY($1)`, oids, pubs.Names())
	if err != nil {
		return fmt.Errorf("check the publications: %w", err)
	}
	type rel struct {
		pub string
		oid uint32
	}
	exists := map[uint32]bool{}
	held := map[rel]string{} // a publication's table → its column list there
	for rows.Next() {
		var oid uint32
		var pub string
		var cols []string
		if err := rows.Scan(&oid, &pub, &cols); err != nil {
			rows.Close()
			return fmt.Errorf("check the publications: %w", err)
		}
		exists[oid] = true
		if pub != "" {
			held[rel{pub, oid}] = columnListSQL(cols)
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
		cols, ok := held[rel{want, t.OID}]
		what := ""
		switch {
		case !ok:
			what = "no longer holds " + t.Full()
		case cols != columnListSQL(t.ColumnList):
			what = "has another column list for " + t.Full()
		default:
			continue
		}
		return errcode.New(errcode.Publication,
			fmt.Sprintf("publication %s %s while it was streamed (ALTER PUBLICATION, or ALTER TABLE … DROP COLUMN … CASCADE of a listed column): PostgreSQL did not send its changes made since then", want, what),
			"none for a managed publication: the next start puts the table back and, with snapshot: initial, reads its rows again (with snapshot: never, pgrelay resync); an unmanaged one: ALTER PUBLICATION as the start error says, and the start after it reads the table again")
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
