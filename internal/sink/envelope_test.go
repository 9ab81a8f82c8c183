package sink

import (
	"fmt"
	"strings"
	"testing"

	"github.com/pgrelay/pgrelay/internal/errcode"
)

// envelope is an `x` message (docs/source.md) holding events.
func envelope(events ...string) string {
	return `{"op":"x","id":"pg:0a1b2c3d:0000000001570EA0","lsn":"0/1570EA0","xid":745,"ts":"2026-10-03T06:15:03.583036Z","part":1,"last":true,"events":[` +
		strings.Join(events, ",") + `]}`
}

// fkCopies creates schema with copies of public.orders and public.items (whose order_id references
// orders) and returns a cdc sink with `tables` that keeps them ("public.*": "<schema>.*").
func (f *pgFixture) fkCopies(t *testing.T, schema string) *Applier {
	t.Helper()
	f.exec(t, fmt.Sprintf(`CREATE SCHEMA %[1]s;
		CREATE TABLE %[1]s.orders (id int PRIMARY KEY);
		CREATE TABLE %[1]s.items (id int PRIMARY KEY, order_id int NOT NULL REFERENCES %[1]s.orders)`, schema))
	return f.applier(t, Config{Mode: ModeCDC, Tables: map[string]string{"public.*": schema + ".*"}})
}

// fkEvent is a change event of public.orders or public.items (whose order_id references orders).
func fkEvent(op, table string, id, order int) string {
	key := fmt.Sprintf(`{"id":%d}`, id)
	after := key
	if table == "public.items" {
		after = fmt.Sprintf(`{"id":%d,"order_id":%d}`, id, order)
	}
	if op == "d" {
		return `{"op":"d","table":"` + table + `","key":` + key + `,"after":null,"before":` + key + `}`
	}
	return `{"op":"` + op + `","table":"` + table + `","key":` + key + `,"after":` + after + `,"before":null}`
}

// fkTruncate is the truncate event of table.
func fkTruncate(table string) string {
	return `{"op":"t","table":"` + table + `","key":null,"after":null,"before":null}`
}

// TestCDCEnvelopes: mode cdc applies an envelope's events in order, in the batch's transaction, so a
// source transaction lands whole or not at all:
//   - with tables, the targets of an envelope's events are found like single events' (patterns
//     resolved as they come), and its published message is nothing to write;
//   - an envelope whose events, grouped by target, would break a foreign key (a new parent and its
//     child, then an old child and its parent deleted) fails the batch's first try and is then
//     written in its own order;
//   - an envelope with an event the sink cannot read, or one PostgreSQL refuses, fails as one
//     message, none of its events written, the error naming the event; the others are applied;
//   - a sink of one table applies an envelope's events too.
func TestCDCEnvelopes(t *testing.T) {
	f := startPG(t)
	a := f.fkCopies(t, "env")
	state := func() string {
		return f.one(t, `SELECT coalesce((SELECT string_agg(id::text, ',' ORDER BY id) FROM env.orders), '-') || '/' ||
			coalesce((SELECT string_agg(id || ':' || order_id, ',' ORDER BY id) FROM env.items), '-')`)
	}
	published := `{"op":"m","table":null,"key":null,"after":{"note":"placed"},"before":null}`
	res := write(t, a, msg("q", 0, 1, envelope(fkEvent("c", "public.orders", 1, 0), fkEvent("c", "public.items", 1, 1),
		fkEvent("c", "public.items", 2, 1), published)))
	if res.Applied != 1 {
		t.Fatalf("first envelope: %v", res.Errs)
	}
	if got := state(); got != "1/1:1,2:1" {
		t.Fatalf("after the first envelope: %s", got)
	}

	// Grouped by target, order 1 would be deleted while its items still stand.
	res = write(t, a, msg("q", 0, 2, envelope(fkEvent("c", "public.orders", 2, 0), fkEvent("c", "public.items", 3, 2),
		fkEvent("d", "public.items", 1, 1), fkEvent("d", "public.items", 2, 1), fkEvent("d", "public.orders", 1, 0))))
	if res.Applied != 1 {
		t.Fatalf("the envelope in its own order: %v", res.Errs)
	}
	if got := state(); got != "2/3:2" {
		t.Fatalf("after the second envelope: %s", got)
	}

	// One envelope fails whole; the envelopes of other shards are applied.
	res = write(t, a,
		msg("q", 0, 3, envelope(fkEvent("c", "public.orders", 10, 0), `{"op":"c","table":"public.items","key":{"id":11},"after":[1],"before":null}`)),
		msg("q", 1, 1, envelope(fkEvent("c", "public.orders", 20, 0), published, fkEvent("c", "public.items", 20, 20),
			fkEvent("c", "public.items", 21, 999), fkEvent("c", "public.items", 22, 20))),
		msg("q", 2, 1, envelope(fkEvent("c", "public.orders", 30, 0), fkEvent("u", "public.items", 3, 30))),
	)
	want := []Outcome{Failed, Failed, Applied}
	for i, o := range want {
		if res.Outcomes[i] != o {
			t.Fatalf("outcomes %v, want %v (errs %v)", res.Outcomes, want, res.Errs)
		}
	}
	if err := res.Errs[0]; !errcode.Is(err, errcode.BadPayload) || !strings.Contains(err.Error(), "envelope event 1") {
		t.Errorf("the unreadable event: %v, want bad_payload naming envelope event 1", err)
	}
	if err := res.Errs[1]; !strings.Contains(err.Error(), "23503") || !strings.Contains(err.Error(), "envelope event 3:") {
		t.Errorf("the refused event: %v, want a foreign key violation naming envelope event 3", err)
	}
	if got := state(); got != "2,30/3:30" {
		t.Fatalf("after the failed envelopes: %s (none of their events may be written)", got)
	}

	// A sink of one table.
	f.exec(t, `CREATE TABLE env.single (id int PRIMARY KEY, v text)`)
	one := f.applier(t, Config{Mode: ModeCDC, Table: "env.single"})
	ev := func(op string, id int, v string) string {
		return fmt.Sprintf(`{"op":%q,"table":"public.single","key":{"id":%d},"after":{"id":%d,"v":%q},"before":null}`, op, id, id, v)
	}
	res = write(t, one, msg("s", 0, 1, envelope(ev("c", 1, "a"), ev("c", 2, "b"), ev("u", 1, "c"),
		`{"op":"d","table":"public.single","key":{"id":2},"after":null,"before":null}`)),
		msg("s", 0, 2, envelope()))
	if res.Applied != 2 {
		t.Fatalf("one table: %v", res.Errs)
	}
	if got := f.one(t, `SELECT string_agg(id || ':' || v, ',') FROM env.single`); got != "1:c" {
		t.Errorf("one table: %s", got)
	}
	res = write(t, one, msg("s", 0, 3, `{"op":"x","id":"pg:1","events":{"op":"c"}}`),
		msg("s", 1, 1, envelope(envelope(ev("c", 5, "nested")))))
	if res.Failed != 2 || !errcode.Is(res.Errs[0], errcode.BadPayload) || !strings.Contains(res.Errs[1].Error(), "inside an envelope") {
		t.Errorf("bad envelopes: %v", res.Errs)
	}
}
