package snapshot

import (
	"bytes"
	"context"
	"errors"
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
	// OlderThan, when not 0, also reads each row's xmin (not part of the row) and counts in
	// Chunk.Young the rows whose xmin does not precede it (see Chunk.Young).
	OlderThan uint32
}

// Chunk is one read of up to Limit rows after a cursor.
type Chunk struct {
	Columns  []Column
	Rows     Rows     // per row, per column: output-function text, nil = NULL
	LastKey  []string // key values (text) of the last row read; nil when the chunk is empty
	Limit    int      // the most rows the read asked for: a chunk with fewer is the table's last
	Snapshot Snapshot // pg_current_snapshot() of the reading transaction
	// Young counts the rows whose xmin (the transaction that last wrote the row) does not precede
	// Spec.OlderThan modulo 2^32, and XminRead says it was counted. Every unfrozen xmin lies within
	// 2^31 before the next xid, so a row written by a transaction at or after OlderThan is always
	// counted. The xmin column shows a frozen row's original xid, so a row frozen more than 2^31
	// xids ago may be counted too (only ever too many).
	Young    int
	XminRead bool
	ReadAt   time.Time
	Buffers  *Buffers // the memory Rows are in: give it to the next read once Rows is no longer used
}

// Buffers is the memory a chunk's rows are copied into (its Rows' blocks and offsets), most of
// what reading a chunk allocates. A read given the Buffers of an earlier chunk reuses that memory
// (that chunk's Rows must no longer be read) instead of allocating and zeroing it again.
type Buffers struct {
	rows Rows
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
	if s.OlderThan != 0 {
		cols = append(cols, "xmin")
	}
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

// Stmt is a statement a chunk's round trip runs besides the read, with text-format arguments.
type Stmt struct {
	SQL  string
	Args []string
}

// Read reads one chunk in a short REPEATABLE READ READ ONLY transaction on conn, recording the
// transaction's snapshot. conn must use the converter's session settings (DESIGN §2) so values
// print the same as pgoutput's.
func (s Spec) Read(ctx context.Context, conn *pgconn.PgConn, after []string, limit int) (*Chunk, error) {
	chunk, _, err := s.ReadBetween(ctx, conn, after, limit, nil, nil, nil, nil)
	return chunk, err
}

// ReadBetween reads one chunk as Read does, in a single round trip (pipeline mode): first the
// statements of low, then the read transaction (BEGIN, pg_current_snapshot(), the chunk query,
// COMMIT), then the statements of high, each of the three groups its own transaction, run by the
// server in that order. It returns the first value of each low, then each high statement's first
// row (nil where there is none): a snapshot's watermarks go before and after its read this way at
// the cost of one round trip instead of six. each, when not nil, is given every row as it arrives
// (its values are valid until the next row: copied into the chunk, they are the chunk's Rows), so
// the caller works on the rows while the server still sends the next ones; after an error the rows
// it was given are not a chunk. The rows are copied into buf (nil: new Buffers), which the chunk keeps as
// its Buffers.
func (s Spec) ReadBetween(ctx context.Context, conn *pgconn.PgConn, after []string, limit int, low, high []Stmt, each func(row [][]byte), buf *Buffers) (*Chunk, [][]byte, error) {
	query, args, err := s.Query(after, limit)
	if err != nil {
		return nil, nil, err
	}
	pl := conn.StartPipeline(ctx)
	send := func(sql string, args []string) {
		params := make([][]byte, len(args))
		for i, a := range args {
			params[i] = []byte(a)
		}
		pl.SendQueryParams(sql, params, nil, nil, nil)
	}
	for _, st := range low {
		send(st.SQL, st.Args)
	}
	pl.SendPipelineSync()
	send("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", nil)
	// The snapshot is taken by the first statement of the transaction: this one.
	send("SELECT pg_current_snapshot()::text", nil)
	queryArgs := make([]string, len(args))
	for i, a := range args {
		queryArgs[i] = a.(string)
	}
	send(query, queryArgs)
	send("COMMIT", nil)
	pl.SendPipelineSync()
	for _, st := range high {
		send(st.SQL, st.Args)
	}
	pl.SendPipelineSync()
	if err := pl.Flush(); err != nil {
		pl.Close()
		return nil, nil, fmt.Errorf("snapshot %s.%s: send chunk statements: %w", s.Schema, s.Name, err)
	}
	var snapText []byte
	if buf == nil {
		buf = &Buffers{}
	}
	buf.rows.reuse()
	chunk := &Chunk{Columns: s.Columns, Limit: limit, Buffers: buf, XminRead: s.OlderThan != 0}
	marks := make([][]byte, len(low)+len(high))
	first := func(dst *[]byte) func(*pgconn.ResultReader) {
		return func(rr *pgconn.ResultReader) {
			if rr.NextRow() {
				*dst = bytes.Clone(rr.Values()[0])
			}
		}
	}
	groups := [][]func(*pgconn.ResultReader){nil,
		{nil, first(&snapText), func(rr *pgconn.ResultReader) { s.readRows(rr, chunk, each) }, nil}, nil}
	for i := range low {
		groups[0] = append(groups[0], first(&marks[i]))
	}
	for i := range high {
		groups[2] = append(groups[2], first(&marks[len(low)+i]))
	}
	err = readPipeline(pl, groups)
	if cerr := pl.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		if !conn.IsClosed() && conn.TxStatus() != 'I' {
			conn.Exec(context.Background(), "ROLLBACK").Close()
		}
		return nil, nil, fmt.Errorf("snapshot %s.%s: read chunk: %w", s.Schema, s.Name, err)
	}
	chunk.ReadAt = time.Now().UTC()
	if chunk.Snapshot, err = ParseSnapshot(string(snapText)); err != nil {
		return nil, nil, err
	}
	if n := chunk.Rows.Len(); n > 0 {
		keyIdx := s.keyIndexes()
		chunk.LastKey = make([]string, len(keyIdx))
		for i, j := range keyIdx {
			chunk.LastKey[i] = string(chunk.Rows.Value(n-1, j))
		}
	}
	return chunk, marks, nil
}

