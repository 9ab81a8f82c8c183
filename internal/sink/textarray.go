package sink

import (
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// textArray is a column of a batch as a text[] parameter. It has its own binary encoder because
// pgx's generic array path boxes every element in an interface (an allocation per value), which
// was the largest cost of the sink's Go side in BenchmarkUpsert.
type textArray []pgtype.Text

// rowsColumn is column n of rows as a text[] parameter, encoded straight from the rows (no copy of
// the column is built).
type rowsColumn struct {
	rows []rowVals
	n    int
}

// encodedSize is the size of every column of c.rows as text[] parameters. pgx encodes a statement's
// parameters one after another into one buffer that starts small for every statement; growing it
// once, at the first column, replaces a series of doublings (and their copies) per batch.
func (c rowsColumn) encodedSize() int {
	if len(c.rows) == 0 {
		return 0
	}
	cols := len(c.rows[0].vals)
	size := 20*cols + 4*cols*len(c.rows)
	for _, r := range c.rows {
		for _, v := range r.vals {
			size += len(v.String)
		}
	}
	return size
}

// textArrayCodec is the text[] codec of the sink's connections: textArray and rowsColumn values are
// encoded directly; everything else goes to pgx's own codec.
type textArrayCodec struct{ pgtype.Codec }

func (c textArrayCodec) PlanEncode(m *pgtype.Map, oid uint32, format int16, value any) pgtype.EncodePlan {
	switch value.(type) {
	case textArray, rowsColumn:
		if format == pgtype.BinaryFormatCode {
			return textArrayPlan{}
		}
	}
	return c.Codec.PlanEncode(m, oid, format, value)
}

type textArrayPlan struct{}

func (textArrayPlan) Encode(value any, buf []byte) ([]byte, error) {
	switch v := value.(type) {
	case textArray:
		return appendTextArray(buf, len(v), func(i int) pgtype.Text { return v[i] }), nil
	case rowsColumn:
		if v.n == 0 {
			buf = slices.Grow(buf, v.encodedSize())
		}
		return appendTextArray(buf, len(v.rows), func(i int) pgtype.Text { return v.rows[i].vals[v.n] }), nil
	}
	return nil, fmt.Errorf("text[] encoder: unexpected %T", value)
}

// appendTextArray writes the binary array format of n texts: dimensions, null flag, element type,
// length, lower bound, then each element's length (-1 for NULL) and bytes.
func appendTextArray(buf []byte, n int, at func(int) pgtype.Text) []byte {
	hasNull := uint32(0)
	for i := 0; i < n; i++ {
		if !at(i).Valid {
			hasNull = 1
			break
		}
	}
	buf = binary.BigEndian.AppendUint32(buf, 1)
	buf = binary.BigEndian.AppendUint32(buf, hasNull)
	buf = binary.BigEndian.AppendUint32(buf, pgtype.TextOID)
	buf = binary.BigEndian.AppendUint32(buf, uint32(n))
	buf = binary.BigEndian.AppendUint32(buf, 1)
	for i := 0; i < n; i++ {
		v := at(i)
		if !v.Valid {
			buf = binary.BigEndian.AppendUint32(buf, 0xffffffff)
			continue
		}
		buf = binary.BigEndian.AppendUint32(buf, uint32(len(v.String)))
		buf = append(buf, v.String...)
	}
	return buf
}

// useTextArrayCodec installs textArrayCodec on conn once.
func useTextArrayCodec(conn *pgx.Conn) {
	m := conn.TypeMap()
	t, ok := m.TypeForOID(pgtype.TextArrayOID)
	if !ok {
		return
	}
	if _, done := t.Codec.(textArrayCodec); done {
		return
	}
	m.RegisterType(&pgtype.Type{Name: t.Name, OID: t.OID, Codec: textArrayCodec{t.Codec}})
}
