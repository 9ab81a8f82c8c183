package source

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/pgrelay/pgrelay/internal/convert"
	"github.com/pgrelay/pgrelay/internal/event"
	"github.com/pgrelay/pgrelay/internal/pointer"
)

func change(commit pglogrepl.LSN, seq uint64, events int) item {
	it := item{kind: itemChange, commit: commit, seq: seq}
	for i := 0; i < events; i++ {
		it.events = append(it.events, Event{Payload: []byte("x")})
		it.size += it.events[i].size()
	}
	return it
}

func commitItem(c pglogrepl.LSN) item   { return item{kind: itemCommit, commit: c} }
func positionItem(l pglogrepl.LSN) item { return item{kind: itemPosition, lsn: l} }

func testSession(maxMsgs int, start pointer.Pointer, items ...item) *session {
	src := &Source{cfg: Config{MaxBundleMessages: maxMsgs, MaxBundleBytes: 1 << 20}}
	src.covers = newCoverWriter(src, context.Background()) // no pointer key: its writes do nothing
	ctx, cancel := context.WithCancelCause(context.Background())
	ss := &session{src: src, ctx: ctx, cancel: cancel, q: newItemQueue(1000, 1<<20), plan: start}
	for _, it := range items {
		if ok, _ := ss.q.tryPush(it); !ok {
			panic("queue full")
		}
	}
	return ss
}

func TestBundleCoversAndCuts(t *testing.T) {
	start := pointer.New(1, "e", "s", "x", 100)
	for _, c := range []struct {
		name      string
		max       int
		start     pointer.Pointer
		items     []item
		wantPos   []string // covers of the batches, in order
		wantSizes []int
	}{
		{"one transaction, then positions folded in", 10, start,
			[]item{change(200, 0, 1), change(200, 1, 1), commitItem(200), positionItem(299)},
			[]string{"00000001/000000000000012b/ffffffffffffffff/0000000000000000"}, []int{2}},
		{"several transactions in one batch", 10, start,
			[]item{change(200, 0, 1), commitItem(200), change(300, 0, 1), commitItem(300)},
			[]string{"00000001/000000000000012c/ffffffffffffffff/0000000000000000"}, []int{2}},
		{"a large transaction in pieces, cut before a change", 2, start,
			[]item{change(200, 0, 1), change(200, 1, 2), change(200, 2, 1), change(200, 3, 1), commitItem(200)},
			[]string{
				"00000001/00000000000000c8/0000000000000001/0000000000000000",
				"00000001/00000000000000c8/0000000000000002/0000000000000000",
				"00000001/00000000000000c8/ffffffffffffffff/0000000000000000",
			}, []int{1, 2, 2}},
		{"positions inside a resumed transaction are ignored", 10, start.InsideTxn(200, 1),
			[]item{positionItem(150), change(200, 1, 1), commitItem(200)},
			[]string{"00000001/00000000000000c8/ffffffffffffffff/0000000000000000"}, []int{1}},
	} {
		ss := testSession(c.max, c.start, c.items...)
		var got []string
		var sizes []int
		for i := 0; i < 10; i++ {
			b, _, err := ss.bundle(context.Background())
			if err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			if b == nil {
				break
			}
			got = append(got, b.Cover.Position())
			sizes = append(sizes, len(b.Events))
		}
		if len(got) != len(c.wantPos) {
			t.Errorf("%s: covers %v, want %v", c.name, got, c.wantPos)
			continue
		}
		for i := range got {
			if got[i] != c.wantPos[i] || sizes[i] != c.wantSizes[i] {
				t.Errorf("%s: batch %d: %s (%d events), want %s (%d)", c.name, i, got[i], sizes[i], c.wantPos[i], c.wantSizes[i])
			}
		}
	}
}

