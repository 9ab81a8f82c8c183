package source

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/pgconnect"
	"github.com/pgrelay/pgrelay/resources"
)

// TableInfo is what the catalog says about a configured table.
type TableInfo struct {
	Table
	OID      uint32
	Identity byte     // relreplident: d default, f full, i index, n nothing
	Key      []string // key columns in key order: the identity index's, else the primary key's
	// Partitioned is a partitioned table: its partitions' changes are published as its own
	// (publish_via_partition_root), and the snapshot reads it through the root.
	Partitioned bool
}

// queryer is a pgx connection or pool.
type queryer interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// CheckServer refuses servers older than 14 or without wal_level=logical (failover slots need 17),
// and a standby or a read-only session (pg_cdc writes its publication, slot and watermarks).
func CheckServer(ctx context.Context, q queryer, failover bool) (int, error) {
	var version int
	var walLevel string
	if err := q.QueryRow(ctx, `SELECT current_setting('server_version_num')::int, current_setting('wal_level')`).Scan(&version, &walLevel); err != nil {
		return 0, fmt.Errorf("read server settings: %w", err)
	}
	if err := pgconnect.CheckWritable(ctx, q); err != nil {
		return version, err
	}
	if version < 140000 {
		return version, errcode.New(errcode.Version, fmt.Sprintf("PostgreSQL %d is too old: pg_cdc needs 14 or newer", version/10000),
			"upgrade PostgreSQL to 14 or newer")
	}
	if failover && version < 170000 {
		return version, errcode.New(errcode.Version, "slot.failover needs PostgreSQL 17 or newer",
			"set slot.failover: false, or upgrade to PostgreSQL 17")
	}
	if walLevel != "logical" {
		return version, errcode.New(errcode.WALLevel, "wal_level is "+walLevel+", logical decoding needs logical",
			"set wal_level = logical in postgresql.conf and restart PostgreSQL")
	}
	return version, nil
}

// Refusal is a configured table a start check refused, with its coded error (table_missing,
// source_privileges, replica_identity or partition_by).
type Refusal struct {
	Table string // "schema.name"
	Err   error
}

// LoadTables reads and checks every configured table before anything touches the publication:
// it exists, the role may read it (USAGE on its schema, SELECT on it or on its listed columns),
// has a key (identity index, else primary key; not REPLICA IDENTITY NOTHING) unless it is
// append-only, its partition_by columns exist and lie inside the identity unless it is REPLICA
// IDENTITY FULL or append-only (no delete is streamed, so no old row must name its partition),
// and its columns list can be a publication column list (checkColumnList). A table a check
// refuses comes back in refused, the others in ok; err is only a failure to read the catalog.
// version is the server's server_version_num.
func LoadTables(ctx context.Context, q queryer, tables []Table, version int) (ok []TableInfo, refused []Refusal, err error) {
	for i, t := range tables {
		ti, err := loadTable(ctx, q, t, version)
		if errcode.Of(err) != "" {
			refused = append(refused, Refusal{Table: t.Full(), Err: fmt.Errorf("%s: %w", t.ref(i), err)})
			continue
		}
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", t.ref(i), err)
		}
		ok = append(ok, ti)
	}
	if slices.ContainsFunc(ok, func(t TableInfo) bool { return t.Partitioned }) {
		return refuseListedPartitions(ctx, q, ok, refused)
	}
	return ok, refused, nil
}

// refuseListedPartitions refuses a partition listed beside a partitioned table it belongs to: the
// publication sends its changes as the partitioned table's, so its own entry would get none.
func refuseListedPartitions(ctx context.Context, q queryer, ok []TableInfo, refused []Refusal) ([]TableInfo, []Refusal, error) {
	oids := make([]uint32, len(ok))
	for i, t := range ok {
		oids[i] = t.OID
	}
	rows, err := q.Query(ctx, `SELECT c.oid, a.relid::oid FROM unnest($1::oid[]) AS c(oid)
		CROSS JOIN LATERAL pg_catalog.pg_partition_ancestors(c.oid) AS a(relid)
		WHERE a.relid::oid <> c.oid AND a.relid::oid = ANY($1)`, oids)
	if err != nil {
		return nil, nil, fmt.Errorf("read partition ancestors: %w", err)
	}
	within := map[uint32]uint32{} // a listed partition → a listed table it belongs to
	for rows.Next() {
		var part, root uint32
		if err := rows.Scan(&part, &root); err != nil {
			rows.Close()
			return nil, nil, fmt.Errorf("read partition ancestors: %w", err)
		}
		within[part] = root
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("read partition ancestors: %w", err)
	}
	byOID := map[uint32]string{}
	for _, t := range ok {
		byOID[t.OID] = t.Full()
	}
	kept := ok[:0:0]
	for _, t := range ok {
		root, in := within[t.OID]
		if !in {
			kept = append(kept, t)
			continue
		}
		refused = append(refused, Refusal{Table: t.Full(), Err: errcode.New(errcode.Publication,
			fmt.Sprintf("%s is a partition of %s, which is listed too: its changes are streamed as %s's", t.Full(), byOID[root], byOID[root]),
			"remove "+t.Full()+" from tables (its rows are streamed as "+byOID[root]+"'s), or list the partitions instead of "+byOID[root])})
	}
	return kept, refused, nil
}

