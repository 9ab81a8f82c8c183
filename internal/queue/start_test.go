package queue

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgrelay/pgrelay/internal/cdctest"
	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

func TestParseStart(t *testing.T) {
	good := []struct{ positions, snap, lsn, wantPos, wantSnap, wantLSN string }{
		{"1-0,0-0", "10:20:12,15", "0/1A2B", "1-0,0-0", "10:20:12,15", "0/1A2B"},
		{" 0 , 1718000000000-7 ", " 5:5: ", "1/0", "0-0,1718000000000-7", "5:5:", "1/0"},
		{"0", "4294967290:4294967300:4294967295", "FFFFFFFF/FFFFFFFF", "0-0", "4294967290:4294967300:4294967295", "FFFFFFFF/FFFFFFFF"},
		{"5-1@3, 0-0@0", "1:1:", "0/0", "5-1@3,0-0@0", "1:1:", "0/0"},
	}
	for _, c := range good {
		s, err := ParseStart(c.positions, c.snap, c.lsn)
		if err != nil {
			t.Errorf("ParseStart(%q, %q, %q): %v", c.positions, c.snap, c.lsn, err)
			continue
		}
		if s.PositionsText() != c.wantPos || s.SnapshotText() != c.wantSnap || s.LSN.String() != c.wantLSN {
			t.Errorf("ParseStart(%q, %q, %q) = %q %q %q", c.positions, c.snap, c.lsn, s.PositionsText(), s.SnapshotText(), s.LSN)
		}
	}
	bad := []struct{ positions, snap, lsn string }{
		{"", "1:2:", "0/1"},
		{"1-0,,2-0", "1:2:", "0/1"},
		{"$", "1:2:", "0/1"},
		{"1-x", "1:2:", "0/1"},
		{"1-0@", "1:2:", "0/1"},
		{"1-0@x", "1:2:", "0/1"},
		{"1-0@-1", "1:2:", "0/1"},
		{"1-0", "1:2", "0/1"},
		{"1-0", "3:2:", "0/1"},     // xmin above xmax
		{"1-0", "1:5:7", "0/1"},    // xip outside [xmin, xmax)
		{"1-0", "1:5:0", "0/1"},    // xip below xmin
		{"1-0", "1:2:", "01A2B"},   // not an LSN
		{"1-0", "1:2:", ""},        // no LSN
		{"1-0", "a:2:", "0/1"},     // not numbers
		{"1-0", "1:2:3,x", "0/1"},  // not numbers
		{"1-0", "-1:2:", "0/1"},    // negative
		{"1-0", "1:2:", "0/1/2"},   // not an LSN
		{"1-0", "1:2:", "G/1"},     // not hex
		{"1-0", "1:2:", "0/1 0/2"}, // two
	}
	for _, c := range bad {
		if _, err := ParseStart(c.positions, c.snap, c.lsn); !errcode.Is(err, errcode.BadStart) {
			t.Errorf("ParseStart(%q, %q, %q) = %v, want bad_start", c.positions, c.snap, c.lsn, err)
		}
	}
}

// event is a change event of DESIGN §2 with the fields the start rule reads; xid < 0 leaves it out.
func event(op, lsn string, xid int64) []byte {
	x := ""
	if xid >= 0 {
		x = fmt.Sprintf(`,"xid":%d`, xid)
	}
	return []byte(fmt.Sprintf(`{"op":%q,"table":null,"key":null,"after":{"delta":1},"before":null,"lsn":%q%s,"ts":"2026-01-01T00:00:00.000000Z","seq":0}`,
		op, lsn, x))
}

// envelope is an envelope of DESIGN §2 holding events; xid < 0 leaves it out.
func envelope(lsn string, xid int64, events ...[]byte) []byte {
	x := ""
	if xid >= 0 {
		x = fmt.Sprintf(`,"xid":%d`, xid)
	}
	return []byte(fmt.Sprintf(`{"op":"x","id":"pg:0a1b2c3d:0000000000000F00","lsn":%q%s,"ts":"2026-01-01T00:00:00.000000Z","part":1,"last":true,"events":[%s]}`,
		lsn, x, bytes.Join(events, []byte(","))))
}

