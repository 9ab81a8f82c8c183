package sink

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"math"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// copyJob is one COPY of rows with the same column set (append mode's fast path).
type copyJob struct {
	sql  string
	data []byte // COPY text or binary format
}

// COPY of append mode travels in PostgreSQL's binary format when every column of the row set has a
// binary encoder (binFieldFor) and every value is in the canonical form that encoder converts
// exactly; otherwise in the text format, where PostgreSQL's input functions convert each value.
// Binary spares the server the text parsing of each line and value (its input functions for
// integers and floats), and the sink the escaping of every byte. The two formats accept and store
// the same values: a value an encoder is unsure of (whitespace, "+1", "1e400", "NaN", "t") sends
// its batch as text, so PostgreSQL decides as it always did.

// binField appends value s of one column in COPY binary format (int32 length, then the type's
// binary representation); ok is false when s is not in the encoder's canonical form.
type binField func(dst []byte, s string) (out []byte, ok bool)

// binFieldFor is the binary encoder of the base type oid, or nil (the column travels as text).
func binFieldFor(oid uint32) binField {
	switch oid {
	case pgtype.Int2OID:
		return binInt(16)
	case pgtype.Int4OID:
		return binInt(32)
	case pgtype.Int8OID:
		return binInt(64)
	case pgtype.Float8OID:
		return binFloat8
	case pgtype.BoolOID:
		return binBool
	case pgtype.UUIDOID:
		return binUUID
	case pgtype.TextOID, pgtype.VarcharOID, pgtype.BPCharOID, pgtype.JSONOID:
		return binText // the receive functions take the text itself (and apply the column's typmod)
	case pgtype.JSONBOID:
		return binJSONB
	}
	return nil
}

// binInt encodes a decimal integer of the given width: an optional '-' and digits, in range.
func binInt(bits int) binField {
	size := bits / 8
	return func(dst []byte, s string) ([]byte, bool) {
		if s == "" || s[0] == '+' {
			return dst, false
		}
		n, err := strconv.ParseInt(s, 10, bits)
		if err != nil {
			return dst, false
		}
		dst = binary.BigEndian.AppendUint32(dst, uint32(size))
		switch size {
		case 2:
			return binary.BigEndian.AppendUint16(dst, uint16(n)), true
		case 4:
			return binary.BigEndian.AppendUint32(dst, uint32(n)), true
		}
		return binary.BigEndian.AppendUint64(dst, uint64(n)), true
	}
}

// binFloat8 encodes a JSON number (-?digits[.digits][e[+-]digits]) as float8. strconv and
// PostgreSQL's float8in both round correctly, so they agree on every such number; one float8in
// refuses (out of range, or nonzero digits that underflow to zero) is left to it.
func binFloat8(dst []byte, s string) ([]byte, bool) {
	nonzero, ok := jsonNumber(s)
	if !ok {
		return dst, false
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsInf(f, 0) || (f == 0 && nonzero) {
		return dst, false
	}
	dst = binary.BigEndian.AppendUint32(dst, 8)
	return binary.BigEndian.AppendUint64(dst, math.Float64bits(f)), true
}

// jsonNumber reports whether s is a number in JSON's grammar and whether a digit of its mantissa is
// not zero.
func jsonNumber(s string) (nonzero, ok bool) {
	i := 0
	if i < len(s) && s[i] == '-' {
		i++
	}
	digits := func() int {
		start := i
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			nonzero = nonzero || s[i] != '0'
			i++
		}
		return i - start
	}
	if n := digits(); n == 0 || (n > 1 && s[i-n] == '0') {
		return false, false
	}
	if i < len(s) && s[i] == '.' {
		i++
		if digits() == 0 {
			return false, false
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		start := i
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		if i == start {
			return false, false
		}
	}
	return nonzero, i == len(s)
}

// binBool encodes the JSON literals true and false.
func binBool(dst []byte, s string) ([]byte, bool) {
	var b byte
	switch s {
	case "true":
		b = 1
	case "false":
	default:
		return dst, false
	}
	return append(binary.BigEndian.AppendUint32(dst, 1), b), true
}

// binUUID encodes the canonical form xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx (either case).
func binUUID(dst []byte, s string) ([]byte, bool) {
	if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return dst, false
	}
	dst = binary.BigEndian.AppendUint32(dst, 16)
	for _, part := range [...]string{s[0:8], s[9:13], s[14:18], s[19:23], s[24:36]} {
		var err error
		if dst, err = hex.AppendDecode(dst, []byte(part)); err != nil {
			return dst, false
		}
	}
	return dst, true
}

