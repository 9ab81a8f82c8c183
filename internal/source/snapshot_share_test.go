package source

import (
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/pgrelay/pgrelay/internal/pointer"
	"github.com/pgrelay/pgrelay/internal/snapshot"
)

func TestShareRule(t *testing.T) {
	cases := []struct {
		name  string
		share share
		want  bool
	}{
		{"nothing in flight", share{}, true},
		{"pipeline: the next chunk while the previous one is read ahead", share{inFlight: 1, unhanded: 1, owed: 10}, true},
		{"pipeline: the next chunk while the output writes the previous one", share{unwritten: []uint64{3}, owed: 10}, true},
		{"pipeline full: a quiet stream earns nothing", share{inFlight: chunksAhead - 1, unhanded: chunksAhead - 1, unwritten: []uint64{3}, owed: 10}, false},
		{"pipeline: one place left", share{inFlight: chunksAhead - 2, unhanded: chunksAhead - 2, unwritten: []uint64{3}, owed: 10}, true},
		{"pipeline full: the stream moved half the last chunk", share{inFlight: chunksAhead + 1, unhanded: chunksAhead + 1, moved: 5, owed: 10}, true},
		{"pipeline full: the stream moved less than half", share{inFlight: chunksAhead + 1, unhanded: chunksAhead + 1, moved: 4, owed: 10}, false},
		{"at most chunksInFlight", share{inFlight: chunksInFlight, unhanded: chunksInFlight, moved: 100, owed: 10}, false},
		{"bytes in flight", share{inFlight: 1, unhanded: 1, inFlightBytes: chunkBytesInFlight}, false},
		{"bytes in flight, none past its watermark", share{unwritten: []uint64{3}, inFlightBytes: chunkBytesInFlight}, true},
	}
	for _, c := range cases {
		if got := c.share.mayStart(); got != c.want {
			t.Errorf("%s: mayStart = %v, want %v", c.name, got, c.want)
		}
	}
}

// shareSession is a session whose item queue holds maxEvents-event bundles, with a snapshotter of
// public.t.
func shareSession(t *testing.T, maxEvents int) (*session, *snapshotter) {
	ss := testSession(maxEvents, pointer.New(1, "e", "s", "x", 100))
	ss.q = newItemQueue(maxEvents, 1<<20)
	ss.src.cfg.ChunkRows = 5
	ss.src.log = testLogger{t}
	sn := &snapshotter{ss: ss, epoch: "e", life: "l", active: "public.t", turn: make(chan struct{}, 1), ackSignal: make(chan struct{}, 1)}
	ss.snap = sn
	return ss, sn
}

// readFake stands for the round trip of p: five rows read, the high watermark at hw; it returns
// once the rows are rendered.
func readFake(sn *snapshotter, p *pendingChunk, hw pglogrepl.LSN) {
	rows := [][][]byte{}
	for i := range 5 {
		id := fmt.Sprint(int(p.cursor.Rows) + i + 1)
		rows = append(rows, [][]byte{[]byte(id), []byte("big" + id), []byte("7")})
	}
	sn.prepare(p, &snapshot.Chunk{Rows: rowsOf(rows), LastKey: []string{string(rows[4][0])}, Limit: 5, Snapshot: snapshot.Snapshot{Xmin: 10, Xmax: 10},
		ReadAt: time.Unix(0, 0).UTC()}, hw)
	<-p.ready
}

// pushStream hands n one-event stream transactions to the queue the way the WAL reader does
// (the snapshotter observes each item first).
func pushStream(t *testing.T, ss *session, lsn *pglogrepl.LSN, n int) {
	t.Helper()
	for range n {
		*lsn += 0x10
		for _, it := range []item{change(*lsn, 0, 1), commitItem(*lsn)} {
			ss.snap.observe(it)
			if ok, _ := ss.q.tryPush(it); !ok {
				t.Fatal("queue full")
			}
		}
	}
}