func TestStartJudge(t *testing.T) {
	const two32 = uint64(1) << 32
	cases := []struct {
		name, snap, lsn string
		payload         []byte
		want            startVerdict
	}{
		{"visible below xmin", "100:110:102,105", "0/1000", event("m", "0/F00", 99), startSkip},
		{"visible between", "100:110:102,105", "0/1000", event("u", "0/F00", 101), startSkip},
		{"in progress at the snapshot", "100:110:102,105", "0/1000", event("m", "0/F00", 102), startDeliver},
		{"at xmax", "100:110:102,105", "0/1000", event("c", "0/F00", 110), startDeliver},
		{"above xmax", "100:110:102,105", "0/1000", event("d", "0/F00", 4000), startDeliver},
		{"commit at the lsn", "100:110:102,105", "0/1000", event("m", "0/1000", 99), startPast},
		{"commit past the lsn", "100:110:102,105", "0/1000", event("m", "1/0", 99), startPast},
		{"snapshot row (no xid)", "100:110:102,105", "0/1000", event("r", "0/F00", -1), startDeliver},
		{"snapshot row past the lsn", "100:110:102,105", "0/1000", event("r", "0/2000", -1), startPast},
		{"not JSON", "100:110:", "0/1000", []byte(`hello`), startDeliver},
		{"no lsn", "100:110:", "0/1000", []byte(`{"xid":99}`), startDeliver},
		{"bad lsn", "100:110:", "0/1000", []byte(`{"lsn":"x","xid":99}`), startDeliver},
		{"xid a string", "100:110:", "0/1000", []byte(`{"lsn":"0/F","xid":"99"}`), startDeliver},
		{"xid over 32 bits", "100:110:", "0/1000", []byte(`{"lsn":"0/F","xid":4294967396}`), startDeliver},
		{"array", "100:110:", "0/1000", []byte(`[1]`), startDeliver},
		// an envelope (one transaction's events in one message): judged by its own lsn and xid
		{"envelope, visible", "100:110:102,105", "0/1000", envelope("0/F00", 101, event("c", "0/F00", 101)), startSkip},
		{"envelope, in progress", "100:110:102,105", "0/1000", envelope("0/F00", 102, event("c", "0/F00", 102)), startDeliver},
		{"envelope past the lsn", "100:110:102,105", "0/1000", envelope("0/2000", 99, event("c", "0/2000", 99)), startPast},
		{"snapshot chunk envelope (no xid)", "100:110:102,105", "0/1000", envelope("0/F00", -1, event("r", "0/F00", -1)), startDeliver},
		// a snapshot whose xmax crossed the 32-bit boundary: xids of both epochs
		{"epoch before, visible", fmt.Sprintf("%d:%d:%d,%d", two32-5, two32+3, two32-2, two32+1), "5/0", event("m", "4/0", 0xFFFFFFFD), startSkip},
		{"epoch before, in progress", fmt.Sprintf("%d:%d:%d,%d", two32-5, two32+3, two32-2, two32+1), "5/0", event("m", "4/0", 0xFFFFFFFE), startDeliver},
		{"epoch before, below xmin", fmt.Sprintf("%d:%d:%d,%d", two32-5, two32+3, two32-2, two32+1), "5/0", event("m", "4/0", 0xFFFFFFF0), startSkip},
		{"new epoch, in progress", fmt.Sprintf("%d:%d:%d,%d", two32-5, two32+3, two32-2, two32+1), "5/0", event("m", "4/0", 1), startDeliver},
		{"new epoch, visible", fmt.Sprintf("%d:%d:%d,%d", two32-5, two32+3, two32-2, two32+1), "5/0", event("m", "4/0", 2), startSkip},
		{"new epoch, at xmax", fmt.Sprintf("%d:%d:%d,%d", two32-5, two32+3, two32-2, two32+1), "5/0", event("m", "4/0", 3), startDeliver},
		// xmax just below the boundary: an xid of the next epoch began after the snapshot
		{"next epoch after the snapshot", fmt.Sprintf("%d:%d:", two32-10, two32-3), "5/0", event("m", "4/0", 5), startDeliver},
		{"last xid of the epoch, visible", fmt.Sprintf("%d:%d:", two32-10, two32-3), "5/0", event("m", "4/0", 0xFFFFFFF9), startSkip},
		{"last xids of the epoch, above xmax", fmt.Sprintf("%d:%d:", two32-10, two32-3), "5/0", event("m", "4/0", 0xFFFFFFFF), startDeliver},
		// a later epoch: widened next to xmax, not to epoch 0
		{"epoch 7", fmt.Sprintf("%d:%d:%d", 7*two32+100, 7*two32+200, 7*two32+150), "9/0", event("m", "8/0", 150), startDeliver},
		{"epoch 7 visible", fmt.Sprintf("%d:%d:%d", 7*two32+100, 7*two32+200, 7*two32+150), "9/0", event("m", "8/0", 151), startSkip},
		{"epoch 7 in progress above", fmt.Sprintf("%d:%d:%d", 7*two32+100, 7*two32+200, 7*two32+150), "9/0", event("m", "8/0", 201), startDeliver},
	}
	for _, c := range cases {
		s, err := ParseStart("0-0", c.snap, c.lsn)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got := s.judge(c.payload); got != c.want {
			t.Errorf("%s: judge(%s) under %s / %s = %d, want %d", c.name, c.payload, c.snap, c.lsn, got, c.want)
		}
	}
}

