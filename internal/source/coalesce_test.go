package source

import (
	"bufio"
	"context"
	"errors"
	"io"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgrelay/pgrelay/internal/pointer"
)

// chunks is a reader that returns its chunks one per Read (as a socket returns what has arrived).
type chunks [][]byte

func (c *chunks) Read(p []byte) (int, error) {
	if len(*c) == 0 {
		return 0, io.EOF
	}
	n := copy(p, (*c)[0])
	if n < len((*c)[0]) {
		(*c)[0] = (*c)[0][n:]
	} else {
		*c = (*c)[1:]
	}
	return n, nil
}

// TestReadCoalescerWaitsOnlyBehindAfterADrainedRead: a read waits before it goes only while the
// stream is behind or under load and the previous read returned less than it asked for (the
// socket was drained); a full read, or a stream that keeps up, never waits. With a session's
// turns, the wait under load (not behind) is the wait for the reader's turn.
func TestReadCoalescerWaitsOnlyBehindAfterADrainedRead(t *testing.T) {
	for _, tc := range []struct {
		name           string
		behind, loaded bool
		reads          []int // bytes each Read returns, buffer of 8
		waits          int
	}{
		{"caught up", false, false, []int{3, 3, 3}, 0},
		{"behind, every read drained", true, false, []int{3, 3, 3}, 2},
		{"under load, every read drained", false, true, []int{3, 3, 3}, 2},
		{"behind, full reads", true, false, []int{8, 8, 8}, 0},
		{"behind, full then drained", true, false, []int{8, 2, 8, 1}, 1},
		{"behind and under load", true, true, []int{3, 3, 3}, 2},
	} {
		for _, turns := range []bool{false, true} { // a session's turns wait under load instead
			name := tc.name
			if turns {
				name += ", turns"
			}
			t.Run(name, func(t *testing.T) {
				var src chunks
				for _, n := range tc.reads {
					src = append(src, make([]byte, n))
				}
				c := newReadCoalescer(&src)
				waits, turnWaits := 0, 0
				c.wait = func() { waits++ }
				if turns {
					c.turn = func(int64) { turnWaits++ }
				}
				c.setBehind(tc.behind)
				c.setLoaded(tc.loaded)
				buf := make([]byte, 8)
				for i, want := range tc.reads {
					if n, err := c.Read(buf); n != want || err != nil {
						t.Fatalf("read %d: %d bytes, %v; want %d", i, n, err, want)
					}
				}
				wantWaits, wantTurns := tc.waits, 0
				if turns && tc.loaded && !tc.behind {
					wantWaits, wantTurns = 0, tc.waits
				}
				if waits != wantWaits || turnWaits != wantTurns {
					t.Errorf("%d waits and %d turn waits, want %d and %d", waits, turnWaits, wantWaits, wantTurns)
				}
			})
		}
	}
}