// readPipeline reads the results of a pipeline sent as groups of statements, each group ended by a
// sync, handing each statement's result to its function (nil: discarded). It returns the first
// error; after an error the server skips the rest of that group, and a broken connection ends it.
func readPipeline(pl *pgconn.Pipeline, groups [][]func(*pgconn.ResultReader)) error {
	var first error
	for _, group := range groups {
		for i := 0; ; {
			res, err := pl.GetResults()
			if err != nil {
				if first == nil {
					first = err
				}
				if _, ok := errors.AsType[*pgconn.PgError](err); ok {
					continue // the next result is the group's sync
				}
				return first
			}
			rr, ok := res.(*pgconn.ResultReader)
			if !ok { // the sync (or nothing more)
				break
			}
			if i < len(group) && group[i] != nil && first == nil {
				group[i](rr)
			}
			if _, err := rr.Close(); err != nil && first == nil {
				first = err
			}
			i++
		}
	}
	return first
}

// readRows copies the rows of rr into chunk (its Buffers' Rows), handing each to each (when not
// nil).
func (s Spec) readRows(rr *pgconn.ResultReader, chunk *Chunk, each func([][]byte)) {
	n := len(s.Columns)
	rows := &chunk.Buffers.rows
	for rr.NextRow() {
		row := rr.Values()
		if s.OlderThan != 0 && len(row) > n {
			if x, ok := ParseXid(row[n]); !ok || (x >= FirstNormalXid && !Precedes(x, s.OlderThan)) {
				chunk.Young++
			}
			row = row[:n]
		}
		rows.Append(row)
		if each != nil {
			each(row)
		}
	}
	chunk.Rows = *rows
}

// FirstNormalXid is PostgreSQL's FirstNormalTransactionId: an xmin below it (1, bootstrap; 2,
// frozen by releases before 9.4) is older than any transaction.
const FirstNormalXid = 3

// Precedes reports whether xid a is older than xid b, both normal xids of the last 2^31 (the
// window PostgreSQL keeps unfrozen xids in), compared modulo 2^32 as PostgreSQL does.
func Precedes(a, b uint32) bool { return int32(a-b) < 0 }

// parseXid reads an xid as PostgreSQL prints it (decimal).
func ParseXid(b []byte) (uint32, bool) {
	if len(b) == 0 || len(b) > 10 {
		return 0, false
	}
	var v uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + uint64(c-'0')
	}
	return uint32(v), v <= 1<<32-1
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
