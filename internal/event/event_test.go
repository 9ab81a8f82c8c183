package event

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay/internal/convert"
)

func text(s string) Value { return Value{Data: []byte(s)} }

var (
	nullV      = Value{Kind: Null}
	unchangedV = Value{Kind: Unchanged}
)

// testTable is public."t x" (id int4, "na\"me" text, js jsonb, big text, arr int4[]) keyed by id.
func testTable(part []int) *Table {
	int4 := convert.ScalarType(23)
	return NewTable(`public.t x`, []Column{{"id", int4}, {`na"me`, convert.ScalarType(25)}, {"js", convert.ScalarType(3802)},
		{"big", convert.ScalarType(25)}, {"arr", convert.ArrayOf(1007, int4, ',')}}, []int{0}, part)
}

func TestAppendChange(t *testing.T) {
	tab := testTable([]int{0})
	row := Row{text("7"), text(`a"b`), text(`{"k": [1, 2.50]}`), text("x"), text("{1,NULL}")}
	toasted := Row{text("7"), nullV, text("{}"), unchangedV, text("{}")}
	old := Row{text("6"), text("o"), nullV, text("y"), nullV}
	stream := Position{LSN: "0/1570EA0", Xid: 745, TS: "2026-10-03T06:15:03.583036Z", Seq: 3}
	snap := Position{LSN: "0/500", TS: "1970-01-01T00:00:00.000000Z"}
	for _, c := range []struct {
		name string
		c    Change
		want string
	}{
		{"insert", Change{Op: OpInsert, Row: row, Position: stream},
			`{"op":"c","table":"public.t x","key":{"id":7},"after":{"id":7,"na\"me":"a\"b","js":{"k": [1, 2.50]},"big":"x","arr":[1,null]},"before":null,"lsn":"0/1570EA0","xid":745,"ts":"2026-10-03T06:15:03.583036Z","seq":3}`},
		{"snapshot read: no xid", Change{Op: OpRead, Row: row, Position: snap},
			`{"op":"r","table":"public.t x","key":{"id":7},"after":{"id":7,"na\"me":"a\"b","js":{"k": [1, 2.50]},"big":"x","arr":[1,null]},"before":null,"lsn":"0/500","ts":"1970-01-01T00:00:00.000000Z","seq":0}`},
		{"update: unchanged left out of after and listed; NULL is not unchanged", Change{Op: OpUpdate, Row: toasted, Position: stream},
			`{"op":"u","table":"public.t x","key":{"id":7},"after":{"id":7,"na\"me":null,"js":{},"arr":[]},"before":null,"unchanged":["big"],"lsn":"0/1570EA0","xid":745,"ts":"2026-10-03T06:15:03.583036Z","seq":3}`},
		{"update of the key: before from the old row", Change{Op: OpUpdate, Row: row, BeforeCols: tab.Key, Before: old, Position: stream},
			`{"op":"u","table":"public.t x","key":{"id":7},"after":{"id":7,"na\"me":"a\"b","js":{"k": [1, 2.50]},"big":"x","arr":[1,null]},"before":{"id":6},"lsn":"0/1570EA0","xid":745,"ts":"2026-10-03T06:15:03.583036Z","seq":3}`},
		{"delete under FULL: after null, before the whole row, no unchanged", Change{Op: OpDelete, Row: toasted, BeforeCols: tab.All(), Position: stream},
			`{"op":"d","table":"public.t x","key":{"id":7},"after":null,"before":{"id":7,"na\"me":null,"js":{},"arr":[]},"lsn":"0/1570EA0","xid":745,"ts":"2026-10-03T06:15:03.583036Z","seq":3}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := tab.AppendChange([]byte("prefix:"), &c.c)
			if string(got) != "prefix:"+c.want {
				t.Errorf("got  %s\nwant prefix:%s", got, c.want)
			}
			if !json.Valid(got[len("prefix:"):]) {
				t.Errorf("not JSON: %s", got)
			}
		})
	}
	if got, want := string(tab.AppendTruncate(nil, &stream)), `{"op":"t","table":"public.t x","key":null,"after":null,"before":null,"lsn":"0/1570EA0","xid":745,"ts":"2026-10-03T06:15:03.583036Z","seq":3}`; got != want {
		t.Errorf("truncate %s\nwant     %s", got, want)
	}
	if got, want := string(AppendMessage(nil, []byte(`{"a":1}`), &stream)), `{"op":"m","table":null,"key":null,"after":{"a":1},"before":null,"lsn":"0/1570EA0","xid":745,"ts":"2026-10-03T06:15:03.583036Z","seq":3}`; got != want {
		t.Errorf("message %s\nwant    %s", got, want)
	}
	if got := string(tab.AppendKey(nil, row)); got != `{"id":7}` {
		t.Errorf("key %s", got)
	}
}

func TestPartition(t *testing.T) {
	row := Row{text("7"), text(`a|b`), nullV, unchangedV, text("{}")}
	for _, c := range []struct {
		name string
		part []int
		want string
	}{
		{"single", nil, "all"},
		{"key", []int{0}, "7"},
		{"columns, NULL and escapes", []int{1, 2, 0}, `a\|b|\N|7`},
	} {
		if got := testTable(c.part).Partition(row); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}

func TestTextRow(t *testing.T) {
	r := TextRow(make(Row, 5), [][]byte{[]byte("1"), nil, {}})
	if len(r) != 3 || r[0].Kind != Text || string(r[0].Data) != "1" || r[1].Kind != Null || r[2].Kind != Text || r[2].Data == nil {
		t.Fatalf("%+v", r)
	}
}

// BenchmarkAppendChange encodes an update of a 10-column row with an unchanged column into a
// reused buffer: the encoder's own cost per change (it allocates nothing).
func BenchmarkAppendChange(b *testing.B) {
	int8, txt, num := convert.ScalarType(20), convert.ScalarType(25), convert.ScalarType(1700)
	cols := []Column{{"id", int8}, {"name", txt}, {"email", txt}, {"balance", num}, {"note", txt},
		{"a", int8}, {"b", int8}, {"c", txt}, {"d", num}, {"big", txt}}
	tab := NewTable("public.accounts", cols, []int{0}, []int{0})
	row := Row{text("123456"), text("Ada Lovelace"), text("ada@example.com"), text("1234.50"), text("a \"quoted\" note"),
		text("1"), text("2"), text("three"), text("4.5"), unchangedV}
	c := Change{Op: OpUpdate, Row: row, Position: Position{LSN: "0/1570EA0", Xid: 745, TS: "2026-10-03T06:15:03.583036Z"}}
	var buf []byte
	b.ReportAllocs()
	for b.Loop() {
		c.Seq++
		buf = tab.AppendChange(buf[:0], &c)
	}
	b.SetBytes(int64(len(buf)))
}

func TestAppendEnvelope(t *testing.T) {
	tab := testTable(nil)
	stream := Position{LSN: "0/1570EA0", Xid: 745, TS: "2026-10-03T06:15:03.583036Z", Seq: 0}
	events := tab.AppendChange(nil, &Change{Op: OpInsert, Row: Row{text("7"), nullV, nullV, nullV, nullV}, Position: stream})
	stream.Seq = 1
	events = append(events, ',')
	events = AppendMessage(events, []byte(`{"a":1}`), &stream)
	for _, c := range []struct {
		name   string
		h      Envelope
		events []byte
		want   string
	}{
		{"a transaction in one message", Envelope{ID: "pg:0a1b2c3d:0000000001570EA0", LSN: "0/1570EA0", Xid: 745, TS: stream.TS, Part: 1, Last: true}, events,
			`{"op":"x","id":"pg:0a1b2c3d:0000000001570EA0","lsn":"0/1570EA0","xid":745,"ts":"2026-10-03T06:15:03.583036Z","part":1,"last":true,"events":[` +
				`{"op":"c","table":"public.t x","key":{"id":7},"after":{"id":7,"na\"me":null,"js":null,"big":null,"arr":null},"before":null,"lsn":"0/1570EA0","xid":745,"ts":"2026-10-03T06:15:03.583036Z","seq":0},` +
				`{"op":"m","table":null,"key":null,"after":{"a":1},"before":null,"lsn":"0/1570EA0","xid":745,"ts":"2026-10-03T06:15:03.583036Z","seq":1}]}`},
		{"a snapshot chunk's first part: no xid", Envelope{ID: "pg:0a1b2c3d:s:0000000000000500", LSN: "0/500", TS: "1970-01-01T00:00:00.000000Z", Part: 1}, nil,
			`{"op":"x","id":"pg:0a1b2c3d:s:0000000000000500","lsn":"0/500","ts":"1970-01-01T00:00:00.000000Z","part":1,"last":false,"events":[]}`},
	} {
		got := AppendEnvelope([]byte("prefix:"), &c.h, c.events)
		if string(got) != "prefix:"+c.want {
			t.Errorf("%s:\ngot  %s\nwant prefix:%s", c.name, got, c.want)
		}
		if !json.Valid(got[len("prefix:"):]) {
			t.Errorf("%s: not JSON: %s", c.name, got)
		}
	}
}

// TestFormatTime: FormatTime writes what time.Format writes with TimeFormat, in UTC, for times
// in and outside years 0-9999 and in other zones.
func TestFormatTime(t *testing.T) {
	zone := time.FixedZone("x", -7*3600-30*60)
	for _, tm := range []time.Time{
		time.Date(2026, 10, 3, 6, 15, 3, 583036999, time.UTC), time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(1999, 12, 31, 23, 59, 59, 999999999, time.UTC), time.Date(9999, 12, 31, 23, 59, 59, 1000, time.UTC),
		time.Date(2026, 3, 1, 20, 0, 0, 5000, zone), time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(1, 2, 3, 4, 5, 6, 7000, time.UTC), time.UnixMicro(946684800000000 + 1<<40),
	} {
		if got, want := FormatTime(tm), tm.UTC().Format(TimeFormat); got != want {
			t.Errorf("%v: %s, want %s", tm, got, want)
		}
	}
}
