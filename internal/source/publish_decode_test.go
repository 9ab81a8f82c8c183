package source

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pglogrepl"

	"github.com/pgrelay/pgrelay/internal/event"
	"github.com/pgrelay/pgrelay/internal/jsonscan"
	"github.com/pgrelay/pgrelay/internal/partition"
	"github.com/pgrelay/pgrelay/internal/pointer"
)

// publishedRef is parsePublished's reference: encoding/json reads the content as one UTF-8 JSON
// object member by member, keys matched exactly, the last of a repeated key winning, a queue or
// partition that is not a string (partition: or null) refusing the whole content.
func publishedRef(b []byte) (m publishedMessage, ok bool) {
	if !utf8.Valid(b) || json.Unmarshal(b, new(map[string]json.RawMessage)) != nil {
		return m, false
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	if tok, err := d.Token(); err != nil || tok != json.Delim('{') {
		return m, false
	}
	for d.More() {
		key, err := d.Token()
		var v json.RawMessage
		if err != nil || d.Decode(&v) != nil {
			return m, false
		}
		var s string
		switch key {
		case "queue":
			if json.Unmarshal(v, &s) != nil || v[0] != '"' {
				return m, false
			}
			m.queue = []byte(s)
		case "partition":
			m.partition, m.partitioned = nil, false
			if string(v) != "null" {
				if json.Unmarshal(v, &s) != nil || v[0] != '"' {
					return m, false
				}
				m.partition, m.partitioned = []byte(s), true
			}
		case "payload":
			m.payload = v
		}
	}
	return m, len(m.queue) > 0 && len(m.payload) > 0
}

// FuzzParsePublished: the published message's fields read by parsePublished are those
// publishedRef (encoding/json) reads from the same content, and a content either refuses is
// refused by both. A user may emit any content under the prefix by hand; pg_cdc must neither
// panic nor read it otherwise than JSON says.
func FuzzParsePublished(f *testing.F) {
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
		`{"QUEUE":"q","Payload":1}`,      // keys match exactly
		" \t{\"queue\":\"q\",\"payload\":1}\n",
		`{"queue":"\ud83d","payload":1}`, // a lone surrogate: U+FFFD
		// refused
		`{"queue":"","payload":1}`, `{"payload":1}`, `{"queue":"q"}`, `{"queue":null,"payload":1}`,
		`{"queue":5,"payload":1}`, `{"queue":5,"queue":"q","payload":1}`, `{"queue":"q","payload":1,"partition":5}`,
		`{"queue":"q","payload":1,"partition":{}}`,
		`{"queue":"q","payload":{"a":}}`, `{"queue":"q","payload":1`, `{"queue":"q","payload":1} x`, `[1]`, `"s"`, ``,
		`{"queue":"q","payload":tru}`, `{"queue":"q\x","payload":1}`, "{\"queue\":\"q\",\"payload\":\"ctl\x01\"}",
		"{\"queue\":\"\xff\",\"payload\":1}",
	} {
		f.Add([]byte(c))
	}
	f.Fuzz(func(t *testing.T, c []byte) {
		got, ok := parsePublished(c)
		if len(c) > 2*jsonscan.MaxDepth && !ok {
			return // possibly deeper than the scanner reads; encoding/json reads deeper
		}
		want, wantOK := publishedRef(c)
		if ok != wantOK {
			t.Fatalf("%q: parsePublished ok %v, encoding/json %v", c, ok, wantOK)
		}
		if ok && (string(got.queue) != string(want.queue) || string(got.payload) != string(want.payload) ||
			got.partitioned != want.partitioned || string(got.partition) != string(want.partition)) {
			t.Fatalf("%q: parsePublished queue %q partition %q (%v) payload %s; encoding/json %q %q (%v) %s", c, got.queue,
				got.partition, got.partitioned, got.payload, want.queue, want.partition, want.partitioned, want.payload)
		}
	})
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

// pgoutput's bytes of a Begin, a Commit and a logical message (protocol version 1).
func beginBytes(final pglogrepl.LSN, ts time.Time, xid uint32) []byte {
	b := binary.BigEndian.AppendUint64([]byte{'B'}, uint64(final))
	b = binary.BigEndian.AppendUint64(b, uint64(ts.UnixMicro()-pgEpoch))
	return binary.BigEndian.AppendUint32(b, xid)
}

func commitBytes(commit pglogrepl.LSN, ts time.Time) []byte {
	b := binary.BigEndian.AppendUint64([]byte{'C', 0}, uint64(commit))
	b = binary.BigEndian.AppendUint64(b, uint64(commit)+16)
	return binary.BigEndian.AppendUint64(b, uint64(ts.UnixMicro()-pgEpoch))
}

func messageBytes(transactional bool, lsn pglogrepl.LSN, prefix, content string) []byte {
	flags := byte(0)
	if transactional {
		flags = 1
	}
	b := binary.BigEndian.AppendUint64([]byte{'M', flags}, uint64(lsn))
	b = append(append(b, prefix...), 0)
	b = binary.BigEndian.AppendUint32(b, uint32(len(content)))
	return append(b, content...)
}

// TestDecodeInPlaceAgreesWithPglogrepl: Begin, Commit and transactional logical messages read in
// place give the same items and event bytes as pglogrepl's parse of the same bytes, and
// parseMessage reads what pglogrepl reads (a message it cannot read goes to pglogrepl).
func TestDecodeInPlaceAgreesWithPglogrepl(t *testing.T) {
	ts := time.Date(2026, 10, 3, 6, 15, 3, 583036000, time.UTC)
	var stream [][]byte
	for i := range 3 {
		commit := pglogrepl.LSN(0x16B3748 + 0x100*i)
		stream = append(stream, beginBytes(commit, ts.Add(time.Duration(i)*time.Second), uint32(40+i)),
			messageBytes(true, commit-0x40, PublishPrefix, fmt.Sprintf(`{"queue": "pub", "payload": {"n": %d}, "partition": "p%d"}`, i, i)),
			messageBytes(true, commit-0x30, "other", `{"queue": "pub", "payload": 1}`),
			messageBytes(true, commit-0x20, PublishPrefix, `{"queue": "pub", "payload": [1, 2], "partition": null}`),
			commitBytes(commit, ts))
	}
	decodeAll := func(inPlace bool) []item {
		e := newEnvTest(t, pointer.Pointer{}, 1000)
		for _, b := range stream {
			var err error
			if inPlace {
				err = e.d.decode(context.Background(), b, e.emit)
			} else {
				var m pglogrepl.Message
				if m, err = pglogrepl.Parse(b); err == nil {
					err = e.d.handle(context.Background(), m, e.emit)
				}
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		return e.items
	}
	got, want := decodeAll(true), decodeAll(false)
	if len(got) != 9 || len(got) != len(want) {
		t.Fatalf("%d items in place, %d through pglogrepl (want 9)", len(got), len(want))
	}
	for i := range got {
		g, w := got[i], want[i]
		if g.kind != w.kind || g.commit != w.commit || g.seq != w.seq || len(g.events) != len(w.events) {
			t.Fatalf("item %d: %+v, through pglogrepl %+v", i, g, w)
		}
		for k := range g.events {
			ge, we := g.events[k], w.events[k]
			if ge.ID != we.ID || ge.Tx != we.Tx || ge.Partition != we.Partition || ge.CreatedMs != we.CreatedMs || string(ge.Payload) != string(we.Payload) {
				t.Errorf("item %d event %d: %+v %s, through pglogrepl %+v %s", i, k, ge, ge.Payload, we, we.Payload)
			}
		}
	}
	if !strings.Contains(string(got[0].events[0].Payload), `"ts":"2026-10-03T06:15:03.583036Z"`) {
		t.Errorf("event %s: commit time", got[0].events[0].Payload)
	}

	for _, b := range [][]byte{
		messageBytes(true, 0x1234, PublishPrefix, `{"x": 1}`), messageBytes(false, 0x10, "pgrelay_heartbeat", "e"),
		messageBytes(true, 0x10, "", ""), messageBytes(true, 0x10, "p", "c\x00d"),
	} {
		m, ok := parseMessage(b)
		p, err := pglogrepl.Parse(b)
		lm, _ := p.(*pglogrepl.LogicalDecodingMessage)
		if !ok || err != nil || lm == nil || m.transactional != lm.Transactional || m.lsn != lm.LSN || string(m.prefix) != lm.Prefix ||
			string(m.content) != string(lm.Content) {
			t.Errorf("%q: parseMessage %+v %v, pglogrepl %+v %v", b, m, ok, p, err)
		}
	}
	for _, b := range [][]byte{[]byte("M"), []byte("M\x01\x00\x00\x00\x00\x00\x00\x00\x10pfx"), append(messageBytes(true, 0x10, "p", "abc"), 'x'),
		messageBytes(true, 0x10, "p", "abc")[:15]} {
		if m, ok := parseMessage(b); ok {
			t.Errorf("%q: parseMessage read %+v", b, m)
		}
	}
}

// BenchmarkDecodePublishTx: one one-message transaction (Begin, a pgrelay.publish() message with
// a ~200-byte payload, Commit) from pgoutput's bytes to its queued items, read in place (what the
// stream does) and through pglogrepl's parse. One op is one transaction.
func BenchmarkDecodePublishTx(b *testing.B) {
	content := `{"queue": "pub", "payload": {"lines": [{"qty": 2, "sku": "SKU-17"}, {"qty": 1, "sku": "SKU-5"}], "total": "417.17", "order_id": 1234417, "customer": "customer-163", "placed_by": "web"}, "partition": "1234417"}`
	for _, inPlace := range []bool{true, false} {
		name := "in_place"
		if !inPlace {
			name = "pglogrepl"
		}
		b.Run(name, func(b *testing.B) {
			e := newEnvTest(b, pointer.Pointer{LSN: "0/1"}, 1000)
			sink := func(item) error { return nil }
			ctx := context.Background()
			now := time.Now()
			msgs := make([][]byte, 0, 3)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				commit := pglogrepl.LSN(0x1000000 + 0x100*i)
				msgs = append(msgs[:0], beginBytes(commit, now, uint32(i)), messageBytes(true, commit-0x40, PublishPrefix, content), commitBytes(commit, now))
				for _, m := range msgs {
					var err error
					if inPlace {
						err = e.d.decode(ctx, m, sink)
					} else {
						var pm pglogrepl.Message
						if pm, err = pglogrepl.Parse(m); err == nil {
							err = e.d.handle(ctx, pm, sink)
						}
					}
					if err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}