// TestBundleMeasuresOnWhereItStopped: the bundler looks at the queue after every push and goes
// on measuring from where it stopped until it pops; its batches are those of a bundler that
// measures the whole queue again at every look.
func TestBundleMeasuresOnWhereItStopped(t *testing.T) {
	start := pointer.New(1, "e", "s", "x", 100)
	items := []item{change(200, 0, 1), change(200, 1, 2), change(200, 2, 1), positionItem(150), change(200, 3, 1), commitItem(200),
		positionItem(250), change(300, 0, 1), commitItem(300), positionItem(350), change(400, 0, 1), change(400, 1, 1),
		change(400, 2, 1), commitItem(400), change(500, 0, 1), commitItem(500), positionItem(600)}
	run := func(afresh bool) []string {
		ss := testSession(2, start)
		var got []string
		look := func(ahead bool) bool {
			if afresh {
				ss.scan = scan{}
			}
			b, _, err := ss.build(context.Background(), ahead)
			if err != nil {
				t.Fatal(err)
			}
			if b != nil {
				got = append(got, fmt.Sprintf("%s:%d", b.Cover.Position(), len(b.Events)))
			}
			return b != nil
		}
		for i, it := range items {
			ss.q.tryPush(it)
			look(true)
			if i%3 == 2 {
				look(false)
			}
		}
		for look(false) {
		}
		return got
	}
	want, got := run(true), run(false)
	if len(want) < 4 {
		t.Fatalf("batches %v: the case should cut several", want)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("batches measured on from the last look %v, want %v (measured afresh)", got, want)
	}
}

func TestBundleWaitsForTheRestOfATransaction(t *testing.T) {
	ss := testSession(10, pointer.New(1, "e", "s", "x", 100), change(200, 0, 1))
	if b, _, _ := ss.bundle(context.Background()); b != nil {
		t.Fatalf("a batch before the transaction is complete or the limit reached: %+v", b.Cover)
	}
	ss.q.tryPush(commitItem(200))
	if b, _, _ := ss.bundle(context.Background()); b == nil || b.Cover.InTxn != nil {
		t.Fatalf("no complete batch after the commit: %+v", b)
	}
}

func TestDecoderSkipsWhatThePointerCovers(t *testing.T) {
	start := pointer.New(1, "e", "s", "x", 100).InsideTxn(200, 2)
	var got []item
	d := &decoder{epoch: "e", start: start, rels: map[uint32]*relation{7: {table: event.NewTable("public.t", nil, nil, nil)}}}
	emit := func(it item) error { got = append(got, it); return nil }
	ctx := context.Background()
	for _, commit := range []pglogrepl.LSN{100, 200} {
		d.handle(ctx, &pglogrepl.BeginMessage{FinalLSN: commit, Xid: 1}, emit)
		for i := 0; i < 3; i++ {
			d.decode(ctx, []byte{'D', 0, 0, 0, 7, 'K', 0, 0}, emit) // a delete of a row with no columns
		}
		d.handle(ctx, &pglogrepl.CommitMessage{CommitLSN: commit}, emit)
	}
	if len(got) != 2 || got[0].kind != itemChange || got[0].commit != 200 || got[0].seq != 2 || got[1].kind != itemCommit {
		t.Fatalf("items: %+v", got)
	}
}

