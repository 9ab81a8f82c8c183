package source_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay/internal/oracle"
	"github.com/pgrelay/pgrelay/internal/pointer"
)

// envelopeOf decodes an entry holding an envelope, and its events' op, table and seq.
func envelopeOf(t *testing.T, en oracle.Entry) (oracle.Envelope, []string) {
	t.Helper()
	var env oracle.Envelope
	if err := json.Unmarshal(en.Payload, &env); err != nil || env.Op != "x" {
		t.Fatalf("not an envelope (%v): %.300s", err, en.Payload)
	}
	var evs []string
	for _, raw := range env.Events {
		var c struct {
			Op    string  `json:"op"`
			Table *string `json:"table"`
			Seq   int     `json:"seq"`
		}
		if err := json.Unmarshal(raw, &c); err != nil {
			t.Fatal(err)
		}
		name := "-"
		if c.Table != nil {
			name = strings.TrimPrefix(*c.Table, "public.")
		}
		evs = append(evs, fmt.Sprintf("%s %s %d", c.Op, name, c.Seq))
	}
	return env, evs
}

// TestEnvelopeOfATransaction: three tables changed in one transaction, with a published message
// and a table of another queue in it, give exactly one message in the enveloped queue holding the
// four events in order (and a plain event in the other queue); a rolled-back transaction gives
// nothing; rows there before the start come as snapshot chunk envelopes; the queue replays to the
// tables.
func TestEnvelopeOfATransaction(t *testing.T) {
	e := newEnv(t)
	e.pg.Exec(`CREATE TABLE orders (id int PRIMARY KEY, total numeric);
		CREATE TABLE items (id int PRIMARY KEY, order_id int, sku text);
		CREATE TABLE notes (id int PRIMARY KEY, body text);
		CREATE TABLE audit (id int PRIMARY KEY, what text);
		INSERT INTO orders SELECT g, g * 1.5 FROM generate_series(1, 5) g`)
	e.run("env", `
      - {table: orders, queue: tx}
      - {table: items, queue: tx}
      - {table: notes, queue: tx}
      - {table: audit, queue: plain}`, `
envelopes:
  - {queue: tx, partition: shop}
snapshot: initial
chunk_rows: 3`)
	e.waitPointer("env", "tx")
	// The snapshot of every table ends before the writes below: a table not yet read would otherwise
	// also get the new rows as r events (a chunk envelope more in tx, an r after audit's c).
	e.waitSnapshotDone("env", "tx", 60*time.Second)
	// The snapshot: 5 rows in chunks of 3 → two chunk envelopes.
	snap := e.waitEntries("tx", 2)
	var snapRows []string
	for i, en := range snap {
		env, evs := envelopeOf(t, en)
		if env.Xid != nil || !strings.HasPrefix(env.ID, "pg:") || !strings.Contains(env.ID, ":s:") || en.Tx != env.ID ||
			en.ID != pointer.EnvelopeID(env.ID, 1) || !env.Last || en.Partition != "shop" {
			t.Errorf("chunk %d: %s %s %s", i, en.ID, en.Partition, en.Payload)
		}
		snapRows = append(snapRows, evs...)
	}
	if got := strings.Join(snapRows, ","); got != "r orders 0,r orders 1,r orders 2,r orders 0,r orders 1" {
		t.Errorf("snapshot events %s", got)
	}

	e.pg.Exec(`BEGIN;
		INSERT INTO orders VALUES (10, 99.95);
		INSERT INTO audit VALUES (1, 'order 10');
		INSERT INTO items VALUES (100, 10, 'apple');
		SELECT pgrelay.publish('tx', 'ignored', '{"order": 10, "event": "placed"}');
		UPDATE orders SET total = 7 WHERE id = 1;
		INSERT INTO notes VALUES (1, 'ring twice');
		COMMIT`)
	e.pg.Exec(`BEGIN; INSERT INTO orders VALUES (11, 1); INSERT INTO items VALUES (101, 11, 'pear'); ROLLBACK`)
	e.pg.Exec(`UPDATE orders SET id = 12 WHERE id = 2`) // a key change: one u, its before the old key
	got := e.waitEntries("tx", 4)
	time.Sleep(500 * time.Millisecond)
	if got = e.waitEntries("tx", 4); len(got) != 4 {
		t.Fatalf("%d messages in tx, want 4 (2 chunks, the transaction, the key change)", len(got))
	}
	env, evs := envelopeOf(t, got[2])
	if want := "c orders 0,c items 2,m - 3,u orders 4,c notes 5"; strings.Join(evs, ",") != want {
		t.Errorf("events %s, want %s", strings.Join(evs, ","), want)
	}
	if env.Xid == nil || env.Part != 1 || !env.Last || got[2].Tx != env.ID || got[2].ID != env.ID+":t1" || got[2].Partition != "shop" {
		t.Errorf("envelope %s (entry id %s, tx %s, partition %s)", got[2].Payload, got[2].ID, got[2].Tx, got[2].Partition)
	}
	var m struct {
		Events []struct {
			Op    string          `json:"op"`
			After json.RawMessage `json:"after"`
			LSN   string          `json:"lsn"`
			Xid   uint64          `json:"xid"`
		} `json:"events"`
	}
	if err := json.Unmarshal(got[2].Payload, &m); err != nil {
		t.Fatal(err)
	}
	for _, ev := range m.Events {
		if ev.LSN != env.LSN || ev.Xid != *env.Xid {
			t.Errorf("event of another transaction in the envelope: %+v", ev)
		}
	}
	if string(m.Events[2].After) != `{"event": "placed", "order": 10}` { // as jsonb prints it
		t.Errorf("published message %s", m.Events[2].After)
	}
	_, move := envelopeOf(t, got[3])
	if strings.Join(move, ",") != "u orders 0" || !strings.Contains(string(got[3].Payload), `"key":{"id":12}`) || !strings.Contains(string(got[3].Payload), `"before":{"id":2}`) {
		t.Errorf("key change %s", got[3].Payload)
	}
	plain := e.waitEntries("plain", 1)
	if len(plain) != 1 || !strings.HasPrefix(string(plain[0].Payload), `{"op":"c","table":"public.audit"`) || plain[0].Tx != env.ID {
		t.Errorf("plain queue: %+v", plain)
	}
	e.checkOracle("tx", "public.orders", "id")
	e.checkOracle("tx", "public.items", "id")
	e.checkOracle("tx", "public.notes", "id")
}

