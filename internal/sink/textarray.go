package sink

import (
	"encoding/binary"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// textArray is a column of a batch as a text[] parameter. It has its own binary encoder because
// pgx's generic array path boxes every element in an interface (an allocation per value), which
// was the largest cost of the sink's Go side in BenchmarkUpsert.
type textArray []pgtype.Text

// textArrayCodec is the text[] codec of the sink's connections: textArray values are encoded
// directly; everything else goes to pgx's own codec.
type textArrayCodec struct{ pgtype.Codec }

func (c textArrayCodec) PlanEncode(m *pgtype.Map, oid uint32, format int16, value any) pgtype.EncodePlan {
	if _, ok := value.(textArray); ok && format == pgtype.BinaryFormatCode {
		return textArrayPlan{}
	}
	return c.Codec.PlanEncode(m, oid, format, value)
}

type textArrayPlan struct{}

// Encode writes the binary array format: dimensions, null flag, element type, length, lower bound,
// then each element's length (-1 for NULL) and bytes.
func (textArrayPlan) Encode(value any, buf []byte) ([]byte, error) {
	arr := value.(textArray)
	hasNull := int32(0)
	for _, v := range arr {
		if !v.Valid {
			hasNull = 1
			break
		}
	}
	buf = binary.BigEndian.AppendUint32(buf, 1)
	buf = binary.BigEndian.AppendUint32(buf, uint32(hasNull))
	buf = binary.BigEndian.AppendUint32(buf, pgtype.TextOID)
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(arr)))
	buf = binary.BigEndian.AppendUint32(buf, 1)
	for _, v := range arr {
		if !v.Valid {
			buf = binary.BigEndian.AppendUint32(buf, 0xffffffff)
			continue
		}
		buf = binary.BigEndian.AppendUint32(buf, uint32(len(v.String)))
		buf = append(buf, v.String...)
	}
	return buf, nil
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
