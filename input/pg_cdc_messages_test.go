package input

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"testing"

	"github.com/pgrelay/pgrelay/internal/queue"
)

// TestToMessagesMetadata: every message of a pg_cdc batch carries the documented metadata as
// strings, and no more than eight keys (a ninth makes every message's map grow into a table); its
// payload is the event's and its context carries the batch's cover; messages do not share metadata.
func TestToMessagesMetadata(t *testing.T) {
	b := benchBatch(3)
	b.Events[2].Op, b.Events[2].Table, b.Events[2].CreatedMs = "u", "public.other", 1790000000001
	msgs := toMessages(context.Background(), b, true)
	if len(msgs) != len(b.Events) {
		t.Fatalf("%d messages for %d events", len(msgs), len(b.Events))
	}
	for i, m := range msgs {
		e := b.Events[i]
		want := map[string]any{"queue": e.Queue, "partition": e.Partition, "message_id": e.ID, "transaction_id": e.Tx,
			"op": e.Op, "table": e.Table, "lsn": e.LSN, "created_at": fmt.Sprint(e.CreatedMs)}
		got := map[string]any{}
		_ = m.MetaWalkMut(func(k string, v any) error { got[k] = v; return nil })
		if !maps.Equal(got, want) {
			t.Errorf("message %d metadata %v, want %v", i, got, want)
		}
		if len(got) > 8 {
			t.Errorf("message %d has %d metadata keys, want at most 8", i, len(got))
		}
		if p, _ := m.AsBytes(); !bytes.Equal(p, e.Payload) {
			t.Errorf("message %d payload %s, want %s", i, p, e.Payload)
		}
		sb := queue.SourceBatchOf(m.Context())
		if sb == nil || string(sb.Cover.Pointer) != string(b.CoverJSON) || sb.Cover.Fence != b.Fence || sb.Cover.LeaseKey != b.LeaseKey ||
			sb.Cover.PointerKey != b.PointerKey || sb.Cover.Pos != b.Cover.Position() {
			t.Errorf("message %d carries source batch %+v", i, sb)
		}
		if sb != nil && sb.Keys != nil {
			t.Errorf("message %d: keys in the batch while the messages carry metadata", i)
		}
	}
	msgs[0].MetaSetMut("partition", "changed")
	if p, _ := msgs[1].MetaGet("partition"); p != b.Events[1].Partition {
		t.Errorf("changing message 0's metadata changed message 1's partition to %q", p)
	}
}

// TestToMessagesWithoutMetadata: with metadata: false the messages carry no metadata at all, the
// event's payload, and the batch's cover with its keys, which give each message's queue,
// partition, id and transaction by its place.
func TestToMessagesWithoutMetadata(t *testing.T) {
	b := benchBatch(3)
	b.Events[1].Queue, b.Events[2].Tx = "other", "pg:e:0000000000000002"
	msgs := toMessages(context.Background(), b, false)
	if len(msgs) != len(b.Events) {
		t.Fatalf("%d messages for %d events", len(msgs), len(b.Events))
	}
	for i, m := range msgs {
		e := b.Events[i]
		n := 0
		_ = m.MetaWalkMut(func(string, any) error { n++; return nil })
		if n != 0 {
			t.Errorf("message %d has %d metadata keys, want none", i, n)
		}
		if p, _ := m.AsBytes(); !bytes.Equal(p, e.Payload) {
			t.Errorf("message %d payload %s, want %s", i, p, e.Payload)
		}
		sb := queue.SourceBatchOf(m.Context())
		if sb == nil || sb.Keys == nil || sb.Keys.Len() != len(b.Events) || sb.Cover.Pos != b.Cover.Position() {
			t.Fatalf("message %d carries source batch %+v", i, sb)
		}
		q, p, id, tx := sb.Keys.Keys(i)
		if q != e.Queue || p != e.Partition || id != e.ID || tx != e.Tx {
			t.Errorf("message %d keys %q %q %q %q, want %q %q %q %q", i, q, p, id, tx, e.Queue, e.Partition, e.ID, e.Tx)
		}
	}
}
