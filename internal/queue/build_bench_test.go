package queue

import (
	"context"
	"strconv"
	"testing"
)

// BenchmarkBuild lays out the script's keys and arguments for batches of 1,000 change events over
// 16 shards; one op is one message.
func BenchmarkBuild(b *testing.B) {
	w := NewWriter(nil, WriterConfig{Shards: 16})
	w.shards["q"] = 16
	msgs := make([]Message, 1000)
	for i := range msgs {
		msgs[i] = Message{Queue: "q", Partition: strconv.Itoa(100000 + i), ID: "pg:e:0000000010000000:" + strconv.Itoa(i),
			Tx: "pg:e:0000000010000000", CreatedMs: 1790000000000, Payload: make([]byte, 220)}
	}
	cover := &Cover{LeaseKey: "lease", Fence: "f", PointerKey: "ptr", Pointer: []byte(`{"pos":"1"}`), Pos: "1"}
	b.ReportAllocs()
	b.ResetTimer()
	for done := 0; done < b.N; done += len(msgs) {
		if _, _, err := w.build(context.Background(), msgs, cover, true); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkTxEncode plans and encodes the XADDs of a transaction (write_tx.go) for batches of
// 1,000 change events over 16 shards, in each layout version; one op is one message.
func BenchmarkTxEncode(b *testing.B) {
	for _, v := range []int{LayoutV1, LayoutV2} {
		b.Run("v"+strconv.Itoa(v), func(b *testing.B) { benchTxEncode(b, v) })
	}
}

func benchTxEncode(b *testing.B, version int) {
	w := NewWriter(nil, WriterConfig{Shards: 16})
	w.shards["q"] = 16
	msgs := make([]Message, 1000)
	for i := range msgs {
		msgs[i] = Message{Queue: "q", Partition: "public.bench:" + strconv.Itoa(100000+i), ID: "pg:e:0000000010000000:" + strconv.Itoa(i),
			Tx: "pg:e:0000000010000000", CreatedMs: 1790000000000, Payload: make([]byte, 220)}
	}
	var buf []byte
	b.ReportAllocs()
	b.ResetTimer()
	for done := 0; done < b.N; done += len(msgs) {
		if err := validate(msgs, &Cover{}); err != nil {
			b.Fatal(err)
		}
		p, err := w.plan(context.Background(), msgs)
		if err != nil {
			b.Fatal(err)
		}
		buf, _ = w.appendXAdds(buf[:0], p, msgs, make([]int64, len(p.streams)), []int{version})
	}
}
