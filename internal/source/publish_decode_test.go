package source

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/pgrelay/pgrelay/internal/event"
	"github.com/pgrelay/pgrelay/internal/partition"
	"github.com/pgrelay/pgrelay/internal/pointer"
)

// TestParsePublishedAgreesWithEncodingJSON: the published message's fields read by parsePublished
// are those encoding/json reads from the same content (with exact keys), and a content either
// rejects is rejected by both.
func TestParsePublishedAgreesWithEncodingJSON(t *testing.T) {
	for _, c := range []string{
		// as pgrelay.publish() writes them (jsonb's text: keys by length, a space after : and ,)
		`{"queue": "orders", "payload": {"id": 1, "lines": [{"sku": "a", "qty": 2}]}, "partition": "cust-7"}`,
		`{"queue": "orders", "payload": {"a": [1, 12345678901234567890]}, "partition": null}`,
		`{"queue": "orders", "payload": "alone", "partition": "p"}`,
		`{"queue": "orders", "payload": null, "partition": "p"}`,
		`{"queue": "q\"uoted\u00e9", "payload": [], "partition": "a\\b\nc"}`,
		`{"queue":"q","partition":"","payload":0}`,
		`{"payload":{"x":true},"queue":"q"}`,                         // no partition: the single one
		`{"queue":"q","payload":1,"partition":"a","partition":null}`, // the last of a repeated key
		`{"queue":"q","payload":1,"other":{"deep":[1,2,{"x":"y"}]}}`,
		`{"qu\u0065ue":"q","payload":1}`, // an escaped key
		" \t{\"queue\":\"q\",\"payload\":1}\n",
		// rejected
		`{"queue":"","payload":1}`, `{"payload":1}`, `{"queue":"q"}`, `{"queue":null,"payload":1}`,
		`{"queue":5,"payload":1}`, `{"queue":"q","payload":1,"partition":5}`, `{"queue":"q","payload":1,"partition":{}}`,
		`{"queue":"q","payload":{"a":}}`, `{"queue":"q","payload":1`, `{"queue":"q","payload":1} x`, `[1]`, `"s"`, ``,
		`{"queue":"q","payload":tru}`, `{"queue":"q\x","payload":1}`, "{\"queue\":\"q\",\"payload\":\"ctl\x01\"}",
	} {
		var want struct {
			Queue     string          `json:"queue"`
			Partition *string         `json:"partition"`
			Payload   json.RawMessage `json:"payload"`
		}
		wantOK := json.Unmarshal([]byte(c), &want) == nil && want.Queue != "" && len(want.Payload) > 0
		got, ok := parsePublished([]byte(c))
		if ok != wantOK {
			t.Errorf("%s: parsePublished ok %v, encoding/json %v", c, ok, wantOK)
			continue
		}
		if !ok {
			continue
		}
		if string(got.queue) != want.Queue || string(got.payload) != string(want.Payload) || got.partitioned != (want.Partition != nil) ||
			(want.Partition != nil && string(got.partition) != *want.Partition) {
			t.Errorf("%s: parsePublished queue %q partition %q (%v) payload %s; encoding/json %q %v %s", c, got.queue, got.partition,
				got.partitioned, got.payload, want.Queue, want.Partition, want.Payload)
		}
	}
}

