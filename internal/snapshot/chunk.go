package snapshot

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Column is one published column of the table being read.
type Column struct {
	Name    string
	TypeOID uint32
	SQLType string // format_type(atttypid, atttypmod), e.g. "character(10)", used to cast cursor values
}

// Spec describes how to read one table in key order.
type Spec struct {
	Schema, Name string
	Columns      []Column // every published, non-generated column, in table order
	Key          []string // key columns, in key order (primary key or replica identity index)
}

// Chunk is one read of up to Limit rows after a cursor.
type Chunk struct {
	Columns  []Column
	Rows     [][][]byte // per row, per column: output-function text, nil = NULL
	LastKey  []string   // key values (text) of the last row read; nil when the chunk is empty
	Snapshot Snapshot   // pg_current_snapshot() of the reading transaction
	ReadAt   time.Time
}

// Query builds the chunk statement: the columns as text, rows after the cursor in key order.
// With no cursor (after == nil) it starts at the beginning of the table.
func (s Spec) Query(after []string, limit int) (string, []any, error) {
	if len(s.Key) == 0 {
		return "", nil, fmt.Errorf("table %s.%s: no key to read it in order", s.Schema, s.Name)
	}
	if after != nil && len(after) != len(s.Key) {
		return "", nil, fmt.Errorf("table %s.%s: cursor has %d key values, the key has %d columns", s.Schema, s.Name, len(after), len(s.Key))
	}
	types := map[string]string{}
	cols := make([]string, len(s.Columns))
	for i, c := range s.Columns {
		cols[i] = pgx.Identifier{c.Name}.Sanitize()
		types[c.Name] = c.SQLType
	}
	keys := make([]string, len(s.Key))
	for i, k := range s.Key {
		keys[i] = pgx.Identifier{k}.Sanitize()
		if types[k] == "" {
			return "", nil, fmt.Errorf("table %s.%s: key column %q is not among the columns read", s.Schema, s.Name, k)
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "SELECT %s FROM %s", strings.Join(cols, ", "), pgx.Identifier{s.Schema, s.Name}.Sanitize())
	var args []any
	if after != nil {
		params := make([]string, len(s.Key))
		for i, k := range s.Key {
			// The cursor holds output text; casting it with the column's full type (typmod included,
			// so bpchar keeps its padding) makes the comparison use the column's own ordering.
			params[i] = fmt.Sprintf("$%d::%s", i+1, types[k])
			args = append(args, after[i])
		}
		fmt.Fprintf(&b, " WHERE (%s) > (%s)", strings.Join(keys, ", "), strings.Join(params, ", "))
	}
	fmt.Fprintf(&b, " ORDER BY %s LIMIT %d", strings.Join(keys, ", "), limit)
	return b.String(), args, nil
}

// Read reads one chunk in a short REPEATABLE READ READ ONLY transaction on conn, recording the
// transaction's snapshot. conn must use the converter's session settings (DESIGN §2) so values
// print the same as pgoutput's.
func (s Spec) Read(ctx context.Context, conn *pgconn.PgConn, after []string, limit int) (*Chunk, error) {
	query, args, err := s.Query(after, limit)
	if err != nil {
		return nil, err
	}
	if err := conn.Exec(ctx, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY").Close(); err != nil {
		return nil, fmt.Errorf("snapshot %s.%s: begin: %w", s.Schema, s.Name, err)
	}
	chunk, err := s.readIn(ctx, conn, query, args)
	if err != nil {
		conn.Exec(context.Background(), "ROLLBACK").Close()
		return nil, err
	}
	if err := conn.Exec(ctx, "COMMIT").Close(); err != nil {
		return nil, fmt.Errorf("snapshot %s.%s: commit: %w", s.Schema, s.Name, err)
	}
	return chunk, nil
}

func (s Spec) readIn(ctx context.Context, conn *pgconn.PgConn, query string, args []any) (*Chunk, error) {
	// The snapshot is taken by the first statement of the transaction: this one.
	res := conn.ExecParams(ctx, "SELECT pg_current_snapshot()::text, clock_timestamp()", nil, nil, nil, nil).Read()
	if res.Err != nil {
		return nil, fmt.Errorf("snapshot %s.%s: pg_current_snapshot: %w", s.Schema, s.Name, res.Err)
	}
	snap, err := ParseSnapshot(string(res.Rows[0][0]))
	if err != nil {
		return nil, err
	}
	chunk := &Chunk{Columns: s.Columns, Snapshot: snap, ReadAt: time.Now().UTC()}
	params := make([][]byte, len(args))
	for i, a := range args {
		params[i] = []byte(a.(string))
	}
	// Text format in and out: values arrive exactly as the type's output function prints them.
	rr := conn.ExecParams(ctx, query, params, nil, nil, nil)
	keyIdx := s.keyIndexes()
	for rr.NextRow() {
		vals := rr.Values()
		row := make([][]byte, len(vals))
		for i, v := range vals {
			row[i] = bytes.Clone(v) // nil (NULL) stays nil, an empty value stays empty
		}
		chunk.Rows = append(chunk.Rows, row)
	}
	if _, err := rr.Close(); err != nil {
		return nil, fmt.Errorf("snapshot %s.%s: read chunk: %w", s.Schema, s.Name, err)
	}
	if n := len(chunk.Rows); n > 0 {
		last := chunk.Rows[n-1]
		chunk.LastKey = make([]string, len(keyIdx))
		for i, j := range keyIdx {
			chunk.LastKey[i] = string(last[j])
		}
	}
	return chunk, nil
}

// keyIndexes are the positions of the key columns among Columns.
func (s Spec) keyIndexes() []int {
	out := make([]int, len(s.Key))
	for i, k := range s.Key {
		for j, c := range s.Columns {
			if c.Name == k {
				out[i] = j
			}
		}
	}
	return out
}
