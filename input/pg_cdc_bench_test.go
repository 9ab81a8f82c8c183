package input

import (
	"context"
	"fmt"
	"strconv"
	"testing"

	"github.com/jackc/pglogrepl"

	"github.com/pgrelay/pgrelay/internal/pointer"
	"github.com/pgrelay/pgrelay/internal/source"
)

// benchBatch is a source batch of n inserts into the bench table of BenchmarkSourceTx1000, as the
// decoder makes them.
func benchBatch(n int) *source.Batch {
	const commit = pglogrepl.LSN(0x10000000)
	cover := pointer.New(1, "e", "s", "x", commit)
	b := &source.Batch{Events: make([]source.Event, n), Cover: cover, CoverJSON: []byte(`{"pos":"` + cover.Position() + `"}`),
		LeaseKey: "pgrelay:{q}:src:s:lease", Fence: "me|1", PointerKey: "pgrelay:{q}:src:s:ptr"}
	tx := pointer.TxID("e", commit)
	for i := range b.Events {
		id := strconv.Itoa(100000 + i)
		b.Events[i] = source.Event{Queue: "q", Partition: id, ID: pointer.MessageID("e", commit, uint64(i), 0), Tx: tx,
			Op: "c", Table: "public.bench", LSN: commit.String(), Xid: 1000, CreatedMs: 1790000000000,
			Payload: []byte(`{"op":"c","table":"public.bench","key":{"id":` + id + `},"after":{"id":` + id + `,"v":"value ` + id +
				`","n":150000.5,"ts":"2026-10-03T06:14:39.365472+00:00"},"before":null,"lsn":"0/10000000","xid":1000,"ts":"2026-10-03T06:14:39.000000Z","seq":` +
				strconv.Itoa(i) + `}`)}
	}
	return b
}

// BenchmarkToMessages turns 1,000-event source batches into Benthos messages, with their metadata
// and without (metadata: false); one op is one event.
func BenchmarkToMessages(b *testing.B) {
	for _, meta := range []bool{true, false} {
		b.Run(fmt.Sprintf("metadata=%v", meta), func(b *testing.B) {
			batch := benchBatch(1000)
			b.ReportAllocs()
			b.ResetTimer()
			for done := 0; done < b.N; done += len(batch.Events) {
				if msgs := toMessages(context.Background(), batch, meta); len(msgs) != len(batch.Events) {
					b.Fatal(len(msgs))
				}
			}
		})
	}
}
