package source

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
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

// PartitionsWithoutIdentity lists, for a partitioned table whose updates and deletes are published
// (not append-only), its partitions with no replica identity (REPLICA IDENTITY NOTHING, or the
// default without a primary key): PostgreSQL refuses their UPDATEs and DELETEs while the table is
// published, and the partitioned table's own key does not change that. Each is a coded warning
// naming the fix; the table still streams.
func PartitionsWithoutIdentity(ctx context.Context, q queryer, t TableInfo) ([]error, error) {
	if !t.Partitioned || t.AppendOnly {
		return nil, nil
	}
	rows, err := q.Query(ctx, `SELECT n.nspname, c.relname, c.relreplident = 'n'
		FROM pg_catalog.pg_partition_tree($1::oid::regclass) p JOIN pg_catalog.pg_class c ON c.oid = p.relid
		JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		WHERE p.isleaf AND (c.relreplident = 'n' OR c.relreplident = 'd'
			AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_index i WHERE i.indrelid = c.oid AND i.indisprimary))
		ORDER BY 1, 2`, t.OID)
	if err != nil {
		return nil, fmt.Errorf("read the partitions of %s: %w", t.Full(), err)
	}
	defer rows.Close()
	var out []error
	for rows.Next() {
		var schema, table string
		var nothing bool
		if err := rows.Scan(&schema, &table, &nothing); err != nil {
			return nil, fmt.Errorf("read the partitions of %s: %w", t.Full(), err)
		}
		why := "no primary key"
		if nothing {
			why = "REPLICA IDENTITY NOTHING"
		}
		name := Table{Schema: schema, Name: table}.Full()
		out = append(out, errcode.New(errcode.ReplicaIdentity,
			fmt.Sprintf("partition %s of %s has no replica identity (%s): while %s is published, PostgreSQL refuses the partition's UPDATEs and DELETEs", name, t.Full(), why, t.Full()),
			"ALTER TABLE "+pgx.Identifier{schema, table}.Sanitize()+" REPLICA IDENTITY FULL, or give it the partitioned table's key"))
	}
	return out, rows.Err()
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

// ExpandTables replaces each pattern entry (`schema.prefix_*`, `tenant_*.orders`) with the tables
// it matches now, in schema and name order, each with the entry's options: the ordinary and
// partitioned tables of the schemas it names (a pattern in the schema never matching a system
// schema, systemSchema) that no entry by name and no earlier pattern names. A partition is never matched (its
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
		like := strings.NewReplacer(`\`, `\\`, "%", `\%`, "_", `\_`, "*", "%")
		rows, err := q.Query(ctx, `SELECT n.nspname, c.relname FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
			WHERE n.nspname::text LIKE $1 AND c.relkind IN ('r', 'p') AND c.relpersistence = 'p' AND NOT c.relispartition AND c.relname::text LIKE $2
			ORDER BY n.nspname::text COLLATE "C", c.relname::text COLLATE "C"`, like.Replace(t.Schema), like.Replace(t.Name))
		if err != nil {
			return nil, fmt.Errorf("match %s: %w", t.Full(), err)
		}
		found, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct{ Schema, Name string }])
		if err != nil {
			return nil, fmt.Errorf("match %s: %w", t.Full(), err)
		}
		for _, f := range found {
			m := t
			m.Schema, m.Name, m.From, m.Exclude = f.Schema, f.Name, t.Full(), nil
			if named[m.Full()] || t.excludes(m.Full()) || !t.matchesSchema(f.Schema) {
				continue
			}
			named[m.Full()] = true
			out = append(out, m)
		}
	}
	switch {
	case len(out) == 0:
		return nil, errcode.New(errcode.TablePattern, "no table matches "+strings.Join(patterns, ", "),
			"create a table the pattern names, or correct the pattern (a * stands for any characters, in the schema's name too; names are case-sensitive)")
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

// tableName is the current schema.name of the table with oid, as tables[].table writes it (no
// quotes), or "" when no such table exists.
func tableName(ctx context.Context, q queryer, oid uint32) (string, error) {
	schema, name, err := relationName(ctx, q, oid)
	if err != nil || name == "" {
		return "", err
	}
	return Table{Schema: schema, Name: name}.Full(), nil
}

// relationName is the current schema and name of the table with oid ("" when no such table
// exists): a configured table renamed since the session read it is found by its oid.
func relationName(ctx context.Context, q queryer, oid uint32) (schema, name string, err error) {
	err = q.QueryRow(ctx, `SELECT n.nspname, c.relname FROM pg_catalog.pg_class c
		JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = $1`, oid).Scan(&schema, &name)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", "", nil
	}
	return schema, name, err
}

// renamedAway reports whether err is PostgreSQL's undefined_table: a statement naming a
// configured table failed because it was renamed (or moved to another schema, or dropped) since the
// name was read. relationName then tells which.
func renamedAway(err error) bool {
	pgErr, ok := errors.AsType[*pgconn.PgError](err)
	return ok && pgErr.Code == "42P01"
}

// tableColumns reads table oid's columns in table order (dropped ones left out).
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
