package queue

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"

	"github.com/pgrelay/pgrelay/internal/convert"
)

// checkEntries holds what EntriesOf promises for any entry, whoever wrote it: at least one
// message, each with the entry's id, Index its place and Count their number, and their payloads,
// one after another, exactly the entry's d (a layout-3 entry cut by its lengths, any other whole).
func checkEntries(t *testing.T, x redis.XMessage, d string) []Entry {
	t.Helper()
	es := EntriesOf(nil, x)
	if len(es) == 0 {
		t.Fatalf("%q: no message", x.Values)
	}
	var all []byte
	for i, e := range es {
		if e.ID != x.ID || e.Index != i || e.Count != len(es) {
			t.Fatalf("%q: message %d has id %q, index %d, count %d of %d", x.Values, i, e.ID, e.Index, e.Count, len(es))
		}
		all = append(all, e.Payload...)
	}
	if string(all) != d {
		t.Fatalf("%q: payloads %q, want d %q", x.Values, all, d)
	}
	return es
}

// FuzzEntriesOf reads entries a foreign producer may have written: any m and d (and the same
// text in a layout-1 entry's fields) give messages as checkEntries says, never a panic or a payload
// byte lost or made up. An m that does parse as a layout-3 array whose lengths add up to d gives
// one message per element.
func FuzzEntriesOf(f *testing.F) {
	for _, seed := range []struct{ m, d string }{
		{`[{"off":7,"len":3,"p":"a","id":"m1","tx":"t","ts":12,"h":{"k":1}},{"off":8,"len":0,"p":"b"},{"off":9,"len":2}]`, "xyzé"},
		{`{"off":7,"p":"a\"b\u00e9","id":"m1","tx":"t","ts":12,"h":{"k":[1,2]}}`, "x"},
		{` [ { "len" : 1, "off": 4 } ] `, "x"},
		{`[{"off":7,"len":1},{"off":8,"len":1}]`, "xyz"},
		{`[{"off":7,"len":2},{"off":8,"len":2}]`, "xyz"},
		{`[{"len":-1},{"len":2}]`, "x"},
		{`[{"len":100}]`, "x"},
		{`[{"len":99999999999999999999}]`, "x"},
		{`[{"len":1,"len":0}]`, ""},
		{`[{"p":"\ud83d","len":1}]`, "x"},
		{"[{\"p\":\"\xff\",\"len\":1}]", "x"},
		{`[]`, ""},
		{`[{"off":7,"len":1}`, "x"},
		{`[1,{"len":1}]`, "x"},
		{`[{"h":"x","len":0}]`, ""},
		{`off=7`, "x"},
		{"", ""},
	} {
		f.Add(seed.m, seed.d)
	}
	f.Fuzz(func(t *testing.T, m, d string) {
		es := checkEntries(t, redis.XMessage{ID: "1-1", Values: map[string]any{FieldMeta: m, FieldPayload: d}}, d)
		if len(es) > 1 && !isPacked(m) {
			t.Fatalf("%q: %d messages from an m that is not an array", m, len(es))
		}
		checkEntries(t, redis.XMessage{ID: "2-1", Values: map[string]any{
			FieldOffset: m, FieldPartition: m, FieldID: d, FieldTx: m, FieldCreated: d, FieldHeader: m, FieldPayload: d,
		}}, d)
	})
}

// FuzzEntriesRoundTrip writes one to four messages as the queue writer packs a layout-3 entry
// (metaEncoder.appendPacked, the payloads one after another in d) and reads them back with
// EntriesOf: every field comes back as written. Strings are cut from the fuzzed text at its
// separators; text that is not UTF-8 is left out (the encoder writes such a byte as U+FFFD, as
// DESIGN §2 says).
func FuzzEntriesRoundTrip(f *testing.F) {
	f.Add("public.t:{\"id\":1}|pg:1:0/16B3748:0|0/16B3748", "{\"id\":1,\"v\":\"x\"}|é||\x00", int64(1733000000000), int64(7), uint8(3), true)
	f.Add("a\\b\"c\u2028|id|", "", int64(-1), int64(0), uint8(0), false)
	f.Add("||", "x|y", int64(0), int64(1<<62), uint8(255), true)
	f.Fuzz(func(t *testing.T, keys, payloads string, ts, off int64, n uint8, header bool) {
		if !utf8.ValidString(keys) {
			return
		}
		k := strings.Split(keys, "|")
		key := func(i int) string { return k[i%len(k)] }
		ps := strings.Split(payloads, "|")
		count := int(n)%4 + 1
		msgs := make([]Message, count)
		var meta, d []byte
		var enc metaEncoder
		meta = append(meta, '[')
		for i := range msgs {
			msgs[i] = Message{Partition: key(3 * i), ID: key(3*i + 1), Tx: key(3*i + 2), CreatedMs: ts + int64(i/2), Payload: []byte(ps[i%len(ps)])}
			if header {
				msgs[i].Header = convert.AppendString([]byte(`{"k":`), []byte(key(i)))
				msgs[i].Header = append(msgs[i].Header, '}')
			}
			if i > 0 {
				meta = append(meta, ',')
			}
			meta = enc.appendPacked(meta, off+int64(i), &msgs[i])
			d = append(d, msgs[i].Payload...)
		}
		meta = append(meta, ']')
		es := checkEntries(t, redis.XMessage{ID: "1-2", Values: map[string]any{FieldMeta: string(meta), FieldPayload: string(d)}}, string(d))
		if len(es) != count {
			t.Fatalf("m %s: %d messages, want %d", meta, len(es), count)
		}
		for i, e := range es {
			w := msgs[i]
			if e.Offset != off+int64(i) || e.Partition != w.Partition || e.MessageID != w.ID || e.Tx != w.Tx ||
				e.CreatedMs != w.CreatedMs || !bytes.Equal(e.Header, w.Header) || !bytes.Equal(e.Payload, w.Payload) {
				t.Fatalf("m %s: message %d reads %+v, wrote %s", meta, i, e, fmt.Sprintf("%+v", w))
			}
		}
	})
}
