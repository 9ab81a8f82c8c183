package sink

import (
	"strings"
	"testing"
)

// TestMapping checks each mapping rule of DESIGN §7 against a real table: every case writes its
// batches and reads the rows back as text.
func TestMapping(t *testing.T) {
	f := startPG(t)
	f.exec(t, `CREATE TYPE address AS (city text, zip int)`)
	const tableDDL = `CREATE TABLE %s (
		id      bigint PRIMARY KEY,
		total   numeric(12,2),
		note    text DEFAULT 'dflt',
		"Name"  text,
		tags    text[],
		doc     jsonb,
		raw     json,
		addr    address,
		doubled numeric GENERATED ALWAYS AS (total * 2) STORED,
		big     bigint,
		huge    numeric,
		qty     int DEFAULT 7,
		seen    timestamptz DEFAULT '2000-01-01T00:00:00Z',
		at      timestamptz,
		part    text,
		off     bigint,
		sh      int,
		mid     text,
		txid    text,
		created timestamptz,
		payload jsonb
	)`
	type want struct {
		where string // a WHERE clause selecting one row
		expr  string // a text expression over the row
		value string
	}
	cases := []struct {
		name    string
		mode    Mode
		meta    MetadataColumns
		batches [][]string // payloads; each batch's offsets continue the previous
		wants   []want
	}{
		{name: "seed: a message naming only id and total changes only total", mode: ModeUpsert,
			batches: [][]string{{`{"id":1,"total":"12.50","note":"kept","qty":3}`}, {`{"id":1,"total":99.1}`}},
			wants: []want{{"id=1", "total::text", "99.10"}, {"id=1", "note", "kept"}, {"id=1", "qty::text", "3"},
				{"id=1", "doubled::text", "198.20"}}},
		{name: "absent key gets the DEFAULT on insert", mode: ModeUpsert,
			batches: [][]string{{`{"id":2,"total":1}`}},
			wants:   []want{{"id=2", "note", "dflt"}, {"id=2", "qty::text", "7"}, {"id=2", "seen::text", "2000-01-01 00:00:00+00"}}},
		{name: "explicit null stores NULL, unlike an absent key", mode: ModeUpsert,
			batches: [][]string{{`{"id":3,"note":"x","qty":1}`}, {`{"id":3,"note":null}`}},
			wants:   []want{{"id=3", "coalesce(note,'<null>')", "<null>"}, {"id=3", "qty::text", "1"}}},
		{name: "exact, case-sensitive names; unknown keys ignored", mode: ModeUpsert,
			batches: [][]string{{`{"id":4,"Name":"upper","name":"lower","NOTE":"no","whatever":{"x":1}}`}},
			wants:   []want{{"id=4", `"Name"`, "upper"}, {"id=4", "note", "dflt"}}},
		{name: "values converted by PostgreSQL from the exact text", mode: ModeUpsert,
			batches: [][]string{{`{"id":5,"total":"12.50","big":9223372036854775807,"huge":123456789012345678901234567890.123456789,"qty":"42","at":"2026-10-03T06:14:39.365472+00:00"}`}},
			wants: []want{{"id=5", "total::text", "12.50"}, {"id=5", "big::text", "9223372036854775807"},
				{"id=5", "huge::text", "123456789012345678901234567890.123456789"}, {"id=5", "qty::text", "42"},
				{"id=5", "at::text", "2026-10-03 06:14:39.365472+00"}}},
		{name: "nested objects into jsonb and json as they are", mode: ModeUpsert,
			batches: [][]string{{`{"id":6,"doc":{"b":[1,2.50,{"c":null}],"a":"x"},"raw":{"z":1,  "a":[true]}}`}},
			wants: []want{{"id=6", "doc::text", `{"a": "x", "b": [1, 2.50, {"c": null}]}`},
				{"id=6", "raw::text", `{"z":1,  "a":[true]}`}}},
		{name: "a JSON string into jsonb stays a string", mode: ModeUpsert,
			batches: [][]string{{`{"id":7,"doc":"{\"not\":\"parsed\"}"}`}},
			wants:   []want{{"id=7", "jsonb_typeof(doc)", "string"}}},
		{name: "nested object into a composite, field by field", mode: ModeUpsert,
			batches: [][]string{{`{"id":8,"addr":{"city":"Bergen","zip":5003,"extra":1}}`}},
			wants:   []want{{"id=8", "(addr).city", "Bergen"}, {"id=8", "(addr).zip::text", "5003"}}},
		{name: "arrays with NULL, commas, quotes and braces into an array column", mode: ModeUpsert,
			batches: [][]string{{`{"id":9,"tags":["a,b","say \"hi\"","{x}",null,"NULL",""]}`}},
			wants: []want{{"id=9", "array_length(tags,1)::text", "6"}, {"id=9", "tags[1]", "a,b"},
				{"id=9", "tags[2]", `say "hi"`}, {"id=9", "tags[3]", "{x}"}, {"id=9", "coalesce(tags[4],'<null>')", "<null>"},
				{"id=9", "tags[5]", "NULL"}, {"id=9", "tags[6]", ""}}},
		{name: "an array literal string into an array column", mode: ModeUpsert,
			batches: [][]string{{`{"id":10,"tags":"{p,q}"}`}},
			wants:   []want{{"id=10", "array_to_string(tags,'|')", "p|q"}}},
		{name: "generated columns are never written, PostgreSQL computes them", mode: ModeUpsert,
			batches: [][]string{{`{"id":11,"total":2,"doubled":999}`}},
			wants:   []want{{"id=11", "doubled::text", "4.00"}}},
		{name: "repeated keys folded in offset order (no 21000)", mode: ModeUpsert,
			batches: [][]string{{`{"id":12,"total":1,"note":"a"}`, `{"id":12,"qty":5}`, `{"id":12,"total":3}`, `{"id":13,"total":1}`}},
			wants:   []want{{"id=12", "total::text || note || qty", "3.00a5"}, {"id=13", "total::text", "1.00"}}},
		{name: "metadata columns filled", mode: ModeUpsert,
			meta:    MetadataColumns{Partition: "part", Offset: "off", Shard: "sh", MessageID: "mid", TransactionID: "txid", CreatedAt: "created", Payload: "payload"},
			batches: [][]string{{`{"id":14,"total":1}`}},
			wants: []want{{"id=14", "part || '/' || off || '/' || sh || '/' || mid", "p12/1/12/m-12-1"},
				{"id=14", "coalesce(txid,'<null>')", "<null>"}, {"id=14", "created::text", "2026-10-03 06:15:03.583+00"},
				{"id=14", "payload->>'total'", "1"}}},
		{name: "append inserts every message, absent keys get DEFAULT", mode: ModeAppend,
			batches: [][]string{{`{"id":15,"total":"1.005"}`, `{"id":16,"note":"n"}`}},
			wants:   []want{{"id=15", "total::text || note", "1.01dflt"}, {"id=16", "coalesce(total::text,'<null>') || note", "<null>n"}}},
		{name: "append (COPY path) keeps tabs, newlines, backslashes and a literal \\N", mode: ModeAppend,
			batches: [][]string{{`{"id":17,"note":"tab\there\nnew\\back\r\\N","Name":null,"doc":{"a":"x\ty"}}`}},
			wants: []want{{"id=17", "note", "tab\there\nnew\\back\r\\N"}, {"id=17", "coalesce(\"Name\",'<null>')", "<null>"},
				{"id=17", "doc->>'a'", "x\ty"}}},
		{name: "append with arrays and composites (INSERT path)", mode: ModeAppend,
			batches: [][]string{{`{"id":18,"tags":["a","b\tc"],"addr":{"city":"Oslo"}}`}},
			wants:   []want{{"id=18", "tags[2] || (addr).city", "b\tcOslo"}}},
	}
	for n, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			table := f.name("map")
			f.exec(t, strings.Replace(tableDDL, "%s", table, 1))
			a := f.applier(t, Config{Table: table, Mode: c.mode, Metadata: c.meta})
			off := int64(0)
			for _, b := range c.batches {
				var msgs []*Message
				for _, p := range b {
					off++
					m := msg("q", int32(n), off, p)
					m.CreatedAt = 1791008103583
					msgs = append(msgs, m)
				}
				res := write(t, a, msgs...)
				if res.Applied != len(b) {
					t.Fatalf("applied %d of %d: %v", res.Applied, len(b), res.Errs)
				}
			}
			for _, w := range c.wants {
				if got := f.one(t, `SELECT (`+w.expr+`)::text FROM `+table+` WHERE `+w.where); got != w.value {
					t.Errorf("%s: got %q, want %q", w.expr, got, w.value)
				}
			}
		})
	}
}

// TestIdentity: identity ALWAYS columns take the message's value with OVERRIDING SYSTEM VALUE and
// are generated when the message leaves them out; BY DEFAULT columns behave like defaults.
func TestIdentity(t *testing.T) {
	f := startPG(t)
	table := f.name("ident")
	f.exec(t, `CREATE TABLE `+table+` (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, v text)`)
	a := f.applier(t, Config{Table: table, Mode: ModeAppend})
	write(t, a, msg("q", 0, 1, `{"v":"generated"}`), msg("q", 0, 2, `{"id":100,"v":"given"}`))
	u := f.applier(t, Config{Table: table, Mode: ModeUpsert})
	write(t, u, msg("q", 1, 1, `{"id":100,"v":"updated"}`), msg("q", 1, 2, `{"id":200,"v":"new"}`))
	got := strings.Join(f.queryStrings(t, `SELECT id || '=' || v FROM `+table+` ORDER BY id`), ",")
	if got != "1=generated,100=updated,200=new" {
		t.Fatalf("rows %s", got)
	}
}
