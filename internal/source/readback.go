package source

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgrelay/pgrelay/internal/event"
)

// readback reads the current values of cols of the row whose key is in row (nil when gone).
//
// PostgreSQL flushes a commit record, so the walsender can decode it, before the committing backend
// leaves the proc array (a synchronous standby can hold it there for long): until then other sessions
// do not see the transaction's rows. So a row not found is only trusted once transaction xid is no
// longer in progress; readback waits for that and reads again.
func readback(ctx context.Context, pool *pgxpool.Pool, rel *relation, row event.Row, cols []int, xid uint32) (event.Row, error) {
	t := rel.table
	var sel, where []string
	var params [][]byte
	for _, c := range cols {
		sel = append(sel, pgx.Identifier{t.Columns[c].Name}.Sanitize())
	}
	for i, k := range t.Key {
		where = append(where, fmt.Sprintf("%s = $%d", pgx.Identifier{t.Columns[k].Name}.Sanitize(), i+1))
		params = append(params, row[k].Data)
	}
	selectFrom := func(schema, name string) string {
		return "SELECT " + strings.Join(sel, ", ") + " FROM " + pgx.Identifier{schema, name}.Sanitize() + " WHERE " + strings.Join(where, " AND ")
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("read back unchanged values: %w", err)
	}
	defer conn.Release()
	sql := selectFrom(rel.info.Schema, rel.info.Name) // a configured table's: the decoder builds no other's events
	res := conn.Conn().PgConn().ExecParams(ctx, sql, params, nil, nil, nil).Read()
	if renamedAway(res.Err) && rel.info.OID != 0 {
		// renamed since: the configured table by its oid, under its name of now
		if schema, name, err := relationName(ctx, conn, rel.info.OID); err == nil && name != "" {
			sql = selectFrom(schema, name)
			res = conn.Conn().PgConn().ExecParams(ctx, sql, params, nil, nil, nil).Read()
		}
	}
	if res.Err == nil && len(res.Rows) == 0 {
		if err := waitVisible(ctx, conn.Conn().PgConn(), xid); err != nil {
			return nil, fmt.Errorf("read back unchanged values of %s: %w", t.Name, err)
		}
		res = conn.Conn().PgConn().ExecParams(ctx, sql, params, nil, nil, nil).Read()
	}
	if res.Err != nil {
		return nil, fmt.Errorf("read back unchanged values of %s: %w", t.Name, res.Err)
	}
	if len(res.Rows) == 0 {
		return nil, nil
	}
	return event.TextRow(nil, res.Rows[0]), nil
}

// xactStatusSQL is the status of a 32-bit xid widened to the full xid nearest to the current
// snapshot's xmax (as snapshot.Widen does: a decoded transaction is never 2^31 xids away from it,
// and one whose commit a synchronous standby holds can be above it), read without assigning an xid
// to the reading connection.
const xactStatusSQL = `SELECT pg_xact_status((CASE WHEN w - m > 2147483648 THEN w - 4294967296
	WHEN m - w > 2147483648 THEN w + 4294967296 ELSE w END)::text::xid8)
FROM (SELECT m, ((m >> 32) << 32) + $1::bigint AS w
      FROM (SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS m) s) x`

// waitVisible waits until transaction xid is no longer in progress, so its rows are visible.
func waitVisible(ctx context.Context, conn *pgconn.PgConn, xid uint32) error {
	param := [][]byte{[]byte(strconv.FormatUint(uint64(xid), 10))}
	for wait := time.Millisecond; ; wait = min(2*wait, 100*time.Millisecond) {
		res := conn.ExecParams(ctx, xactStatusSQL, param, nil, nil, nil).Read()
		if res.Err != nil {
			return fmt.Errorf("status of transaction %d: %w", xid, res.Err)
		}
		if len(res.Rows) == 1 && string(res.Rows[0][0]) != "in progress" {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
}
