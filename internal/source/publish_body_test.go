package source_test

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"sort"
	"strings"
	"testing"

	"github.com/jackc/pglogrepl"

	"github.com/pgrelay/pgrelay/internal/oracle"
	"github.com/pgrelay/pgrelay/internal/partition"
	"github.com/pgrelay/pgrelay/resources"
)

// publishBuildObjectBody is the body of pgrelay.publish() that builds a jsonb object and prints it:
// databases where it was installed keep it (an existing function is never replaced), so pg_cdc
// must read its messages exactly as those of resources/source_publish.sql.
const publishBuildObjectBody = `CREATE OR REPLACE FUNCTION pgrelay.publish(queue text, partition text, payload jsonb)
RETURNS pg_lsn LANGUAGE sql VOLATILE AS $$
  SELECT pg_logical_emit_message(true, 'pgrelay',
    jsonb_build_object('queue', queue, 'partition', partition, 'payload', payload)::text)
$$`

// publishCase is one pgrelay.publish() call; nil is SQL NULL.
type publishCase struct {
	name               string
	partition, payload *string
}

func sqlText(s string) *string { return &s }

var publishCases = []publishCase{
	{"order event", sqlText("cust-7"), sqlText(`{"order_id": 1, "customer": "customer-1", "total": "1.01", "lines": [{"sku": "SKU-1", "qty": 2}, {"sku": "SKU-1", "qty": 1}], "placed_by": "web"}`)},
	{"unicode escapes", sqlText("cust-\u00e9\"\\\x01/\t"), sqlText(`{"name": "caf\u00e9 \ud83d\ude00 日本", "ctl": "\u0001\u001f\t\n\r\b\f\"\\\/", "\u00fc": "key escaped"}`)},
	{"nested", sqlText("n"), sqlText(`{"a": {"b": {"c": [1, [2, {"d": null, "e": false}]], "z": {}}}, "e": [], "f": [[[]]]}`)},
	{"large numbers", sqlText("num"), sqlText(`[12345678901234567890123456789012345678901234567890, 1e400, -0.000000000000000000001, 1.50, 1E+2, -0, 0.1e-3]`)},
	{"key order", sqlText("keys"), sqlText(`{"zz": 1, "a": 2, "aa": 3, "b": {"y": 1, "x": 2}, "a": 4}`)},
	{"string payload", sqlText("s"), sqlText(`"alone"`)},
	{"number payload", sqlText("s"), sqlText(`42`)},
	{"JSON null payload", sqlText("s"), sqlText(`null`)},
	{"SQL NULL payload", sqlText("s"), nil},
	{"SQL NULL partition", nil, sqlText(`{"single": true}`)},
	{"empty partition", sqlText(""), sqlText(`{}`)},
	{"large payload", sqlText("big"), sqlText(`{"blob": "` + strings.Repeat("0123456789abcdef", 4096) + `"}`)},
}