// writeEvents writes one change event per (partition, lsn, xid) to queue q (xid < 0: none).
func writeEvents(t *testing.T, w *Writer, q string, evs ...struct {
	part, op, lsn string
	xid           int64
}) {
	t.Helper()
	ms := make([]Message, len(evs))
	for i, e := range evs {
		ms[i] = Message{Queue: q, Partition: e.part, ID: fmt.Sprintf("%s:%s:%s:%d", e.part, e.op, e.lsn, e.xid), Payload: event(e.op, e.lsn, e.xid)}
	}
	if _, err := w.Write(context.Background(), ms, nil); err != nil {
		t.Fatal(err)
	}
}

type ev = struct {
	part, op, lsn string
	xid           int64
}

// drain reads and acks deliveries until it has n entries (within 30 s) and then none more comes for
// 500 ms, returning the message ids in order.
func drain(t *testing.T, c *Consumer, n int) []string { return drainNacking(t, c, n, false) }

// drainNacking is drain; with nackFirst it nacks each shard's first delivery (its messages are
// not counted: they come again).
func drainNacking(t *testing.T, c *Consumer, n int, nackFirst bool) []string {
	t.Helper()
	nacked := map[int]bool{}
	var ids []string
	deadline := time.Now().Add(30 * time.Second)
	for {
		wait := time.Until(deadline)
		if len(ids) >= n {
			wait = 500 * time.Millisecond
		}
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		d, err := c.Read(ctx)
		cancel()
		if err != nil {
			sortIDs(ids)
			return ids
		}
		if nackFirst && !nacked[d.Shard] {
			nacked[d.Shard] = true
			if err := c.Nack(context.Background(), d, nil); err != nil {
				t.Fatal(err)
			}
			continue
		}
		for _, e := range d.Entries {
			ids = append(ids, e.MessageID)
		}
		if err := c.Ack(context.Background(), d); err != nil {
			t.Fatal(err)
		}
	}
}

func sortIDs(ids []string) { slices.Sort(ids) }

// TestStartSkipsWhatTheLoadHas: a group started after a load gets, on every shard, only the entries
// after the positions whose transaction the snapshot did not see (and those without xid, and those
// at or past the lsn); the others are acked, never delivered, and nothing stays pending. A replica
// whose config names no start applies the start stored in Redis: here the group and its start were
// created by hand, as the recipe for other clients does. In layout 3 an entry holds messages the
// load has and messages it does not: only the latter are delivered, and the entry is acked.
func TestStartSkipsWhatTheLoadHas(t *testing.T) {
	for _, v := range Layouts {
		t.Run(fmt.Sprintf("v%d", v), func(t *testing.T) { startSkipsWhatTheLoadHas(t, v) })
	}
}