func TestDecoderRowChanges(t *testing.T) {
	tuple := func(vals ...string) []byte { // "" is NULL, "~" unchanged
		b := []byte{0, byte(len(vals))}
		for _, v := range vals {
			switch v {
			case "":
				b = append(b, 'n')
			case "~":
				b = append(b, 'u')
			default:
				b = append(b, 't', 0, 0, 0, byte(len(v)))
				b = append(b, v...)
			}
		}
		return b
	}
	msg := func(op byte, parts ...any) []byte {
		b := []byte{op, 0, 0, 0, 7}
		for _, p := range parts {
			switch p := p.(type) {
			case byte:
				b = append(b, p)
			case []byte:
				b = append(b, p...)
			}
		}
		return b
	}
	table := event.NewTable("public.t", []event.Column{{Name: "id", Type: convert.ScalarType(20)}, {Name: "v", Type: convert.ScalarType(25)}}, []int{0}, nil)
	for _, c := range []struct {
		name string
		data []byte
		want string // the event's payload up to lsn, or the error
	}{
		{"insert", msg('I', byte('N'), tuple("1", "a")), `{"op":"c","table":"public.t","key":{"id":1},"after":{"id":1,"v":"a"},"before":null`},
		{"update with NULL and unchanged", msg('U', byte('N'), tuple("1", "~")), `{"op":"u","table":"public.t","key":{"id":1},"after":{"id":1},"before":null,"unchanged":["v"]`},
		{"update of the key", msg('U', byte('K'), tuple("1", ""), byte('N'), tuple("2", "b")), `{"op":"u","table":"public.t","key":{"id":2},"after":{"id":2,"v":"b"},"before":{"id":1}`},
		{"delete", msg('D', byte('K'), tuple("1", "")), `{"op":"d","table":"public.t","key":{"id":1},"after":null,"before":{"id":1}`},
		{"too short", []byte{'I', 0, 0, 7}, "I message of 4 bytes"},
		{"insert without new tuple", msg('I', byte('K'), tuple("1", "a")), "I message without a new tuple"},
		{"delete without old tuple", msg('D', byte('N'), tuple("1", "a")), "D message without an old tuple"},
		{"truncated column count", msg('I', byte('N'), byte(0)), "truncated column count"},
		{"missing column", msg('I', byte('N'), []byte{0, 2, 'n'}), "truncated at column 1 of 2"},
		{"length past the end", msg('I', byte('N'), []byte{0, 1, 't', 0, 0, 0, 9, 'x'}), "column 0: 9 bytes announced, 1 left"},
		{"truncated length", msg('I', byte('N'), []byte{0, 1, 't', 0, 0}), "truncated length of column 0"},
		{"unknown kind", msg('I', byte('N'), []byte{0, 1, 'z'}), `column 0: unknown kind 'z'`},
	} {
		var got []Event
		d := &decoder{epoch: "e", rels: map[uint32]*relation{7: {info: &TableInfo{Table: Table{Queue: "q"}}, table: table}}}
		emit := func(it item) error { got = append(got, it.events...); return nil }
		d.decode(context.Background(), []byte{'B', 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9}, emit)
		err := d.decode(context.Background(), c.data, emit)
		switch {
		case err != nil:
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s: error %v, want %q", c.name, err, c.want)
			}
		case len(got) != 1 || !strings.HasPrefix(string(got[0].Payload), c.want+`,"lsn"`):
			t.Errorf("%s: events %+v, want one starting %s", c.name, got, c.want)
		}
	}
}

// txnItems is a one-change transaction committing at commit whose event's payload is payload.
func txnItems(commit pglogrepl.LSN, payload string) []item {
	ev := Event{Payload: []byte(payload)}
	return []item{{kind: itemChange, commit: commit, events: []Event{ev}, size: ev.size()}, commitItem(commit)}
}

func payloads(b *Batch) []string {
	var out []string
	for _, e := range b.Events {
		out = append(out, string(e.Payload))
	}
	return out
}