// ExpandTables replaces each pattern entry (`schema.prefix_*`) with the tables it matches now, in
// name order, each with the entry's options: the ordinary and partitioned tables of its schema
// that no entry by name and no earlier pattern names. A partition is never matched (its
// partitioned table is streamed whole, or it is listed by name), nor an UNLOGGED table (it writes
// no WAL: a scratch table, never streamed). Entries by name stay as they are,
// in their place; a pattern's exclude list takes tables out of its matches. Patterns matching no
// table at all, or more tables than a source streams, are table_pattern.
func ExpandTables(ctx context.Context, q queryer, tables []Table) ([]Table, error) {
	if !slices.ContainsFunc(tables, Table.Pattern) {
		return tables, nil
	}
	named := map[string]bool{}
	for _, t := range tables {
		if !t.Pattern() {
			named[t.Full()] = true
		}
	}
	var out []Table
	var patterns []string
	for _, t := range tables {
		if !t.Pattern() {
			out = append(out, t)
			continue
		}
		patterns = append(patterns, t.Full())
		like := strings.NewReplacer(`\`, `\\`, "%", `\%`, "_", `\_`, "*", "%").Replace(t.Name)
		rows, err := q.Query(ctx, `SELECT c.relname FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
			WHERE n.nspname = $1 AND c.relkind IN ('r', 'p') AND c.relpersistence = 'p' AND NOT c.relispartition AND c.relname::text LIKE $2
			ORDER BY c.relname::text COLLATE "C"`, t.Schema, like)
		if err != nil {
			return nil, fmt.Errorf("match %s: %w", t.Full(), err)
		}
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return nil, fmt.Errorf("match %s: %w", t.Full(), err)
		}
		for _, name := range names {
			m := t
			m.Name, m.From, m.Exclude = name, t.Full(), nil
			if named[m.Full()] || t.excludes(m.Full()) {
				continue
			}
			named[m.Full()] = true
			out = append(out, m)
		}
	}
	switch {
	case len(out) == 0:
		return nil, errcode.New(errcode.TablePattern, "no table matches "+strings.Join(patterns, ", "),
			"create a table the pattern names, or correct the pattern (a * in the table's name stands for any characters; names are case-sensitive)")
	case len(out) > MaxTables:
		return nil, errcode.New(errcode.TablePattern, fmt.Sprintf("%s match %d tables, more than the %d a source streams", strings.Join(patterns, ", "), len(out), MaxTables),
			"narrow the patterns, or split the tables between sources (each its own name)")
	}
	return out, nil
}

// RefuseUnpublished refuses, with an unmanaged publication, the tables a pattern matched that are
// not in their publication (the main one, or the insert one for append-only tables): a table
// created since the administrator last altered it. A table listed by name missing there refuses
// the whole start (ensurePublication); one a pattern found refuses only itself, so a new table
// does not stop the others. It returns the tables kept, the refusals, and the tables it refused.
func RefuseUnpublished(ctx context.Context, q queryer, cfg *Config, ok []TableInfo, refused []Refusal, version int) ([]TableInfo, []Refusal, []TableInfo, error) {
	pubOf := func(t TableInfo) string {
		if t.AppendOnly {
			return cfg.InsertPublication
		}
		return cfg.Publication
	}
	matched := map[string][]TableInfo{} // publication → the tables a pattern matched for it
	for _, t := range ok {
		if t.From != "" {
			matched[pubOf(t)] = append(matched[pubOf(t)], t)
		}
	}
	if cfg.ManagePublication || len(matched) == 0 {
		return ok, refused, nil, nil
	}
	var out []string
	for pub, tables := range matched {
		o, err := outOfPublications(ctx, q, []string{pub}, tables, version)
		if err != nil {
			return nil, nil, nil, err
		}
		out = append(out, o...)
	}
	kept := ok[:0:0]
	var unpublished []TableInfo
	for _, t := range ok {
		if t.From == "" || !slices.Contains(out, t.Full()) {
			kept = append(kept, t)
			continue
		}
		pub := pubOf(t)
		unpublished = append(unpublished, t)
		refused = append(refused, Refusal{Table: t.Full(), Err: errcode.New(errcode.Publication,
			fmt.Sprintf("%s (matched by %s) is not in publication %s (publication.manage: false)", t.Full(), t.From, pub),
			fmt.Sprintf("ALTER PUBLICATION %s ADD TABLE %s: the source then streams it (and, with snapshot: initial, reads it) within heartbeat/2",
				pgx.Identifier{pub}.Sanitize(), newPubRel(t.Schema, t.Name, nil).table))})
	}
	return kept, refused, unpublished, nil
}

// otherCase names a table whose schema and name differ from t's in letter case only ("" when none,
// or when the catalog cannot be read): the usual reason a configured table is not found.
func otherCase(ctx context.Context, q queryer, t Table) string {
	var schema, name string
	err := q.QueryRow(ctx, `SELECT n.nspname, c.relname FROM pg_catalog.pg_class c
		JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		WHERE lower(n.nspname) = lower($1) AND lower(c.relname) = lower($2) AND c.relkind IN ('r', 'p')
		ORDER BY n.nspname = $1 DESC, c.relname LIMIT 1`, t.Schema, t.Name).Scan(&schema, &name)
	if err != nil {
		return ""
	}
	return Table{Schema: schema, Name: name}.Full()
}

func loadTable(ctx context.Context, q queryer, t Table, version int) (TableInfo, error) {
	ti := TableInfo{Table: t}
	var kind, ident, role, persistence string
	var usage, sel bool
	err := q.QueryRow(ctx, `SELECT c.oid, c.relreplident::text, c.relkind::text, c.relpersistence::text, current_user,
		has_schema_privilege(n.oid, 'USAGE'), has_table_privilege(c.oid, 'SELECT') FROM pg_catalog.pg_class c
		JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2`,
		t.Schema, t.Name).Scan(&ti.OID, &ident, &kind, &persistence, &role, &usage, &sel)
	if errors.Is(err, pgx.ErrNoRows) {
		if other := otherCase(ctx, q, t); other != "" {
			return ti, errcode.New(errcode.TableMissing, "table "+t.Full()+" does not exist, but "+other+" does",
				"names are case-sensitive and taken as written: set tables[].table to "+other)
		}
		return ti, errcode.New(errcode.TableMissing, "table "+t.Full()+" does not exist", "create it, or correct its name in tables[].table: if it was renamed, its new name (the stream resumes where it stopped and its changes made under the old name are kept); remove its entry if it was dropped")
	}
	if err != nil {
		return ti, fmt.Errorf("read pg_class: %w", err)
	}
	ti.Identity = ident[0]
	ti.Partitioned = kind == "p"
	if kind != "r" && kind != "p" {
		return ti, errcode.New(errcode.TableMissing, t.Full()+" is not a table (relkind "+kind+": a view, a materialized view, a foreign table...)", "list ordinary or partitioned tables only")
	}
	if persistence != "p" { // unlogged: no WAL, so nothing to decode (and no publication takes it)
		return ti, errcode.New(errcode.TableMissing, t.Full()+" is UNLOGGED: PostgreSQL writes no WAL for its changes, so none can be streamed",
			"ALTER TABLE "+pgx.Identifier{t.Schema, t.Name}.Sanitize()+" SET LOGGED, or remove it from tables")
	}
	if len(t.ColumnList) > 0 && version < 150000 {
		return ti, errcode.New(errcode.ColumnList, fmt.Sprintf("tables[].columns needs PostgreSQL 15 or newer (publication column lists); this is %d", version/10000),
			"stream "+t.Full()+" whole (drop its columns list), or upgrade PostgreSQL to 15 or newer")
	}
	var unreadable []string // without SELECT on the table, the listed columns the role may not read
	if !sel && len(t.ColumnList) > 0 {
		if unreadable, err = unreadableColumns(ctx, q, ti.OID, t.ColumnList); err != nil {
			return ti, err
		}
		sel = len(unreadable) == 0
	}
	if err := tablePrivileges(t, role, usage, sel, unreadable); err != nil {
		return ti, err
	}
	// The identity index (USING INDEX) or else the primary key, columns in index order.
	rows, err := q.Query(ctx, `SELECT a.attname FROM pg_catalog.pg_index i
		CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
		JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
		WHERE i.indrelid = $1 AND (CASE WHEN $2 = 'i' THEN i.indisreplident ELSE i.indisprimary END)
		ORDER BY k.ord`, ti.OID, ident)
	if err != nil {
		return ti, fmt.Errorf("read the key: %w", err)
	}
	ti.Key, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return ti, fmt.Errorf("read the key: %w", err)
	}
	switch {
	case t.AppendOnly && len(ti.Key) == 0 && t.Mode == PartitionByKey:
		return ti, errcode.New(errcode.PartitionBy, t.Full()+" has no key to partition by (partition_by: key is the default)",
			"set tables[].partition_by to single or to a list of its columns")
	case t.AppendOnly: // only inserts are published: no identity needed
	case ti.Identity == 'n' || len(ti.Key) == 0:
		return ti, errcode.New(errcode.ReplicaIdentity, t.Full()+" has no key pg_cdc can use (REPLICA IDENTITY NOTHING, or no primary key)",
			"add a primary key, or ALTER TABLE "+t.Full()+" REPLICA IDENTITY USING INDEX <unique index>; for a table that only gets inserts (a log), set tables[].append_only: true")
	}
	if ti.Mode != PartitionByColumns && len(ti.ColumnList) == 0 {
		return ti, nil
	}
	cols, err := tableColumns(ctx, q, ti.OID)
	if err != nil {
		return ti, err
	}
	if err := checkPartitionColumns(ti, cols); err != nil {
		return ti, err
	}
	return ti, checkColumnList(&ti, cols)
}

// column is a column of a table, as the catalog has it.
type column struct {
	name      string
	generated bool
}

// tableColumns reads table oid's columns in table order (dropped ones left out).
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

// tableName is the current schema.name of the table with oid, as tables[].table writes it (no
// quotes), or "" when no such table exists.
func tableName(ctx context.Context, q queryer, oid uint32) (string, error) {
	var name string
	err := q.QueryRow(ctx, `SELECT n.nspname || '.' || c.relname FROM pg_catalog.pg_class c
		JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = $1`, oid).Scan(&name)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	return name, err
}

func tableColumns(ctx context.Context, q queryer, oid uint32) ([]column, error) {
	rows, err := q.Query(ctx, `SELECT attname, attgenerated <> '' FROM pg_catalog.pg_attribute
		WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped ORDER BY attnum`, oid)
	if err != nil {
		return nil, fmt.Errorf("read columns: %w", err)
	}
	cols, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (c column, err error) {
		return c, r.Scan(&c.name, &c.generated)
	})
	if err != nil {
		return nil, fmt.Errorf("read columns: %w", err)
	}
	return cols, nil
}

// checkColumnList checks that a table's columns list can be a publication column list and puts it
// in table order (the order of the stream's and the snapshot's columns): every listed column
// exists and is not generated, and the list holds the key (PostgreSQL refuses a user's UPDATE or
// DELETE on a table whose column list misses a replica identity column) and the partition_by
// columns (each event's partition is computed from them). REPLICA IDENTITY FULL makes every
// column part of the identity, so such a table must be append-only.
func checkColumnList(ti *TableInfo, cols []column) error {
	if len(ti.ColumnList) == 0 {
		return nil
	}
	refuse := func(what, fix string) error {
		return errcode.New(errcode.ColumnList, "tables[].columns of "+ti.Full()+": "+what, fix)
	}
	if ti.Identity == 'f' && !ti.AppendOnly {
		return refuse("the table has REPLICA IDENTITY FULL, so its updates and deletes carry every column",
			"stream it whole (drop its columns list), or ALTER TABLE "+ti.Full()+" REPLICA IDENTITY DEFAULT with a primary key")
	}
	var ordered []string
	generated := map[string]bool{}
	for _, c := range cols {
		generated[c.name] = c.generated
		if slices.Contains(ti.ColumnList, c.name) {
			ordered = append(ordered, c.name)
		}
	}
	for _, c := range ti.ColumnList {
		gen, ok := generated[c]
		switch {
		case !ok:
			return refuse("column "+c+" does not exist", "fix tables[].columns")
		case gen:
			return refuse("column "+c+" is generated (pgoutput does not stream generated columns)", "drop "+c+" from tables[].columns")
		}
	}
	need := map[string]string{} // column → why it must be listed
	if !ti.AppendOnly || ti.Mode == PartitionByKey {
		for _, c := range ti.Key {
			need[c] = "key"
		}
	}
	if ti.Mode == PartitionByColumns {
		for _, c := range ti.Columns {
			need[c] = "partition_by"
		}
	}
	for _, c := range slices.Sorted(maps.Keys(need)) {
		if !slices.Contains(ordered, c) {
			return refuse(need[c]+" column "+c+" is not listed", "add "+c+" to tables[].columns")
		}
	}
	ti.ColumnList = ordered
	return nil
}

// unreadableColumns lists the columns of cols (of table oid) the role may not SELECT (one that does
// not exist is checkColumnList's to refuse).
func unreadableColumns(ctx context.Context, q queryer, oid uint32, cols []string) ([]string, error) {
	rows, err := q.Query(ctx, `SELECT attname FROM pg_catalog.pg_attribute WHERE attrelid = $1 AND attname = ANY($2)
		AND attnum > 0 AND NOT attisdropped AND NOT has_column_privilege($1, attnum, 'SELECT') ORDER BY attnum`, oid, cols)
	if err != nil {
		return nil, fmt.Errorf("read column privileges: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

func checkPartitionColumns(ti TableInfo, cols []column) error {
	if ti.Mode != PartitionByColumns {
		return nil
	}
	for _, c := range ti.Columns {
		if !slices.Contains(cols, column{name: c}) { // a generated column is not published
			return errcode.New(errcode.PartitionBy, "partition_by column "+c+" is not a column of "+ti.Full(), "fix tables[].partition_by")
		}
		if ti.Identity != 'f' && !ti.AppendOnly && !slices.Contains(ti.Key, c) {
			return errcode.New(errcode.PartitionBy, "partition_by column "+c+" of "+ti.Full()+
				" is not part of the key, so a delete could not name its partition",
				"partition by key columns only, or ALTER TABLE "+ti.Full()+" REPLICA IDENTITY FULL")
		}
	}
	return nil
}

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

// PublishFunction is the signature EnsurePublishFunction looks for.
const PublishFunction = "pgrelay.publish(text,text,jsonb)"

// txStarter is a pgx connection or pool: EnsurePublishFunction needs one transaction on one connection.
type txStarter interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// EnsurePublishFunction installs pgrelay.publish() (DESIGN §9) from resources/source_publish.sql, in
// one transaction, when no function of that signature exists. An existing one is left alone: the
// file says CREATE OR REPLACE, and a function someone else installed (or changed) is theirs. A
// transaction-scoped advisory lock serialises sources starting at once on one database, so the
// second sees the first's function instead of racing its CREATE SCHEMA. Without the privilege
// (SQLSTATE 42501: no CREATE on the database) it returns a publish_function error, which the caller
// logs as a warning and streams on; any other error is a start failure.
func EnsurePublishFunction(ctx context.Context, db txStarter) (installed bool, err error) {
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('pgrelay.publish'))`); err != nil {
			return fmt.Errorf("lock: %w", err)
		}
		var exists bool
		if err := tx.QueryRow(ctx, `SELECT to_regprocedure($1) IS NOT NULL`, PublishFunction).Scan(&exists); err != nil {
			return fmt.Errorf("look it up: %w", err)
		}
		if exists {
			return nil
		}
		if _, err := tx.Exec(ctx, resources.MustRead("source_publish.sql")); err != nil {
			return fmt.Errorf("run resources/source_publish.sql: %w", err)
		}
		installed = true
		return nil
	})
	if err == nil {
		return installed, nil
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42501" {
		return false, errcode.Wrap(errcode.PublishFunction, err, "not allowed to install "+PublishFunction,
			"run resources/source_publish.sql as a role with CREATE on the database, or set publish_function: false")
	}
	return false, fmt.Errorf("install %s: %w", PublishFunction, err)
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
