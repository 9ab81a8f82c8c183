package sink

import (
	"bytes"
	"context"
	"strings"

	"github.com/jackc/pgx/v5"
)

// copyJob is one COPY of rows with the same column set (append mode's fast path).
type copyJob struct {
	sql  string
	data []byte // COPY text format
}

// copyPlan turns append rows into COPY jobs, one per column set, when every column can travel as
// text (arrays and composites built from JSON, and identity ALWAYS columns, need INSERT).
func (a appendMode) copyPlan(ops []op) ([]copyJob, bool) {
	rows := make([]rowVals, len(ops))
	size := 0
	for i := range ops {
		rows[i] = ops[i].vals
		if len(rows[i].cols) == 0 {
			return nil, false
		}
		for _, v := range rows[i].vals {
			size += len(v.String) + 1
		}
	}
	groups := [][]rowVals{rows}
	for _, r := range rows {
		if r.sig != rows[0].sig {
			groups = groupBySig(rows)
			break
		}
	}
	jobs := make([]copyJob, 0, len(groups))
	for _, g := range groups {
		if len(g) == 0 {
			continue
		}
		names := make([]string, len(g[0].cols))
		for n, c := range g[0].cols {
			col := &a.w.t.Columns[c]
			if col.Kind == kindPopulate || col.IdentityAlways {
				return nil, false
			}
			names[n] = a.w.colName(c)
		}
		buf := bytes.NewBuffer(make([]byte, 0, size+size/16))
		for _, r := range g {
			for n, v := range r.vals {
				if n > 0 {
					buf.WriteByte('\t')
				}
				if !v.Valid {
					buf.WriteString(`\N`)
					continue
				}
				copyEscape(buf, v.String)
			}
			buf.WriteByte('\n')
		}
		jobs = append(jobs, copyJob{sql: "COPY " + a.w.t.Ident() + " (" + strings.Join(names, ", ") + ") FROM STDIN", data: buf.Bytes()})
	}
	return jobs, true
}

// copyEscape writes s in COPY text format: backslash, tab, newline and carriage return escaped.
func copyEscape(buf *bytes.Buffer, s string) {
	start := 0
	for i := 0; i < len(s); i++ {
		var esc string
		switch s[i] {
		case '\\':
			esc = `\\`
		case '\t':
			esc = `\t`
		case '\n':
			esc = `\n`
		case '\r':
			esc = `\r`
		default:
			continue
		}
		buf.WriteString(s[start:i])
		buf.WriteString(esc)
		start = i + 1
	}
	buf.WriteString(s[start:])
}

// runCopies sends the COPY jobs on the transaction's connection; with commit the last one is sent
// as "COPY ...; COMMIT", one query that commits the transaction if the COPY succeeds (when it
// fails, the rest of the query is skipped and the transaction is left aborted).
func runCopies(ctx context.Context, conn *pgx.Conn, jobs []copyJob, commit bool) error {
	for i, j := range jobs {
		sql := j.sql
		if commit && i == len(jobs)-1 {
			sql += "; COMMIT"
		}
		if _, err := conn.PgConn().CopyFrom(ctx, bytes.NewReader(j.data), sql); err != nil {
			return err
		}
	}
	return nil
}