// Under sustained load, or while the stream is behind the writers, a batch that is not full waits
// until load_linger after the previous ack and then takes everything that arrived; a trickle that
// is caught up, load_linger 0 or a full batch goes at once.
func TestBundleWaitsToFillUnderLoad(t *testing.T) {
	for _, c := range []struct {
		name       string
		loadLinger time.Duration
		every      time.Duration // the arrival gap the rate was measured with: one event per gap
		behind     bool          // the transactions arrive with the stream behind the writers
		want       [][]string    // the batches while the wait runs (one: it went at once)
	}{
		{"a trickle goes at once", 2 * time.Millisecond, 10 * time.Millisecond, false, [][]string{{"e0"}}},
		{"under load it waits", 2 * time.Millisecond, 50 * time.Microsecond, false, nil},
		{"load_linger 0 never waits", 0, 50 * time.Microsecond, false, [][]string{{"e0"}}},
		{"a trickle behind the writers waits", 2 * time.Millisecond, 10 * time.Millisecond, true, nil},
		{"behind, load_linger 0 never waits", 0, 10 * time.Millisecond, true, [][]string{{"e0"}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ss := testSession(10, pointer.New(1, "e", "s", "x", 100))
			ss.src.cfg.LoadLinger = c.loadLinger
			ss.q = newItemQueue(10, 1<<20) // as the source makes it: "full" is the batch limit
			// The arrival rate, from batches of one event up to now; set again before each look,
			// since a batch built measures the real time since the last one.
			seed := func() {
				ss.lastCut = time.Time{}
				start := time.Now().Add(-50 * c.every)
				for i := range 50 {
					ss.measure(1, start.Add(time.Duration(i)*c.every))
				}
			}
			seed()
			// The previous batch was acknowledged "now": a wait would last long on any machine.
			ss.lastAck.Store(time.Now().Add(time.Hour).UnixNano())
			push := func(from, to int) {
				for i := from; i < to; i++ {
					for _, it := range txnItems(pglogrepl.LSN(200+10*i), fmt.Sprintf("e%d", i)) {
						it.behind = c.behind && it.kind == itemCommit
						if ok, _ := ss.q.tryPush(it); !ok {
							t.Fatal("queue full")
						}
					}
				}
			}
			push(0, 1)
			var got [][]string
			b, wait, err := ss.bundle(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if b != nil {
				got = append(got, payloads(b))
			}
			if !slices.EqualFunc(got, c.want, slices.Equal) {
				t.Fatalf("batches %v, want %v", got, c.want)
			}
			if b != nil {
				return
			}
			if wait.after < 30*time.Minute {
				t.Fatalf("waits %s, want until load_linger after the previous ack", wait.after)
			}
			push(1, 4) // more arrive during the wait: still waiting
			seed()
			if b, _, _ := ss.bundle(context.Background()); b != nil {
				t.Fatalf("a batch %v before the wait is over", payloads(b))
			}
			ss.lastAck.Store(time.Now().Add(-time.Hour).UnixNano()) // the wait is over
			b, _, _ = ss.bundle(context.Background())
			if b == nil || !slices.Equal(payloads(b), []string{"e0", "e1", "e2", "e3"}) {
				t.Fatalf("after the wait: %+v, want one batch of e0-e3", b)
			}

			// A full batch ends a wait at once: its channel closes and the batch goes.
			ss.lastAck.Store(time.Now().Add(time.Hour).UnixNano())
			push(4, 6)
			seed()
			b, wait, _ = ss.bundle(context.Background())
			if b != nil {
				t.Fatalf("a batch %v before the wait is over", payloads(b))
			}
			push(6, 16)
			select {
			case <-wait.ch:
			default:
				t.Fatal("the wait's channel is still open with a full batch queued")
			}
			b, _, _ = ss.bundle(context.Background())
			if b == nil || len(b.Events) != 10 || string(b.Events[0].Payload) != "e4" || string(b.Events[9].Payload) != "e13" {
				t.Fatalf("with a full batch queued: %+v, want e4-e13", b)
			}
		})
	}
}

// The arrival rate is a ratio of averages: one batch right after another does not make a trickle
// look like a flood, and an idle spell does not hide a flood for long.
func TestArrivalRate(t *testing.T) {
	rate := func(ss *session) float64 { return ss.evAvg / ss.gapAvg }
	ss := testSession(10, pointer.New(1, "e", "s", "x", 100))
	now := time.Now()
	at := func(d time.Duration) time.Time { now = now.Add(d); return now }
	for range 40 {
		ss.measure(1, at(time.Millisecond)) // 1,000 events/s
	}
	ss.measure(1, at(10*time.Microsecond)) // two close together
	if r := rate(ss); r < 500 || r > 2000 {
		t.Fatalf("rate %.0f/s after one close pair in a trickle of 1,000/s", r)
	}
	ss.measure(1, at(time.Hour)) // idle
	for range 24 {
		ss.measure(20, at(time.Millisecond)) // 20,000 events/s
	}
	if r := rate(ss); r < 10000 {
		t.Fatalf("rate %.0f/s after 24 batches at 20,000/s following an idle hour", r)
	}
}

// Whether to wait is the newest queued transaction's: once the stream has caught up, a trickle
// goes at once again, though earlier transactions of the batch arrived behind.
func TestBundleBehindIsTheNewestTransactions(t *testing.T) {
	for _, c := range []struct {
		name   string
		behind []bool // of each transaction, in commit order
		waits  bool
	}{
		{"the newest behind", []bool{false, true}, true},
		{"caught up since", []bool{true, true, false}, false},
		{"never behind", []bool{false, false}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			ss := testSession(10, pointer.New(1, "e", "s", "x", 100))
			ss.src.cfg.LoadLinger = 2 * time.Millisecond
			ss.q = newItemQueue(10, 1<<20)
			ss.lastAck.Store(time.Now().Add(time.Hour).UnixNano())
			for i, late := range c.behind {
				for _, it := range txnItems(pglogrepl.LSN(200+10*i), fmt.Sprintf("e%d", i)) {
					it.behind = late && it.kind == itemCommit
					ss.q.tryPush(it)
				}
			}
			b, _, err := ss.bundle(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if waits := b == nil; waits != c.waits {
				t.Fatalf("waits %v, want %v", waits, c.waits)
			}
		})
	}
}

// The meter finds the stream behind from the commit times and send times alone, whatever the
// skew between the clocks, and follows a change of clock within two windows.
func TestLagMeter(t *testing.T) {
	const linger = 2 * time.Millisecond
	t0 := time.Date(2026, 12, 1, 6, 0, 0, 0, time.UTC)
	type tx struct {
		at      time.Duration // arrival, on the local clock (from t0)
		commit  time.Duration // commit, on the server's clock
		decoded time.Duration // the walsender sent the commit this long after it
	}
	for _, c := range []struct {
		name   string
		skew   time.Duration // server clock − local clock
		txs    []tx
		behind []bool
	}{
		{"caught up, clocks agree", 0,
			[]tx{{1 * time.Millisecond, 0, 300 * time.Microsecond}, {3 * time.Millisecond, 2 * time.Millisecond, 500 * time.Microsecond}},
			[]bool{false, false}},
		{"caught up, server clock an hour ahead", time.Hour,
			[]tx{{1 * time.Millisecond, 0, 300 * time.Microsecond}, {3 * time.Millisecond, 2 * time.Millisecond, 500 * time.Microsecond}},
			[]bool{false, false}},
		{"caught up, server clock a minute behind", -time.Minute,
			[]tx{{1 * time.Millisecond, 0, 300 * time.Microsecond}, {5 * time.Millisecond, 1 * time.Millisecond, 3 * time.Millisecond}},
			[]bool{false, false}},
		{"the walsender decodes later and later", 30 * time.Second,
			[]tx{{1 * time.Millisecond, 0, 500 * time.Microsecond}, {20 * time.Millisecond, 2 * time.Millisecond, 17 * time.Millisecond},
				{40 * time.Millisecond, 3 * time.Millisecond, 36 * time.Millisecond}},
			[]bool{false, true, true}},
		{"behind from the first transaction (a backlog at the start)", -time.Hour,
			[]tx{{1 * time.Millisecond, -2 * time.Second, 2 * time.Second}, {2 * time.Millisecond, -1 * time.Second, 1 * time.Second}},
			[]bool{true, true}},
		{"WAL waiting in the connection", time.Minute,
			[]tx{{1 * time.Millisecond, 0, 500 * time.Microsecond}, {30 * time.Millisecond, 2 * time.Millisecond, 500 * time.Microsecond}},
			[]bool{false, true}},
		{"just within BehindLingers", 0,
			[]tx{{1 * time.Millisecond, 0, 500 * time.Microsecond}, {10 * time.Millisecond, 2 * time.Millisecond, 500 * time.Microsecond}},
			[]bool{false, false}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var m lagMeter
			for i, x := range c.txs {
				commit := t0.Add(c.skew + x.commit)
				m.sent = commit.Add(x.decoded)
				if got := behind(m.excess(t0.Add(x.at), commit), linger); got != c.behind[i] {
					t.Fatalf("transaction %d: behind %v, want %v", i, got, c.behind[i])
				}
			}
		})
	}

	// The local clock steps 5 s ahead: every delivery looks 5 s longer, so a caught-up stream
	// looks behind until the baseline has followed, within two windows.
	var m lagMeter
	now := t0
	arrive := func() bool { // a caught-up transaction: committed 1 ms ago, sent 0.5 ms after it
		commit := now.Add(-time.Millisecond)
		m.sent = commit.Add(500 * time.Microsecond)
		return behind(m.excess(now, commit), linger)
	}
	for range 10 {
		now = now.Add(time.Second)
		if arrive() {
			t.Fatal("behind while caught up")
		}
	}
	skew := 5 * time.Second // the local clock jumps ahead: every delivery looks 5 s longer
	stepped := now
	var first, last bool
	for i := 0; now.Sub(stepped) <= 2*lagWindow; i++ {
		now = now.Add(500 * time.Millisecond)
		commit := now.Add(-skew - time.Millisecond)
		m.sent = commit.Add(500 * time.Microsecond)
		last = behind(m.excess(now, commit), linger)
		if i == 0 {
			first = last
		}
	}
	if !first || last {
		t.Fatalf("behind right after the step: %v (want true), two windows later: %v (want false)", first, last)
	}

	// No send times (a server that leaves them zero): never behind.
	m = lagMeter{}
	for i := range 3 {
		now := t0.Add(time.Duration(i) * time.Second)
		if behind(m.excess(now, now.Add(-time.Hour)), linger) {
			t.Fatal("behind with no send times")
		}
	}
}