// TestPublishFunctionBodiesSendTheSameMessages publishes every case above through the
// pgrelay.publish() that pg_cdc installs (resources/source_publish.sql), then again through the
// jsonb_build_object body that older installs keep, and proves the two give the same messages: the
// logical messages' bytes (read from a second slot) are identical, and the events pg_cdc queues from
// them have the same partition and the same `after`, byte for byte PostgreSQL's own text of the
// payload as jsonb. The installed function must be inlined into the calling statement.
func TestPublishFunctionBodiesSendTheSameMessages(t *testing.T) {
	e := newEnv(t)
	e.pg.Exec(`CREATE TABLE s (id int PRIMARY KEY); CREATE PUBLICATION raw_pub FOR TABLE s`)
	e.run("bodies", `[{table: s, queue: q}]`, "")
	e.waitPointer("bodies", "q")
	if !e.publishExists() {
		t.Fatal("pgrelay.publish() not installed")
	}
	var src, plan string
	if err := e.pg.Pool().QueryRow(e.ctx, `SELECT prosrc FROM pg_proc WHERE oid = 'pgrelay.publish(text,text,jsonb)'::regprocedure`).Scan(&src); err != nil {
		t.Fatal(err)
	}
	if want := resources.MustRead("source_publish.sql"); strings.Contains(src, "jsonb_build_object") || !strings.Contains(want, src) {
		t.Fatalf("installed body is not resources/source_publish.sql's:\n%s", src)
	}
	rows, err := e.pg.Pool().Query(e.ctx, `EXPLAIN VERBOSE SELECT pgrelay.publish('q', 'p', '{}')`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		plan += line + "\n"
	}
	if rows.Err() != nil || !strings.Contains(plan, "pg_logical_emit_message(") || strings.Contains(plan, "publish(") {
		t.Fatalf("pgrelay.publish() is not inlined (%v):\n%s", rows.Err(), plan)
	}
	e.pg.Exec(`SELECT pg_create_logical_replication_slot('raw_messages', 'pgoutput')`)

	publishAll := func() {
		for _, c := range publishCases {
			e.pg.Exec(`SELECT pgrelay.publish('events', $1, $2::jsonb)`, c.partition, c.payload)
		}
	}
	publishAll()
	e.pg.Exec(publishBuildObjectBody)
	publishAll()

	n := len(publishCases)
	raw := e.rawMessages("raw_messages", "raw_pub")
	if len(raw) != 2*n {
		t.Fatalf("%d logical messages, want %d", len(raw), 2*n)
	}
	for i, c := range publishCases {
		if !bytes.Equal(raw[i], raw[n+i]) {
			t.Errorf("%s: message %q, with the jsonb_build_object body %q", c.name, raw[i], raw[n+i])
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	entries := e.waitEntries("events", 2*n)
	if len(entries) != 2*n {
		t.Fatalf("%d events, want %d", len(entries), 2*n)
	}
	byCommit(t, entries)
	for i, c := range publishCases {
		want := "null"
		if c.payload != nil {
			if err := e.pg.Pool().QueryRow(e.ctx, `SELECT $1::jsonb::text`, *c.payload).Scan(&want); err != nil {
				t.Fatal(err)
			}
		}
		wantPart := partition.Single
		if c.partition != nil {
			wantPart = *c.partition
		}
		for _, en := range []oracle.Entry{entries[i], entries[n+i]} {
			ev := event(t, en)
			if string(ev["op"]) != `"m"` || string(ev["after"]) != want || en.Partition != wantPart {
				t.Errorf("%s: event %s in partition %q, want after %s in partition %q", c.name, en.Payload, en.Partition, want, wantPart)
			}
		}
	}
}

// rawMessages consumes slot (pgoutput, with messages) and returns the content of every logical
// message with prefix pgrelay, in commit order.
func (e *env) rawMessages(slot, publication string) [][]byte {
	e.t.Helper()
	rows, err := e.pg.Pool().Query(e.ctx, `SELECT data FROM pg_logical_slot_get_binary_changes($1, NULL, NULL,
		'proto_version', '1', 'publication_names', $2, 'messages', 'true')`, slot, publication)
	if err != nil {
		e.t.Fatal(err)
	}
	defer rows.Close()
	var out [][]byte
	for rows.Next() {
		var b []byte
		if err := rows.Scan(&b); err != nil {
			e.t.Fatal(err)
		}
		// pgoutput's 'M': flags (1), lsn (8), prefix\0, content length (4), content
		if len(b) < 10 || b[0] != 'M' {
			continue
		}
		rest := b[10:]
		i := bytes.IndexByte(rest, 0)
		if i < 0 || string(rest[:i]) != "pgrelay" || len(rest) < i+5 {
			e.t.Fatalf("logical message %q", b)
		}
		size := binary.BigEndian.Uint32(rest[i+1:])
		out = append(out, rest[i+5:i+5+int(size)])
	}
	if err := rows.Err(); err != nil {
		e.t.Fatal(err)
	}
	return out
}

// byCommit sorts one-event transactions' entries by their commit LSN.
func byCommit(t *testing.T, entries []oracle.Entry) {
	lsn := func(en oracle.Entry) pglogrepl.LSN {
		var s string
		if err := json.Unmarshal(event(t, en)["lsn"], &s); err != nil {
			t.Fatal(err)
		}
		l, err := pglogrepl.ParseLSN(s)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	sort.SliceStable(entries, func(i, j int) bool { return lsn(entries[i]) < lsn(entries[j]) })
}