func startSkipsWhatTheLoadHas(t *testing.T, version int) {
	r := testenv.StartRedis(t)
	rdb := r.Client()
	ctx := context.Background()
	w := NewWriter(rdb, WriterConfig{Shards: 2, CreateVersion: version})
	l := w.Layout()
	// before the positions: whatever they hold, a new group never sees them
	writeEvents(t, w, "q", ev{"a", "m", "0/10", 90}, ev{"b", "m", "0/11", 91}, ev{"c", "r", "0/12", -1})
	ps, err := ReadPositions(ctx, rdb, l, "q")
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 2 || ps[0].ID == "0-0" && ps[1].ID == "0-0" {
		t.Fatalf("positions %+v", ps)
	}
	// the load's snapshot 100:110:102,105 and insert position 0/1000
	writeEvents(t, w, "q",
		ev{"a", "m", "0/100", 101},  // seen: skipped
		ev{"b", "u", "0/101", 102},  // in progress at the snapshot: delivered
		ev{"c", "m", "0/102", 99},   // seen: skipped
		ev{"a", "r", "0/103", -1},   // a snapshot row: delivered
		ev{"b", "m", "0/104", 111},  // began after: delivered
		ev{"c", "m", "0/105", 105},  // in progress: delivered
		ev{"c", "m", "0/106", 100},  // seen: skipped
		ev{"a", "m", "0/1000", 100}, // committed at the lsn: delivered (and the rule ends on its shard)
		ev{"b", "m", "0/2000", 101}, // committed after: delivered
	)
	want := []string{"a:m:0/1000:100", "a:r:0/103:-1", "b:m:0/104:111", "b:m:0/2000:101", "b:u:0/101:102", "c:m:0/105:105"}

	t.Run("configured", func(t *testing.T) {
		start, err := ParseStart(PositionsText(ps), "100:110:102,105", "0/1000")
		if err != nil {
			t.Fatal(err)
		}
		skipped := 0
		c := newConsumer(t, rdb, ConsumerConfig{Group: "loaded", Start: start, OnSkip: func(n int) { skipped += n }})
		if got := drain(t, c, len(want)); !slices.Equal(got, want) {
			t.Fatalf("delivered %q\nwant      %q", got, want)
		}
		checkNothingPending(t, rdb, l, "loaded", 2)
		stored, err := StartOf(ctx, rdb, l, "q", "loaded")
		if err != nil || stored == nil || stored.PositionsText() != PositionsText(ps) || stored.SnapshotText() != "100:110:102,105" || stored.LSN.String() != "0/1000" {
			t.Fatalf("stored start %+v, %v", stored, err)
		}
		if skipped != 3 {
			t.Errorf("OnSkip counted %d, want 3", skipped)
		}
	})

	t.Run("by hand, replica without start", func(t *testing.T) {
		for _, p := range ps {
			if err := rdb.XGroupCreateMkStream(ctx, l.Stream("q", p.Shard), "manual", p.ID).Err(); err != nil {
				t.Fatal(err)
			}
		}
		if err := rdb.HSet(ctx, l.GroupStart("q", "manual"), "positions", PositionsText(ps), "snapshot", "100:110:102,105", "lsn", "0/1000").Err(); err != nil {
			t.Fatal(err)
		}
		c := newConsumer(t, rdb, ConsumerConfig{Group: "manual"})
		if got := drain(t, c, len(want)); !slices.Equal(got, want) {
			t.Fatalf("delivered %q\nwant      %q", got, want)
		}
		checkNothingPending(t, rdb, l, "manual", 2)
	})

	// a delivery that comes again (from the pending entries) skips the same messages: in layout 3
	// an entry the rule ended in holds messages in the load before the one past the lsn
	t.Run("nacked once", func(t *testing.T) {
		start, err := ParseStart(PositionsText(ps), "100:110:102,105", "0/1000")
		if err != nil {
			t.Fatal(err)
		}
		c := newConsumer(t, rdb, ConsumerConfig{Group: "nacked", Start: start})
		if got := drainNacking(t, c, len(want), true); !slices.Equal(got, want) {
			t.Fatalf("delivered %q\nwant      %q", got, want)
		}
		checkNothingPending(t, rdb, l, "nacked", 2)
	})

	t.Run("a plain group skips nothing", func(t *testing.T) {
		c := newConsumer(t, rdb, ConsumerConfig{Group: "plain"})
		if got := drain(t, c, 12); len(got) != 12 {
			t.Fatalf("a plain group got %d entries: %q", len(got), got)
		}
	})
}

// checkNothingPending fails unless group g has acked every entry of every shard of queue q.
func checkNothingPending(t *testing.T, rdb redis.UniversalClient, l Layout, g string, shards int) {
	t.Helper()
	for n := 0; n < shards; n++ {
		groups, err := rdb.XInfoGroups(context.Background(), l.Stream("q", n)).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, gi := range groups {
			if gi.Name == g && (gi.Pending != 0 || gi.Lag != 0) {
				t.Fatalf("shard %d: group %s has %d pending, lag %d", n, g, gi.Pending, gi.Lag)
			}
		}
	}
}