// TestReadCoalescerHandsOutLargeReads: through the buffer over the coalescer (readLarge), a
// socket read fills as much of the buffer as has arrived and the smaller reads after it are
// served from memory, in order, with no socket read or wait between them; a read as large as the
// buffer goes straight to the socket; the socket's error comes after the bytes read before it.
func TestReadCoalescerHandsOutLargeReads(t *testing.T) {
	data := make([]byte, 60)
	for i := range data {
		data[i] = byte(i)
	}
	sock := &countingReader{r: &chunks{data[:16], data[16:20], data[20:40], data[40:]}}
	c := newReadCoalescer(sock)
	br := bufio.NewReaderSize(c, 16)
	waits := 0
	c.wait = func() { waits++ }
	c.setBehind(true)
	var got, sizes []int
	for len(got) < 40 {
		p := make([]byte, 5)
		n, err := br.Read(p)
		if err != nil {
			t.Fatalf("read %d: %v", len(sizes), err)
		}
		for _, b := range p[:n] {
			got = append(got, int(b))
		}
		sizes = append(sizes, n)
	}
	for i, b := range got {
		if b != i {
			t.Fatalf("byte %d is %d: out of order (%v)", i, b, got)
		}
	}
	// 16 (one socket read, the buffer full) as 5+5+5+1; 4 (drained) at once; after a wait 16
	// of the next 20 (full) as 5+5+5+1; their last 4 (drained) at once
	if want := []int{5, 5, 5, 1, 4, 5, 5, 5, 1, 4}; !slices.Equal(sizes, want) {
		t.Errorf("reads of %v bytes, want %v", sizes, want)
	}
	if sock.reads != 4 || waits != 1 {
		t.Errorf("%d socket reads and %d waits, want 4 and 1", sock.reads, waits)
	}
	big := make([]byte, 32) // the buffer's size or more: straight to the socket
	if n, err := br.Read(big); n != 20 || err != nil || big[0] != 40 {
		t.Errorf("large read: %d bytes from %d, %v; want 20 from 40", n, big[0], err)
	}
	if n, err := br.Read(big); n != 0 || err != io.EOF {
		t.Errorf("after the end: %d, %v; want 0, EOF", n, err)
	}
}

type countingReader struct {
	r     io.Reader
	reads int
}

func (c *countingReader) Read(p []byte) (int, error) {
	c.reads++
	return c.r.Read(p)
}

// errOnce returns err on its first Read, then reads r: a read deadline that fired once.
type errOnce struct {
	err error
	r   io.Reader
}

func (e *errOnce) Read(p []byte) (int, error) {
	if err := e.err; err != nil {
		e.err = nil
		return 0, err
	}
	return e.r.Read(p)
}

// TestReadCoalescerErrorIsNotSticky: an error of the socket (a read deadline's timeout, after
// which pgconn goes on using the connection) is returned once, and the reads after it read the
// socket again.
func TestReadCoalescerErrorIsNotSticky(t *testing.T) {
	timeout := errors.New("i/o timeout")
	br := bufio.NewReaderSize(newReadCoalescer(&errOnce{err: timeout, r: &chunks{[]byte("abc")}}), 16)
	p := make([]byte, 8)
	if n, err := br.Read(p); n != 0 || err != timeout {
		t.Fatalf("first read: %d, %v; want the timeout", n, err)
	}
	if n, err := br.Read(p); n != 3 || err != nil || string(p[:3]) != "abc" {
		t.Fatalf("read after the timeout: %d %q, %v; want abc", n, p[:n], err)
	}
}

// askedReader records how many bytes each Read asked for.
type askedReader struct {
	r     io.Reader
	asked []int
}

func (a *askedReader) Read(p []byte) (int, error) {
	a.asked = append(a.asked, len(p))
	return a.r.Read(p)
}

// TestConnectionsAskForLargeReads: the frontends the source builds its connections with ask the
// socket for large reads (pgproto3 alone asks for what is left of its 8 KiB buffer, often a few
// hundred bytes) and hand out the messages in them in order; the replication connection's goes
// through the coalescer it gives the session.
func TestConnectionsAskForLargeReads(t *testing.T) {
	var reads *readCoalescer
	for _, tc := range []struct {
		name  string
		build func(io.Reader, io.Writer) *pgproto3.Frontend
		want  int
	}{
		{"replication", replicationFrontend(func(c *readCoalescer) { reads = c }), replReadBuf},
		{"query", queryFrontend, queryReadBuf},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ready := func(status byte) []byte { return []byte{'Z', 0, 0, 0, 5, status} }
			sock := &askedReader{r: &chunks{ready('I'), ready('T')}}
			fe := tc.build(sock, io.Discard)
			for _, want := range []byte{'I', 'T'} {
				msg, err := fe.Receive()
				if r, ok := msg.(*pgproto3.ReadyForQuery); err != nil || !ok || r.TxStatus != want {
					t.Fatalf("received %#v, %v; want ReadyForQuery %c", msg, err, want)
				}
			}
			if len(sock.asked) == 0 || sock.asked[0] < tc.want || tc.want < 64<<10 {
				t.Errorf("the socket was asked for %v bytes; want reads of %d (at least 64 KiB)", sock.asked, tc.want)
			}
		})
	}
	if reads == nil {
		t.Error("the replication frontend gave the session no coalescer")
	}
}

