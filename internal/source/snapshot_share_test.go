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
		view  queueView
		want  bool
	}{
		{"nothing in flight", share{}, queueView{}, true},
		{"stream keeping up: the previous chunk not handed over yet", share{inFlight: 1, unhanded: 1}, queueView{}, false},
		{"stream keeping up: the previous chunk's parts still queued", share{}, queueView{chunkQueued: true}, false},
		{"stream behind: reads ahead", share{inFlight: 3, unhanded: 3, moved: 10, owed: 10}, queueView{behind: true}, true},
		{"stream behind: owed its share", share{inFlight: 1, unhanded: 1, moved: 9, owed: 10}, queueView{behind: true}, false},
		{"stream behind: at most chunksInFlight", share{inFlight: chunksInFlight, unhanded: chunksInFlight}, queueView{behind: true}, false},
		{"stream behind: a chunk part queued does not matter", share{inFlight: 1, unhanded: 1}, queueView{behind: true, chunkQueued: true}, true},
		{"bytes in flight", share{inFlight: 1, unhanded: 1, inFlightBytes: chunkBytesInFlight}, queueView{behind: true}, false},
	}
	for _, c := range cases {
		if got := c.share.mayStart(c.view); got != c.want {
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
	sn.prepare(p, &snapshot.Chunk{Rows: rows, LastKey: []string{string(rows[4][0])}, Snapshot: snapshot.Snapshot{Xmin: 10, Xmax: 10},
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
// comes here). While the stream keeps up, the next chunk goes once the bundler took the previous
// one's parts; while it is behind (a full bundle of changes queued), chunks are read ahead, each
// once the stream moved as many bytes as the last chunk had.
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
	mayRead := func() bool { ok, _ := sn.mayRead("public.t"); return ok }

	// Keeping up: a few stream changes are always queued.
	pushStream(t, ss, &lsn, 3)
	if !mayRead() {
		t.Fatal("the first chunk waits while stream changes are queued")
	}
	p := sn.open(table, cur)
	readFake(sn, p, lsn+1)
	if mayRead() {
		t.Fatal("a second chunk may be read before the first reached the queue")
	}
	pushStream(t, ss, &lsn, 2) // committed before the high watermark
	sn.lowWatermark(p.id)
	if handled, err := sn.highWatermark(p.id, lsn+1, emit); !handled || err != nil {
		t.Fatalf("high watermark: %v %v", handled, err)
	}
	pushStream(t, ss, &lsn, 1) // after it
	if mayRead() {
		t.Fatal("the next chunk may be read while the previous one's parts wait in the queue")
	}
	last := -1
	for i, it := range mustItems(ss) { // the bundler takes everything up to the chunk's last part
		if it.kind == itemChunk {
			last = i
		}
	}
	ss.q.pop(last + 1)
	if ok, _ := ss.q.any(func(it *item) bool { return it.kind == itemChange }); !ok {
		t.Fatal("the test lost its stream changes")
	}
	if !mayRead() {
		t.Fatal("with the previous chunk taken, the next waits for a quiet stream")
	}

	// Behind: a full bundle of stream changes stays queued throughout.
	ss.q.pop(len(mustItems(ss)))
	pushStream(t, ss, &lsn, 10)
	cur = p.next
	for i := range chunksInFlight {
		if i > 0 {
			if mayRead() {
				t.Fatalf("chunk %d goes before the stream moved its share", i+1)
			}
			for sn.share.moved < sn.share.owed { // the reader passes stream changes; the queue stays full
				ss.q.pop(2)
				pushStream(t, ss, &lsn, 1)
			}
		}
		if !mayRead() {
			t.Fatalf("chunk %d of %d ahead of the stream may not be read", i+1, chunksInFlight)
		}
		q := sn.open(table, cur)
		readFake(sn, q, 0) // rendered again at the real high watermark
		cur = q.next
	}
	if mayRead() {
		t.Fatalf("more than %d chunks read ahead of the stream", chunksInFlight)
	}
	if got := sn.share.inFlight; got != chunksInFlight {
		t.Fatalf("%d chunks in flight, want %d", got, chunksInFlight)
	}
	if sn.share.owed == 0 {
		t.Error("the stream is owed nothing for the last chunk")
	}
}

func mustItems(ss *session) []item {
	items, _ := ss.q.snapshot()
	return items
}