func binText(dst []byte, s string) ([]byte, bool) {
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(s)))
	return append(dst, s...), true
}

// binJSONB is the jsonb binary format: version 1, then the JSON text.
func binJSONB(dst []byte, s string) ([]byte, bool) {
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(s)+1))
	return append(append(dst, 1), s...), true
}

// copyBinaryHeader starts COPY binary data: signature, flags, header extension length.
var copyBinaryHeader = []byte("PGCOPY\n\377\r\n\000\000\000\000\000\000\000\000\000")

// copyBinaryTrailer ends COPY binary data (a field count of -1).
var copyBinaryTrailer = []byte{0xff, 0xff}

// copyable reports whether rows with the column set cols can be written by COPY (arrays and
// composites built from JSON, and identity ALWAYS columns, need INSERT) and whether every column
// has a binary encoder.
func (w *writer) copyable(cols []int) (ok, binary bool) {
	if len(cols) == 0 {
		return false, false
	}
	binary = true
	for _, i := range cols {
		col := &w.t.Columns[i]
		if col.Kind == kindPopulate || col.IdentityAlways {
			return false, false
		}
		binary = binary && w.bin[i] != nil
	}
	return true, binary
}

// copySQL is the COPY statement of a column set, built once per set and format.
func (w *writer) copySQL(r rowVals, binary bool) string {
	id := "c:" + r.sig
	if binary {
		id = "b:" + r.sig
	}
	return w.cached(id, func() string {
		names := make([]string, len(r.cols))
		for n, c := range r.cols {
			names[n] = w.colName(c)
		}
		sql := "COPY " + w.t.Ident() + " (" + strings.Join(names, ", ") + ") FROM STDIN"
		if binary {
			sql += " (FORMAT binary)"
		}
		return sql
	})
}

// appendBinaryRow appends r as one COPY binary tuple; ok is false when a value is not canonical.
func (w *writer) appendBinaryRow(dst []byte, r rowVals) ([]byte, bool) {
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(r.cols)))
	for n, v := range r.vals {
		if !v.Valid {
			dst = binary.BigEndian.AppendUint32(dst, math.MaxUint32) // -1: NULL
			continue
		}
		var ok bool
		if dst, ok = w.bin[r.cols[n]](dst, v.String); !ok {
			return dst, false
		}
	}
	return dst, true
}

// appendTextRow appends r as one line of COPY text format.
func appendTextRow(buf *bytes.Buffer, r rowVals) {
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

// copyPlan turns append rows into COPY jobs, one per column set, when every column can travel by
// COPY.
func (a appendMode) copyPlan(ops []op) ([]copyJob, bool) {
	rows := make([]rowVals, len(ops))
	size := 0
	for i := range ops {
		rows[i] = ops[i].vals
		for _, v := range rows[i].vals {
			size += len(v.String) + 4
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
		ok, bin := a.w.copyable(g[0].cols)
		if !ok {
			return nil, false
		}
		if bin {
			data := append(make([]byte, 0, size+len(g)*(2+4*len(g[0].cols))+32), copyBinaryHeader...)
			for _, r := range g {
				if data, bin = a.w.appendBinaryRow(data, r); !bin {
					break
				}
			}
			if bin {
				jobs = append(jobs, copyJob{sql: a.w.copySQL(g[0], true), data: append(data, copyBinaryTrailer...)})
				continue
			}
		}
		buf := bytes.NewBuffer(make([]byte, 0, size+size/16))
		for _, r := range g {
			appendTextRow(buf, r)
		}
		jobs = append(jobs, copyJob{sql: a.w.copySQL(g[0], false), data: buf.Bytes()})
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
