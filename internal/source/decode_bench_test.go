package source

import (
	"context"
	"encoding/binary"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/pgrelay/pgrelay/internal/convert"
	"github.com/pgrelay/pgrelay/internal/pointer"
)

// benchWAL is the pgoutput stream of n transactions of txRows inserts into the bench table
// bench(id bigint, v text, n numeric, ts timestamptz) of BenchmarkSourceTx1000, each message
// framed as XLogData the way the walsender sends it.
func benchWAL(n, txRows int) [][]byte {
	xlog := func(body []byte) []byte {
		b := append([]byte{pglogrepl.XLogDataByteID}, make([]byte, 24)...)
		return append(b, body...)
	}
	u32 := func(b []byte, v uint32) []byte { return binary.BigEndian.AppendUint32(b, v) }
	u64 := func(b []byte, v uint64) []byte { return binary.BigEndian.AppendUint64(b, v) }
	rel := []byte{'R'}
	rel = u32(rel, 7)
	rel = append(rel, "public\x00bench\x00d"...)
	rel = binary.BigEndian.AppendUint16(rel, 4)
	for _, c := range []struct {
		name string
		oid  uint32
	}{{"id", 20}, {"v", 25}, {"n", 1700}, {"ts", 1184}} {
		rel = append(rel, 0)
		rel = append(rel, c.name...)
		rel = append(rel, 0)
		rel = u32(rel, c.oid)
		rel = u32(rel, 0xffffffff)
	}
	out := [][]byte{xlog(rel)}
	commitTime := uint64(time.Date(2026, 10, 3, 6, 14, 39, 0, time.UTC).Sub(time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)).Microseconds())
	id := 0
	for t := 0; t < n; t++ {
		lsn := uint64(0x10000000 + t*0x10000)
		begin := u64([]byte{'B'}, lsn)
		begin = u64(begin, commitTime)
		out = append(out, xlog(u32(begin, uint32(1000+t))))
		for r := 0; r < txRows; r++ {
			ins := u32([]byte{'I'}, 7)
			ins = append(ins, 'N')
			ins = binary.BigEndian.AppendUint16(ins, 4)
			for _, v := range []string{strconv.Itoa(id), "value " + strconv.Itoa(id), strconv.FormatFloat(float64(id)*1.5, 'f', -1, 64),
				"2026-10-03 06:14:39.365472+00"} {
				ins = append(ins, 't')
				ins = u32(ins, uint32(len(v)))
				ins = append(ins, v...)
			}
			out = append(out, xlog(ins))
			id++
		}
		commit := u64([]byte{'C', 0}, lsn)
		commit = u64(commit, lsn+0x100)
		out = append(out, xlog(u64(commit, commitTime)))
	}
	return out
}

// BenchmarkDecodeTx1000 runs the source's part of a streamed change without servers: 1,000-row
// transactions of the bench table from pgoutput bytes through the decoder and the item queue into
// batches. One op is one change.
func BenchmarkDecodeTx1000(b *testing.B) { benchDecodeTx1000(b, nil) }

// BenchmarkDecodeTx1000Envelope is BenchmarkDecodeTx1000 with the bench table's queue enveloped:
// each transaction becomes one message holding its 1,000 events.
func BenchmarkDecodeTx1000Envelope(b *testing.B) {
	benchDecodeTx1000(b, &EnvelopeQueue{Queue: "q", Partition: "all", MaxEvents: DefaultEnvelopeEvents, MaxBytes: DefaultEnvelopeBytes})
}

func benchDecodeTx1000(b *testing.B, env *EnvelopeQueue) {
	const txRows = 1000
	wal := benchWAL(1, txRows)
	ss := testSession(txRows, pointer.New(1, "e", "s", "x", 0x100))
	ss.src.keys = Keys{Lease: "lease", Pointer: "ptr"}
	ss.src.cfg.MaxBundleBytes = 8 << 20
	ss.q = newItemQueue(txRows, 8<<20)
	reg := convert.NewRegistry()
	dec := &decoder{epoch: "e", start: ss.plan, reg: reg, rels: map[uint32]*relation{},
		tables:   map[string]*TableInfo{"public.bench": {Table: Table{Schema: "public", Name: "bench", Queue: "q", Mode: PartitionByKey}, Key: []string{"id"}}},
		loadType: func(context.Context, []uint32) error { return nil }, maxMessages: txRows, maxBytes: 8 << 20}
	want := txRows // messages per transaction
	if env != nil {
		dec.envs, want = newEnvelopes(&Config{Envelopes: []EnvelopeQueue{*env}}), 1
	}
	emit := func(it item) error {
		if ok, _ := ss.q.tryPush(it); !ok {
			b.Fatal("queue full")
		}
		return nil
	}
	position := func(pglogrepl.LSN) error { return nil }
	var last time.Time
	if err := ss.copyData(wal[0], dec, emit, position, &last); err != nil {
		b.Fatal(err)
	}
	wal = wal[1:]
	b.ReportAllocs()
	b.ResetTimer()
	for done := 0; done < b.N; done += txRows {
		// every round replays the same transaction at a new commit LSN
		lsn := pglogrepl.LSN(0x10000000 + done)
		binary.BigEndian.PutUint64(wal[0][26:], uint64(lsn))
		binary.BigEndian.PutUint64(wal[len(wal)-1][27:], uint64(lsn))
		for _, m := range wal {
			if err := ss.copyData(m, dec, emit, position, &last); err != nil {
				b.Fatal(err)
			}
		}
		batch, _, err := ss.bundle(context.Background())
		if err != nil || batch == nil || len(batch.Events) != want {
			b.Fatalf("batch %v, %v", batch, err)
		}
		ss.acked(batch)
	}
}