// TestPublishedMessageEvents: the `m` events of published messages, read back as JSON: queue,
// partition (null or left out: the single one), id, and the payload in `after` byte for byte; a
// malformed message is counted and numbered like a change but sends nothing.
func TestPublishedMessageEvents(t *testing.T) {
	e := newEnvTest(t, pointer.Pointer{}, 1000)
	commit := pglogrepl.LSN(0x16B3748)
	e.handle(&pglogrepl.BeginMessage{FinalLSN: commit, Xid: 42, CommitTime: time.Date(2026, 10, 3, 6, 15, 3, 583036000, time.UTC)})
	for _, content := range []string{
		`{"queue": "pub", "payload": {"id": 1, "s": "x\"y"}, "partition": "cust-7"}`,
		`{"queue": "pub", "payload": [1, 2], "partition": null}`,
		`{"queue": "pub", "payload": not json, "partition": "p"}`,
		`{"queue": "other", "payload": "s", "partition": "a\"b"}`,
	} {
		e.handle(&pglogrepl.LogicalDecodingMessage{Transactional: true, Prefix: PublishPrefix, Content: []byte(content)})
	}
	e.handle(&pglogrepl.CommitMessage{CommitLSN: commit})
	type want struct{ queue, part, after string }
	wants := []want{{"pub", "cust-7", `{"id": 1, "s": "x\"y"}`}, {"pub", partition.Single, `[1, 2]`}, {}, {"other", `a"b`, `"s"`}}
	if len(e.items) != len(wants)+1 || e.items[len(wants)].kind != itemCommit {
		t.Fatalf("items %+v", e.items)
	}
	for i, w := range wants {
		it := e.items[i]
		if it.seq != uint64(i) {
			t.Errorf("message %d: seq %d", i, it.seq)
		}
		if w.queue == "" {
			if len(it.events) != 0 {
				t.Errorf("malformed message %d sent %+v", i, it.events)
			}
			continue
		}
		if len(it.events) != 1 {
			t.Fatalf("message %d: %d events", i, len(it.events))
		}
		ev := it.events[0]
		if ev.Queue != w.queue || ev.Partition != w.part || ev.Op != event.OpMessage || ev.Tx != e.d.txID || ev.Xid != 42 ||
			ev.ID != pointer.MessageID("0a1b2c3d", commit, uint64(i), 0) {
			t.Errorf("message %d: event %+v", i, ev)
		}
		var got struct {
			Op    string          `json:"op"`
			Table *string         `json:"table"`
			After json.RawMessage `json:"after"`
			LSN   string          `json:"lsn"`
			Xid   uint32          `json:"xid"`
			TS    string          `json:"ts"`
			Seq   uint64          `json:"seq"`
		}
		if err := json.Unmarshal(ev.Payload, &got); err != nil {
			t.Fatalf("message %d: %s: %v", i, ev.Payload, err)
		}
		if got.Op != "m" || got.Table != nil || string(got.After) != w.after || got.LSN != "0/16B3748" || got.Xid != 42 ||
			got.TS != "2026-10-03T06:15:03.583036Z" || got.Seq != uint64(i) {
			t.Errorf("message %d: %s", i, ev.Payload)
		}
	}
	if e.d.badMessages != 1 {
		t.Errorf("bad messages %d, want 1", e.d.badMessages)
	}
}

// BenchmarkDecodePublished: one pgrelay.publish() message (a ~200-byte payload, as jsonb prints
// it) from the logical message to its queued `m` event. One op is one message.
func BenchmarkDecodePublished(b *testing.B) {
	e := newEnvTest(b, pointer.Pointer{LSN: "0/1"}, 1000)
	content := []byte(`{"queue": "pub", "payload": {"lines": [{"qty": 2, "sku": "SKU-17"}, {"qty": 1, "sku": "SKU-5"}], "total": "417.17", "order_id": 1234417, "customer": "customer-163", "placed_by": "web"}, "partition": "1234417"}`)
	msg := &pglogrepl.LogicalDecodingMessage{Transactional: true, Prefix: PublishPrefix, Content: content}
	sink := func(item) error { return nil }
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if i%1000 == 0 {
			e.d.handle(ctx, &pglogrepl.BeginMessage{FinalLSN: pglogrepl.LSN(0x1000000 + i), Xid: 42, CommitTime: time.Now()}, sink)
		}
		if err := e.d.handle(ctx, msg, sink); err != nil {
			b.Fatal(err)
		}
	}
	if e.d.badMessages != 0 {
		b.Fatalf("%d bad messages", e.d.badMessages)
	}
}
