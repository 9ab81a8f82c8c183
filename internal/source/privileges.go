package source

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pgrelay/pgrelay/internal/errcode"
)

// The privileges pg_cdc needs beyond LOGIN and CONNECT (which pgconnect.Explain names when a
// connection is refused): the REPLICATION attribute, which only the server can judge (managed
// services grant it through a role such as rds_replication, not the attribute), so a refused
// replication connection is explained when it happens; SELECT on every configured table and USAGE
// on its schema, checked with the table (loadTable: a table without them is refused); and EXECUTE
// on the functions below, which PUBLIC has by default but an administrator may revoke.

// sourceFunctions are the functions pg_cdc calls, by exact signature; one a server does not have
// (an older version's) is skipped.
var sourceFunctions = []string{
	"pg_catalog.pg_logical_emit_message(boolean,text,text)",                            // heartbeat, snapshot watermarks
	"pg_catalog.pg_logical_emit_message(boolean,text,text,boolean)",                    // watermarks with flush (17+)
	"pg_catalog.pg_create_logical_replication_slot(name,name,boolean,boolean)",         // the slot (14-16)
	"pg_catalog.pg_create_logical_replication_slot(name,name,boolean,boolean,boolean)", // the slot (17+)
	"pg_catalog.pg_drop_replication_slot(name)",                                        // resync
	"pg_catalog.pg_terminate_backend(integer,bigint)",                                  // resync: the slot's own walsender
	"pg_catalog.pg_current_wal_lsn()",                                                  // slot lag
	"pg_catalog.pg_current_snapshot()",                                                 // snapshot chunks, read-back
	"pg_catalog.pg_snapshot_xip(pg_snapshot)",
	"pg_catalog.pg_snapshot_xmax(pg_snapshot)",
	"pg_catalog.pg_xact_status(xid8)",
	"pg_catalog.pg_current_xact_id()",
}

// CheckFunctions returns a source_privileges error naming the GRANT when the role may not execute
// one of the functions pg_cdc calls.
func CheckFunctions(ctx context.Context, q queryer) error {
	var role string
	var denied []string
	err := q.QueryRow(ctx, `SELECT current_user, coalesce(array_agg(f ORDER BY n) FILTER (WHERE to_regprocedure(f) IS NOT NULL
		AND NOT has_function_privilege(to_regprocedure(f), 'EXECUTE')), '{}') FROM unnest($1::text[]) WITH ORDINALITY u(f, n)`,
		sourceFunctions).Scan(&role, &denied)
	if err != nil {
		return fmt.Errorf("check function privileges: %w", err)
	}
	if len(denied) == 0 {
		return nil
	}
	return errcode.New(errcode.SourcePrivileges, "role "+role+" may not execute "+strings.Join(denied, ", "),
		"GRANT EXECUTE ON FUNCTION "+strings.Join(denied, ", ")+" TO "+pgx.Identifier{role}.Sanitize())
}

// tablePrivileges refuses a table whose schema or rows (with a columns list: its listed columns,
// unreadable those it may not read) the role may not read (the snapshot, a resync and the
// read-back of unchanged values read them); the fix grants what is missing.
func tablePrivileges(t Table, role string, usage, sel bool, unreadable []string) error {
	if usage && sel {
		return nil
	}
	r, table := pgx.Identifier{role}.Sanitize(), pgx.Identifier{t.Schema, t.Name}.Sanitize()
	var what, grants []string
	if !usage {
		what = append(what, "use schema "+t.Schema)
		grants = append(grants, "GRANT USAGE ON SCHEMA "+pgx.Identifier{t.Schema}.Sanitize()+" TO "+r)
	}
	switch {
	case !sel && len(t.ColumnList) > 0: // SELECT on the listed columns is enough
		cols := make([]string, len(unreadable))
		for i, c := range unreadable {
			cols[i] = pgx.Identifier{c}.Sanitize()
		}
		what = append(what, "read column(s) "+strings.Join(unreadable, ", ")+" of "+t.Full())
		grants = append(grants, "GRANT SELECT ("+strings.Join(cols, ", ")+") ON "+table+" TO "+r)
	case !sel:
		what = append(what, "read "+t.Full())
		grants = append(grants, "GRANT SELECT ON "+table+" TO "+r)
	}
	return errcode.New(errcode.SourcePrivileges, "role "+role+" may not "+strings.Join(what, " or ")+
		" (the snapshot and the read-back of unchanged values read the table)", strings.Join(grants, "; "))
}
