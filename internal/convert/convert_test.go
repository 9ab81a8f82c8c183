package convert

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgrelay/pgrelay/internal/testenv"
)

// cases are SQL expressions with the JSON PostgreSQL's text output must become. Each is also
// checked as the element of a one-dimensional array next to a NULL.
var cases = []struct {
	expr, want string
}{
	{`true`, `true`},
	{`false`, `false`},
	{`'\xdeadbeef'::bytea`, `"\\xdeadbeef"`},
	{`'a'::"char"`, `"a"`},
	{`'name'::name`, `"name"`},
	{`9223372036854775807::int8`, `9223372036854775807`},
	{`9007199254740993::int8`, `9007199254740993`},
	{`(-9007199254740993)::int8`, `-9007199254740993`},
	{`(-32768)::int2`, `-32768`},
	{`2147483647::int4`, `2147483647`},
	{`'1 2'::int2vector`, `"1 2"`},
	{`'now'::regproc`, `"now"`},
	{`E'tab\there "q" \\ back\nnl'::text`, `"tab\there \"q\" \\ back\nnl"`},
	{`'é€😀'::text`, `"é€😀"`},
	{`4294967295::oid`, `4294967295`},
	{`'(0,1)'::tid`, `"(0,1)"`},
	{`'42'::xid`, `"42"`},
	{`'1 2'::oidvector`, `"1 2"`},
	{`'{"a": [1, 2.50, {"b": null}], "n": 123456789012345678901234567890}'::json`, `{"a": [1, 2.50, {"b": null}], "n": 123456789012345678901234567890}`},
	{`'{"a": [1, 2.50, {"b": null}], "n": 123456789012345678901234567890}'::jsonb`, `{"a": [1, 2.50, {"b": null}], "n": 123456789012345678901234567890}`},
	{`'"str"'::jsonb`, `"str"`},
	{`'<a>x</a>'::xml`, `"<a>x</a>"`},
	{`'$.a'::jsonpath`, `"$.\"a\""`},
	{`'(1,2)'::point`, `"(1,2)"`},
	{`'[(1,2),(3,4)]'::lseg`, `"[(1,2),(3,4)]"`},
	{`'((1,2),(3,4))'::path`, `"((1,2),(3,4))"`},
	{`'(3,4),(1,2)'::box`, `"(3,4),(1,2)"`},
	{`'((1,2),(3,4),(5,6))'::polygon`, `"((1,2),(3,4),(5,6))"`},
	{`'{1,2,3}'::line`, `"{1,2,3}"`},
	{`'<(1,2),3>'::circle`, `"<(1,2),3>"`},
	{`'10.0.0.0/8'::cidr`, `"10.0.0.0/8"`},
	{`1.5::float4`, `1.5`},
	{`0.1::float8`, `0.1`},
	{`1e300::float8`, `1e+300`},
	{`'NaN'::float8`, `"NaN"`},
	{`'Infinity'::float8`, `"Infinity"`},
	{`'-Infinity'::float4`, `"-Infinity"`},
	{`'08:00:2b:01:02:03:04:05'::macaddr8`, `"08:00:2b:01:02:03:04:05"`},
	{`12.34::money`, `"$12.34"`},
	{`'08:00:2b:01:02:03'::macaddr`, `"08:00:2b:01:02:03"`},
	{`'192.168.0.1'::inet`, `"192.168.0.1"`},
	{`'ab'::bpchar(5)`, `"ab   "`},
	{`'ab'::varchar(5)`, `"ab"`},
	{`'2026-10-03'::date`, `"2026-10-03"`},
	{`'infinity'::date`, `"infinity"`},
	{`'06:14:39.365472'::time`, `"06:14:39.365472"`},
	{`'2026-10-03 06:14:39.365472'::timestamp`, `"2026-10-03T06:14:39.365472"`},
	{`'2026-10-03 06:14:39'::timestamp`, `"2026-10-03T06:14:39"`},
	{`'0044-03-15 12:00:00 BC'::timestamp`, `"0044-03-15 12:00:00 BC"`},
	{`'infinity'::timestamp`, `"infinity"`},
	{`'2026-10-03 08:14:39.365472+02'::timestamptz`, `"2026-10-03T06:14:39.365472+00:00"`},
	{`'-infinity'::timestamptz`, `"-infinity"`},
	{`'12345-01-01 00:00:00+00'::timestamptz`, `"12345-01-01T00:00:00+00:00"`},
	{`'1 year 2 mons 3 days 04:05:06.5'::interval`, `"1 year 2 mons 3 days 04:05:06.5"`},
	{`'06:14:39+05:30'::timetz`, `"06:14:39+05:30"`},
	{`B'101'::bit(3)`, `"101"`},
	{`B'10'::varbit`, `"10"`},
	{`123456789012345678901234567890::numeric`, `123456789012345678901234567890`},
	{`(-0.000000000000000000000000000001)::numeric`, `-0.000000000000000000000000000001`},
	{`'NaN'::numeric`, `"NaN"`},
	{`'Infinity'::numeric`, `"Infinity"`},
	{`'cur'::refcursor`, `"cur"`},
	{`'pg_class'::regclass`, `"pg_class"`},
	{`'int4'::regtype`, `"integer"`},
	{`'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid`, `"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"`},
	{`'0/1570EA0'::pg_lsn`, `"0/1570EA0"`},
	{`'a fat cat'::tsvector`, `"'a' 'cat' 'fat'"`},
	{`'fat & cat'::tsquery`, `"'fat' & 'cat'"`},
	{`'[1,5)'::int4range`, `"[1,5)"`},
	{`'[1.5,2.5]'::numrange`, `"[1.5,2.5]"`},
	{`'[2026-01-01,2026-02-01)'::daterange`, `"[2026-01-01,2026-02-01)"`},
	{`'["2026-01-01 00:00:00+00","2026-01-02 00:00:00+00")'::tstzrange`, `"[\"2026-01-01 00:00:00+00\",\"2026-01-02 00:00:00+00\")"`},
	{`'{[1,3),[5,7)}'::int4multirange`, `"{[1,3),[5,7)}"`},
	{`'10:20:10,14,15'::pg_snapshot`, `"10:20:10,14,15"`},
	{`'5'::xid8`, `"5"`},
	{`'happy'::mood`, `"happy"`},
	{`ROW(1,'a b')::pair`, `"(1,\"a b\")"`},
	{`7::posint`, `7`},
	{`'{"x":1}'::jdom`, `{"x": 1}`},
	{`''::text`, `""`},
	{`'NULL'::text`, `"NULL"`},
	{`'a,b{c}"d\e'::text`, `"a,b{c}\"d\\e"`},
}