// TestChunksGoWhileTheStreamIsNeverQuiet drives the snapshot's share with an item queue that
// always holds stream changes, and no clock: a chunk never waits for a quiet stream (which never
// comes here). chunksAhead chunks go at once (each read while the ones before wait for their high
// watermarks and the output); one more once the first is written (its part acknowledged). Then a
// backlog: the reader passes stream changes and reaches no high watermark, and each further chunk
// goes as soon as the stream moved half the last chunk's bytes, up to chunksInFlight chunks.
func TestChunksGoWhileTheStreamIsNeverQuiet(t *testing.T) {
	ss, sn := shareSession(t, 10)
	table := testTable()
	cur, _ := snapshot.Start([]string{"public.t"})
	lsn := pglogrepl.LSN(0x1000)
	emit := func(it item) error {
		if ok, _ := ss.q.tryPush(it); !ok {
			return fmt.Errorf("queue full")
		}
		return nil
	}
	mayRead := func() bool { return sn.mayRead("public.t") }
	start := func() *pendingChunk {
		t.Helper()
		if !mayRead() {
			t.Fatalf("chunk %d may not be read", sn.n+1)
		}
		p := sn.open(table, cur)
		lsn++
		readFake(sn, p, lsn)
		cur = p.next
		return p
	}
	signalled := func() bool {
		select {
		case <-sn.turn:
			return true
		default:
			return false
		}
	}

	pushStream(t, ss, &lsn, 3) // stream changes are always queued from here on
	var ahead []*pendingChunk
	for range chunksAhead {
		ahead = append(ahead, start())
	}
	if mayRead() {
		t.Fatalf("chunk %d may be read before the first is written, the stream having moved nothing", chunksAhead+1)
	}
	for _, p := range ahead {
		sn.lowWatermark(p.id)
	}
	first := ahead[0]
	if handled, err := sn.highWatermark(first.id, first.hwAt, emit); !handled || err != nil {
		t.Fatalf("high watermark: %v %v", handled, err)
	}
	pushStream(t, ss, &lsn, 1)
	if mayRead() {
		t.Fatalf("chunk %d may be read before the first is written", chunksAhead+1)
	}
	signalled()
	ss.q.pop(len(mustItems(ss))) // the bundler takes it all, the output writes it
	pushStream(t, ss, &lsn, 3)
	sn.ackedCover(sn.pushed.Load())
	if !signalled() {
		t.Error("the written chunk does not wake the snapshot")
	}
	start()

	// A backlog: the reader passes stream changes only; the queue never empties.
	for sn.share.inFlight < chunksInFlight {
		owed, moved := sn.share.owed, 0
		if owed == 0 {
			t.Fatal("the stream owes nothing for the last chunk")
		}
		for !mayRead() {
			if moved*snapshotWeight >= owed {
				t.Fatalf("chunk %d waits although the stream moved %d of the %d bytes owed at %d:1", sn.n+1, moved, owed, snapshotWeight)
			}
			signalled()
			ss.q.pop(2)
			before := sn.share.moved
			pushStream(t, ss, &lsn, 1)
			moved += sn.share.moved - before
			if mayRead() && !signalled() {
				t.Fatal("the stream bytes that earned a chunk do not wake the snapshot")
			}
		}
		if moved*snapshotWeight < owed {
			t.Fatalf("chunk %d goes after the stream moved %d bytes, under 1/%d of the %d owed", sn.n+1, moved, snapshotWeight, owed)
		}
		start()
	}
	for range 5 {
		ss.q.pop(2)
		pushStream(t, ss, &lsn, 1)
	}
	if mayRead() {
		t.Fatalf("more than %d chunks read ahead of the reader", chunksInFlight)
	}
}

func mustItems(ss *session) []item {
	items, _ := ss.q.peek()
	return items
}

// TestAbandonedChunk: a chunk whose read failed before its snapshot (its table renamed away) is
// forgotten: its low watermark passes as an unknown chunk's, the next chunk's high watermark is
// the first pending one's, and the share counts the abandoned chunk neither in flight nor
// unhanded, so the pipeline's chunksAhead stay open to the chunks read after it.
func TestAbandonedChunk(t *testing.T) {
	ss, sn := shareSession(t, 10)
	table := testTable()
	cur, _ := snapshot.Start([]string{"public.t"})
	emit := func(it item) error {
		if ok, _ := ss.q.tryPush(it); !ok {
			return fmt.Errorf("queue full")
		}
		return nil
	}
	for range 2 * chunksAhead { // more abandoned chunks than the pipeline holds
		gone := sn.open(table, cur)
		sn.lowWatermark(gone.id)
		sn.abandon(gone)
		sn.lowWatermark(gone.id)
	}
	if sn.share.inFlight != 0 || sn.share.unhanded != 0 || !sn.mayRead("public.t") {
		t.Fatalf("after abandoned chunks: %+v, may read %v", sn.share, sn.mayRead("public.t"))
	}
	p := sn.open(table, cur)
	sn.lowWatermark(p.id)
	readFake(sn, p, 0x2000)
	if handled, err := sn.highWatermark(p.id, p.hwAt, emit); !handled || err != nil {
		t.Fatalf("the chunk after the abandoned ones: high watermark %v %v", handled, err)
	}
	if n := len(mustItems(ss)); n == 0 {
		t.Fatal("the chunk after the abandoned ones is not in the queue")
	}
}