// TestEnvelopeSnapshotWhileRandomWriter is TestSnapshotWhileRandomWriter with the queue enveloped
// (small parts): the snapshot's window sees the stream changes inside envelopes (a row changed
// between a chunk's watermarks is dropped from the chunk), so the replay equals both tables, and
// every transaction's parts come once each, in order, up to the last.
func TestEnvelopeSnapshotWhileRandomWriter(t *testing.T) {
	e := newEnv(t)
	w := e.seedSnapshotTables(t)
	e.run("snapenv", `[{table: a, queue: q}, {table: b, queue: q}]`, `
snapshot: initial
chunk_rows: 100
max_bundle_messages: 40
envelopes: [{queue: q, max_events: 30}]`)
	e.waitPointer("snapenv", "q")
	e.waitSnapshotDone("snapenv", "q", 90*time.Second)
	time.Sleep(500 * time.Millisecond)
	w.halt()
	res := e.waitOracle("q", 30*time.Second, map[string][]string{"public.a": {"id"}, "public.b": {"k1", "k2"}})
	parts := 0
	for _, n := range res.Parts {
		if n > 1 {
			parts++
		}
	}
	t.Logf("writer: %d statements; queue: %d events in %d envelopes, %d transactions or chunks in several parts", w.n, res.Events, res.Envelopes, parts)
	if res.Events < 2500 || res.Envelopes == 0 || parts == 0 {
		t.Errorf("too little happened: %d events in %d envelopes, %d in several parts", res.Events, res.Envelopes, parts)
	}
}