func setup(t *testing.T) *pgx.Conn {
	pg := testenv.StartPostgres(t)
	pg.Exec(`CREATE TYPE mood AS ENUM ('happy', 'sad');
		CREATE TYPE pair AS (n int, s text);
		CREATE DOMAIN posint AS int CHECK (VALUE > 0);
		CREATE DOMAIN jdom AS jsonb`)
	cfg, err := pgx.ParseConfig(pg.DSN())
	if err != nil {
		t.Fatal(err)
	}
	ApplySettings(cfg.RuntimeParams)
	conn, err := pgx.ConnectConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// convertQuery runs sql (one row, one column) and converts its text output.
func convertQuery(t *testing.T, conn *pgx.Conn, reg *Registry, sql string) string {
	t.Helper()
	ctx := context.Background()
	res := conn.PgConn().ExecParams(ctx, sql, nil, nil, nil, nil).Read()
	if res.Err != nil {
		t.Fatalf("%s: %v", sql, res.Err)
	}
	oid := res.FieldDescriptions[0].DataTypeOID
	if err := reg.Load(ctx, conn, []uint32{oid}); err != nil {
		t.Fatal(err)
	}
	v := res.Rows[0][0]
	if v == nil {
		return string(AppendNull(nil))
	}
	return string(Append(nil, reg.Lookup(oid), v))
}

func TestConvertEveryBuiltinTypeAndItsArray(t *testing.T) {
	conn := setup(t)
	reg := NewRegistry()
	for _, c := range cases {
		if got := convertQuery(t, conn, reg, "SELECT "+c.expr); got != c.want {
			t.Errorf("%s: got %s, want %s", c.expr, got, c.want)
		}
		arr := "SELECT ARRAY[" + c.expr + ", NULL]"
		if got, want := convertQuery(t, conn, reg, arr), "["+c.want+",null]"; got != want {
			t.Errorf("%s: got %s, want %s", arr, got, want)
		}
	}
}

func TestConvertArrayLiterals(t *testing.T) {
	conn := setup(t)
	reg := NewRegistry()
	for _, c := range []struct{ expr, want string }{
		{`'{{1,2},{3,4}}'::int[]`, `[[1,2],[3,4]]`},
		{`'[0:1]={7,8}'::int[]`, `[7,8]`},
		{`'{}'::text[]`, `[]`},
		{`ARRAY['a,b', 'c"d', 'e\f', '{g}', 'NULL', ' sp ', '']`, `["a,b","c\"d","e\\f","{g}","NULL"," sp ",""]`},
		{`ARRAY['(1,2),(0,0)'::box, '(3,3),(2,2)'::box]`, `["(1,2),(0,0)","(3,3),(2,2)"]`},
		{`'{{"a b",NULL},{c,d}}'::text[]`, `[["a b",null],["c","d"]]`},
		{`ARRAY['happy'::mood]`, `["happy"]`},
		{`ARRAY[ROW(1,'x')::pair]`, `["(1,x)"]`},
		{`ARRAY[1::posint]`, `[1]`},
		{`'{1.5,NaN,-Infinity}'::float8[]`, `[1.5,"NaN","-Infinity"]`},
		{`'{"2026-01-01 00:00:00+00"}'::timestamptz[]`, `["2026-01-01T00:00:00+00:00"]`},
		{`'{"{\"a\": {\"b\": [1, 2]}}"}'::jsonb[]`, `[{"a": {"b": [1, 2]}}]`},
	} {
		if got := convertQuery(t, conn, reg, "SELECT "+c.expr); got != c.want {
			t.Errorf("%s: got %s, want %s", c.expr, got, c.want)
		}
	}
}

func TestAppendRejectsMalformedInput(t *testing.T) {
	for _, c := range []struct {
		typ        *Type
		text, want string
	}{
		{ScalarType(1700), "1.", `"1."`},
		{ScalarType(1700), "01", `"01"`},
		{ScalarType(114), "{bad", `"{bad"`},
		{ScalarType(1184), "2026-10-03 06:14:39", `"2026-10-03 06:14:39"`},
		{ArrayOf(1007, ScalarType(23), ','), "{1,2", `"{1,2"`},
		{ScalarType(25), "\x01\xff", `"\u0001` + "\ufffd" + `"`},
	} {
		if got := string(Append(nil, c.typ, []byte(c.text))); got != c.want {
			t.Errorf("%q: got %s, want %s", c.text, got, c.want)
		}
	}
}

// TestPlainRunMatchesByteByByte: the run of bytes AppendString copies as they are ends exactly
// where a byte-by-byte test says, for every byte value at every position of a word and across the
// word boundary.
func TestPlainRunMatchesByteByByte(t *testing.T) {
	naive := func(s []byte) int {
		i := 0
		for i < len(s) && s[i] >= 0x20 && s[i] < 0x7f && s[i] != '"' && s[i] != '\\' {
			i++
		}
		return i
	}
	for n := 0; n <= 19; n++ {
		for at := 0; at < n; at++ {
			for c := 0; c < 256; c++ {
				s := []byte(strings.Repeat("a~ Z09!}", 3)[:n])
				s[at] = byte(c)
				if got, want := plainRun(s), naive(s); got != want {
					t.Fatalf("plainRun(%q) = %d, want %d", s, got, want)
				}
			}
		}
	}
}

// BenchmarkAppendString converts a 96-character ASCII text, the value of the snapshot benchmark's
// text column.
func BenchmarkAppendString(b *testing.B) {
	s := []byte(strings.Repeat("c4ca4238a0b923820dcc509a6f75849b", 3))
	var dst []byte
	b.SetBytes(int64(len(s)))
	for b.Loop() {
		dst = AppendString(dst[:0], s)
	}
}