// Under load the reader reads in turns (readTurn): the bundler, waiting to fill a batch until
// load_linger after the previous ack, gives the reader one turn shortly before; the reader waits
// for it, reads, and once what it read is queued the batch goes at once. Between turns a reader
// waits for the next one (or for the bundler asking for data), not on a timer of its own.
func TestReadTurns(t *testing.T) {
	// The reader's turn comes linger/turnHeadStart before the fill time, the room a slow machine
	// has; a batch further ahead than turnWaitMax gets no turn, so linger is at most that.
	const linger = turnWaitMax
	ss := testSession(10, pointer.New(1, "e", "s", "x", 100))
	ss.src.cfg.LoadLinger = linger
	ss.q = newItemQueue(10, 1<<20)
	ss.readWake, ss.readDone, ss.readTick = make(chan struct{}, 1), make(chan struct{}, 1), time.NewTicker(time.Hour)
	defer ss.readTick.Stop()
	ss.coalesce = newReadCoalescer(&chunks{})
	ss.coalesce.turn = ss.readTurn
	ss.coalesce.setLoaded(true)
	seed := func(now time.Time) { // 1,000 events/s: 100 per load_linger, under load
		ss.lastCut = time.Time{}
		for i := range 50 {
			ss.measure(1, now.Add(time.Duration(i-50)*time.Millisecond))
		}
	}
	start := time.Now()
	seed(start)
	ss.lastAck.Store(start.UnixNano())
	fill := start.Add(linger)
	turn := fill.Add(-linger / turnHeadStart).UnixNano()

	// Nothing queued: the next batch waits to fill, so the reader is given its turn, not asked to
	// read now.
	if b, _, _ := ss.bundle(context.Background()); b != nil {
		t.Fatalf("a batch %v from an empty queue", payloads(b))
	}
	if ss.readPause.Load() != turn || ss.wantData.Load() {
		t.Fatalf("turn %d, data wanted %v; want the turn %d and no data wanted", ss.readPause.Load(), ss.wantData.Load(), turn)
	}
	// A reader that drained the socket before the turn waits for it.
	ss.readTurn(start.UnixNano())
	if now := time.Now().UnixNano(); now < turn {
		t.Fatalf("the reader's wait ended %s before its turn", time.Duration(turn-now))
	}
	// It reads (the read begins in the turn) and queues a transaction; until its next wait the
	// turn is not served, and the batch waits to fill, also on the reader.
	lastRead := time.Now().UnixNano()
	for _, it := range txnItems(200, "e0") {
		ss.q.tryPush(it)
	}
	b, wait, _ := ss.bundle(context.Background())
	if b != nil || wait.ready == nil || wait.after <= time.Until(fill) {
		t.Fatalf("batch %v, wait %+v; want a wait for the reader, ending after the fill time only if it never comes", b, wait)
	}
	// The reader's next wait serves the turn: the bundler is told and the batch goes at once,
	// before its fill time. The reader then waits for its next turn.
	served := make(chan struct{})
	go func() { defer close(served); ss.readTurn(lastRead) }()
	select {
	case <-wait.ready:
	case <-time.After(10 * time.Second):
		t.Fatal("the served turn was not signalled")
	}
	if b, _, _ = ss.bundle(context.Background()); b == nil || !slices.Equal(payloads(b), []string{"e0"}) {
		t.Fatalf("after the turn's read: %+v, want the batch e0", b)
	}
	if time.Now().After(fill) {
		t.Log("the batch went after its fill time: the machine is slow, the order is what counts")
	}
	select {
	case <-served:
		t.Fatal("the reader read again before its next turn")
	case <-time.After(20 * time.Millisecond):
	}
	// The batch is acknowledged: the next one waits to fill again, and the reader's new turn
	// ends its wait once it has come.
	next := time.Now()
	seed(next)
	ss.lastAck.Store(next.UnixNano())
	if b, _, _ := ss.bundle(context.Background()); b != nil {
		t.Fatalf("a batch %v from an empty queue", payloads(b))
	}
	turn2 := next.Add(linger - linger/turnHeadStart).UnixNano()
	select {
	case <-served:
		if now := time.Now().UnixNano(); now < turn2 {
			t.Fatalf("the reader's wait ended %s before its next turn", time.Duration(turn2-now))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the reader did not take its next turn")
	}
	// A turn whose read brought nothing to send (or only part of a message): the bundler, woken
	// by the served turn, asks for data at once instead of giving the same turn again.
	next = time.Now()
	seed(next)
	ss.lastAck.Store(next.UnixNano())
	_, wait, _ = ss.bundle(context.Background())
	if wait.ready == nil {
		t.Fatal("with a turn given, the bundler does not wait for it to be read in")
	}
	ss.readTurn(time.Now().UnixNano()) // waits for the turn
	served = make(chan struct{})
	go func() { defer close(served); ss.readTurn(time.Now().UnixNano()) }()
	select {
	case <-wait.ready:
	case <-time.After(10 * time.Second):
		t.Fatal("the served turn was not signalled")
	}
	if b, _, _ := ss.bundle(context.Background()); b != nil || !ss.wantData.Load() {
		t.Fatalf("batch %v, data wanted %v; want no batch and data wanted", b, ss.wantData.Load())
	}
	select {
	case <-served:
	case <-time.After(linger):
		t.Fatal("a reader whose turn brought nothing was not asked to read on")
	}
	// A bundler with nothing to send and no wait to fill (the load has passed) asks for data:
	// a reader waiting between turns reads at once.
	ss.lastAck.Store(time.Now().Add(-time.Hour).UnixNano())
	if b, _, _ := ss.bundle(context.Background()); b != nil || !ss.wantData.Load() {
		t.Fatalf("batch %v, data wanted %v; want no batch and data wanted", b, ss.wantData.Load())
	}
	t0 := time.Now()
	ss.readTurn(time.Now().UnixNano())
	if d := time.Since(t0); d > linger {
		t.Fatalf("a reader asked for data waited %s", d)
	}
}

// A linger counts from the first change the bundler sees, which turns would put off: with one
// configured the reader reads on as before (no turn, asked for data at once).
func TestNoReadTurnsWithLinger(t *testing.T) {
	ss := testSession(10, pointer.New(1, "e", "s", "x", 100))
	ss.src.cfg.LoadLinger, ss.src.cfg.Linger = 40*time.Millisecond, 10*time.Millisecond
	ss.readWake, ss.readDone = make(chan struct{}, 1), make(chan struct{}, 1)
	ss.coalesce = newReadCoalescer(&chunks{})
	ss.coalesce.turn = ss.readTurn
	ss.coalesce.setLoaded(true)
	now := time.Now()
	for i := range 50 {
		ss.measure(1, now.Add(time.Duration(i-50)*time.Millisecond))
	}
	ss.lastAck.Store(now.UnixNano())
	if b, _, _ := ss.bundle(context.Background()); b != nil {
		t.Fatalf("a batch %v from an empty queue", payloads(b))
	}
	if ss.turns() || ss.readPause.Load() != 0 || !ss.wantData.Load() {
		t.Fatalf("turns %v, turn %d, data wanted %v; want no turns and data wanted", ss.turns(), ss.readPause.Load(), ss.wantData.Load())
	}
}
