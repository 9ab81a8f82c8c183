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
	"github.com/pgrelay/pgrelay/resources"
)

// TableInfo is what the catalog says about a configured table.
type TableInfo struct {
	Table
	OID      uint32
	Identity byte     // relreplident: d default, f full, i index, n nothing
	Key      []string // key columns in key order: the identity index's, else the primary key's
}

// queryer is a pgx connection or pool.
type queryer interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// CheckServer refuses servers older than 14 or without wal_level=logical (failover slots need 17).
func CheckServer(ctx context.Context, q queryer, failover bool) (int, error) {
	var version int
	var walLevel string
	if err := q.QueryRow(ctx, `SELECT current_setting('server_version_num')::int, current_setting('wal_level')`).Scan(&version, &walLevel); err != nil {
		return 0, fmt.Errorf("read server settings: %w", err)
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

// LoadTables reads and checks every configured table before anything touches the publication:
// it exists, has a key (identity index, else primary key; not REPLICA IDENTITY NOTHING), and its
// partition_by columns exist and lie inside the identity unless it is REPLICA IDENTITY FULL.
func LoadTables(ctx context.Context, q queryer, tables []Table) ([]TableInfo, error) {
	out := make([]TableInfo, 0, len(tables))
	for i, t := range tables {
		ti, err := loadTable(ctx, q, t)
		if err != nil {
			return nil, fmt.Errorf("tables[%d] (%s): %w", i, t.Full(), err)
		}
		out = append(out, ti)
	}
	return out, nil
}

func loadTable(ctx context.Context, q queryer, t Table) (TableInfo, error) {
	ti := TableInfo{Table: t}
	var kind, ident string
	err := q.QueryRow(ctx, `SELECT c.oid, c.relreplident::text, c.relkind::text FROM pg_catalog.pg_class c
		JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2`,
		t.Schema, t.Name).Scan(&ti.OID, &ident, &kind)
	if errors.Is(err, pgx.ErrNoRows) {
		return ti, errcode.New(errcode.TableMissing, "table "+t.Full()+" does not exist", "create it, or fix tables[].table")
	}
	if err != nil {
		return ti, fmt.Errorf("read pg_class: %w", err)
	}
	ti.Identity = ident[0]
	if kind != "r" {
		return ti, errcode.New(errcode.TableMissing, t.Full()+" is not an ordinary table (relkind "+kind+")", "list ordinary tables only")
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
	if ti.Identity == 'n' || len(ti.Key) == 0 {
		return ti, errcode.New(errcode.ReplicaIdentity, t.Full()+" has no key pg_cdc can use (REPLICA IDENTITY NOTHING, or no primary key)",
			"add a primary key, or ALTER TABLE "+t.Full()+" REPLICA IDENTITY USING INDEX <unique index>")
	}
	return ti, checkPartitionColumns(ctx, q, ti)
}

func checkPartitionColumns(ctx context.Context, q queryer, ti TableInfo) error {
	if ti.Mode != PartitionByColumns {
		return nil
	}
	rows, err := q.Query(ctx, `SELECT attname FROM pg_catalog.pg_attribute WHERE attrelid = $1 AND attnum > 0
		AND NOT attisdropped AND attgenerated = ''`, ti.OID)
	if err != nil {
		return fmt.Errorf("read columns: %w", err)
	}
	cols, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("read columns: %w", err)
	}
	for _, c := range ti.Columns {
		if !slices.Contains(cols, c) {
			return errcode.New(errcode.PartitionBy, "partition_by column "+c+" is not a column of "+ti.Full(), "fix tables[].partition_by")
		}
		if ti.Identity != 'f' && !slices.Contains(ti.Key, c) {
			return errcode.New(errcode.PartitionBy, "partition_by column "+c+" of "+ti.Full()+
				" is not part of the key, so a delete could not name its partition",
				"partition by key columns only, or ALTER TABLE "+ti.Full()+" REPLICA IDENTITY FULL")
		}
	}
	return nil
}

// EnsurePublication creates or corrects a managed publication (exactly the tables, whole, every
// operation), or verifies an unmanaged one; row filters and column lists are refused.
func EnsurePublication(ctx context.Context, q queryer, name string, manage bool, tables []TableInfo, version int) error {
	want := make([]string, len(tables))
	for i, t := range tables {
		want[i] = pgx.Identifier{t.Schema, t.Name}.Sanitize()
	}
	var exists, allOps bool
	err := q.QueryRow(ctx, `SELECT true, pubinsert AND pubupdate AND pubdelete AND pubtruncate
		FROM pg_catalog.pg_publication WHERE pubname = $1`, name).Scan(&exists, &allOps)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("read pg_publication: %w", err)
	}
	pub := pgx.Identifier{name}.Sanitize()
	if !exists {
		if !manage {
			return errcode.New(errcode.Publication, "publication "+name+" does not exist", "create it FOR TABLE the configured tables, or set publication.manage: true")
		}
		_, err := q.Exec(ctx, "CREATE PUBLICATION "+pub+" FOR TABLE "+strings.Join(want, ", "))
		return publicationErr(err, name)
	}
	have, filtered, err := publicationTables(ctx, q, name, version)
	if err != nil {
		return err
	}
	sort.Strings(have)
	sorted := append([]string(nil), want...)
	sort.Strings(sorted)
	same := strings.Join(have, ",") == strings.Join(sorted, ",")
	if same && !filtered && allOps {
		return nil
	}
	if !manage {
		what := "does not publish exactly the configured tables"
		if filtered {
			what = "has a row filter or a column list"
		} else if !allOps {
			what = "does not publish insert, update, delete and truncate"
		}
		return errcode.New(errcode.Publication, "publication "+name+" "+what+" (a filtered stream could not be made complete)",
			"ALTER PUBLICATION "+name+" SET TABLE the configured tables, whole, or set publication.manage: true")
	}
	if _, err := q.Exec(ctx, "ALTER PUBLICATION "+pub+" SET TABLE "+strings.Join(want, ", ")); err != nil {
		return publicationErr(err, name)
	}
	_, err = q.Exec(ctx, "ALTER PUBLICATION "+pub+" SET (publish = 'insert, update, delete, truncate')")
	return publicationErr(err, name)
}

// publicationTables lists a publication's tables (quoted) and whether any has a filter or column list.
func publicationTables(ctx context.Context, q queryer, name string, version int) ([]string, bool, error) {
	filterExpr := "false"
	if version >= 150000 {
		filterExpr = "pr.prqual IS NOT NULL OR pr.prattrs IS NOT NULL"
	}
	rows, err := q.Query(ctx, `SELECT n.nspname, c.relname, `+filterExpr+` FROM pg_catalog.pg_publication_rel pr
		JOIN pg_catalog.pg_publication p ON p.oid = pr.prpubid
		JOIN pg_catalog.pg_class c ON c.oid = pr.prrelid JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		WHERE p.pubname = $1`, name)
	if err != nil {
		return nil, false, fmt.Errorf("read pg_publication_rel: %w", err)
	}
	defer rows.Close()
	var have []string
	filtered := false
	for rows.Next() {
		var s, t string
		var f bool
		if err := rows.Scan(&s, &t, &f); err != nil {
			return nil, false, err
		}
		have = append(have, pgx.Identifier{s, t}.Sanitize())
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