// TestStartRefusals: a start is refused with a code, and nothing is created, when the group exists
// without it or with another start, when its positions do not fit the queue's shards or are past a
// shard's last entry, when entries after a position were trimmed, and when the queue does not
// exist. The same start again (a restarted replica) is accepted; a start left by a group that no
// longer exists is dropped by a plain consumer of a new group of that name.
func TestStartRefusals(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := r.Client()
	ctx := context.Background()
	w := NewWriter(rdb, WriterConfig{Shards: 2})
	l := w.Layout()
	writeEvents(t, w, "q", ev{"a", "m", "0/10", 90}, ev{"b", "m", "0/11", 91})
	ps, err := ReadPositions(ctx, rdb, l, "q")
	if err != nil {
		t.Fatal(err)
	}
	start := func(positions, snap string) *Start {
		s, err := ParseStart(positions, snap, "0/1000")
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	refused := func(conf ConsumerConfig, code errcode.Code) {
		t.Helper()
		if conf.Queue == "" {
			conf.Queue = "q"
		}
		c, err := NewConsumer(rdb, conf)
		if err != nil {
			t.Fatal(err)
		}
		err = c.Start(ctx)
		_ = c.Close(ctx)
		if !errcode.Is(err, code) {
			t.Fatalf("group %s: %v, want %s", conf.Group, err, code)
		}
		if n, _ := rdb.Exists(ctx, l.GroupStart(conf.Queue, conf.Group)).Result(); n != 0 && code != errcode.StartConflict {
			t.Fatalf("group %s: a refused start was stored", conf.Group)
		}
	}
	ok := start(PositionsText(ps), "100:110:")

	// an existing plain group
	_ = newConsumer(t, rdb, ConsumerConfig{Group: "plain"})
	cdctest.WaitEvery(t, 10*time.Second, 20*time.Millisecond, "the plain consumer to create its group", func() (bool, string) {
		groups, err := rdb.XInfoGroups(ctx, l.Stream("q", 1)).Result()
		return len(groups) > 0, fmt.Sprint(err)
	})
	refused(ConsumerConfig{Group: "plain", Start: ok}, errcode.StartConflict)
	if n, _ := rdb.Exists(ctx, l.GroupStart("q", "plain")).Result(); n != 0 {
		t.Fatal("a start was stored for an existing group")
	}

	// a group with a start: the same start again is fine, another one refused
	c := newConsumer(t, rdb, ConsumerConfig{Group: "loaded", Start: ok})
	_ = c.Close(ctx)
	_ = newConsumer(t, rdb, ConsumerConfig{Group: "loaded", Start: start(PositionsText(ps), "100:110:")})
	refused(ConsumerConfig{Group: "loaded", Start: start(PositionsText(ps), "100:111:")}, errcode.StartConflict)

	// positions that do not fit
	refused(ConsumerConfig{Group: "short", Start: start(ps[0].ID, "100:110:")}, errcode.BadStart)
	refused(ConsumerConfig{Group: "ahead", Start: start("99999999999999-0,0-0", "100:110:")}, errcode.BadStart)
	refused(ConsumerConfig{Group: "elsewhere", Queue: "nope", Start: ok}, errcode.NoQueue)

	// entries after a position trimmed before the group exists
	for _, e := range []ev{{"a", "m", "0/20", 92}, {"a", "m", "0/21", 93}, {"b", "m", "0/22", 94}} {
		writeEvents(t, w, "q", e) // an entry each, in every layout
	}
	sa := Shard("a", 2)
	xs, err := rdb.XRange(ctx, l.Stream("q", sa), "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.XTrimMinID(ctx, l.Stream("q", sa), xs[len(xs)-1].ID).Err(); err != nil {
		t.Fatal(err)
	}
	refused(ConsumerConfig{Group: "late", Start: ok}, errcode.StartTrimmed)
	for n := 0; n < 2; n++ {
		groups, _ := rdb.XInfoGroups(ctx, l.Stream("q", n)).Result()
		for _, g := range groups {
			if g.Name == "late" || g.Name == "short" || g.Name == "ahead" {
				t.Fatalf("a refused start created group %s on shard %d", g.Name, n)
			}
		}
	}

	// a start left behind by a destroyed group does not bind a new plain group of that name
	if err := rdb.HSet(ctx, l.GroupStart("q", "reborn"), "positions", PositionsText(ps), "snapshot", "1:2:", "lsn", "F/0").Err(); err != nil {
		t.Fatal(err)
	}
	reborn := newConsumer(t, rdb, ConsumerConfig{Group: "reborn"})
	kept := 0
	for n := 0; n < 2; n++ {
		kept += int(rdb.XLen(ctx, l.Stream("q", n)).Val())
	}
	if got := drain(t, reborn, kept); len(got) != kept {
		t.Fatalf("a new plain group got %q, want the %d entries kept", got, kept)
	}
	if n, _ := rdb.Exists(ctx, l.GroupStart("q", "reborn")).Result(); n != 0 {
		t.Fatal("the stale start is still there")
	}
	if s, err := StartOf(ctx, rdb, l, "q", "loaded"); err != nil || s == nil || !strings.Contains(s.SnapshotText(), "100:110") {
		t.Fatalf("StartOf: %+v %v", s, err)
	}
}
