package source

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/pgrelay/pgrelay/internal/convert"
	"github.com/pgrelay/pgrelay/internal/event"
	"github.com/pgrelay/pgrelay/internal/pointer"
)

// envTest decodes transactions of tables public.a, public.b (queue env, enveloped) and public.p
// (queue plain) with a given start pointer.
type envTest struct {
	t     testing.TB
	d     *decoder
	items []item
}

func newEnvTest(t testing.TB, start pointer.Pointer, maxMessages int, envs ...EnvelopeQueue) *envTest {
	cfg := &Config{Envelopes: envs}
	tables := map[string]*TableInfo{}
	for _, n := range []string{"a", "b", "p", "c"} {
		q := "env"
		if n == "p" {
			q = "plain"
		}
		if n == "c" {
			q = "other"
		}
		tables["public."+n] = &TableInfo{Table: Table{Schema: "public", Name: n, Queue: q}, Key: []string{"id"}}
	}
	e := &envTest{t: t, d: &decoder{epoch: "0a1b2c3d", start: start, tables: tables, reg: convert.NewRegistry(), rels: map[uint32]*relation{},
		loadType: func(context.Context, []uint32) error { return nil }, envs: newEnvelopes(cfg), maxMessages: maxMessages, maxBytes: 1 << 20}}
	for i, n := range []string{"a", "b", "p", "c"} {
		e.handle(&pglogrepl.RelationMessage{RelationID: uint32(i + 1), Namespace: "public", RelationName: n,
			Columns: []*pglogrepl.RelationMessageColumn{{Name: "id", DataType: 20}, {Name: "v", DataType: 25}}})
	}
	return e
}

func (e *envTest) emit(it item) error { e.items = append(e.items, it); return nil }

func (e *envTest) handle(m pglogrepl.Message) {
	e.t.Helper()
	if err := e.d.handle(context.Background(), m, e.emit); err != nil {
		e.t.Fatal(err)
	}
}

// tx decodes one transaction committing at commit: each op is "a1" (insert id 1 into a), "m" (a
// published message to queue env), "mo" (one to queue elsewhere).
func (e *envTest) tx(commit pglogrepl.LSN, ops ...string) {
	e.t.Helper()
	e.handle(&pglogrepl.BeginMessage{FinalLSN: commit, Xid: 42, CommitTime: time.Date(2026, 10, 3, 6, 15, 3, 583036000, time.UTC)})
	for _, op := range ops {
		switch {
		case op == "m":
			e.handle(&pglogrepl.LogicalDecodingMessage{Transactional: true, Prefix: PublishPrefix, Content: []byte(`{"queue":"env","partition":"x","payload":{"n":1}}`)})
		case op == "mo":
			e.handle(&pglogrepl.LogicalDecodingMessage{Transactional: true, Prefix: PublishPrefix, Content: []byte(`{"queue":"elsewhere","partition":"x","payload":{"n":2}}`)})
		default:
			rel := uint32(strings.IndexByte("abpc", op[0]) + 1)
			id := op[1:]
			b := []byte{'I', 0, 0, 0, byte(rel), 'N', 0, 2, 't', 0, 0, 0, byte(len(id))}
			b = append(b, id...)
			b = append(b, 't', 0, 0, 0, 1, 'v')
			if err := e.d.decode(context.Background(), b, e.emit); err != nil {
				e.t.Fatal(err)
			}
		}
	}
	e.handle(&pglogrepl.CommitMessage{CommitLSN: commit})
}

// envelopeJSON is an envelope as a consumer reads it.
type envelopeJSON struct {
	Op     string            `json:"op"`
	ID     string            `json:"id"`
	LSN    string            `json:"lsn"`
	Xid    uint32            `json:"xid"`
	TS     string            `json:"ts"`
	Part   uint64            `json:"part"`
	Last   bool              `json:"last"`
	Events []json.RawMessage `json:"events"`
}

// summary renders the items: per item its seq and events (an envelope as
// queue:partition:id[part,last]{op table seq...}, a plain event as queue:op:id), and the parts
// it records.
func (e *envTest) summary() string {
	e.t.Helper()
	var out []string
	for _, it := range e.items {
		if it.kind == itemCommit {
			out = append(out, "commit")
			continue
		}
		var evs []string
		for _, ev := range it.events {
			if ev.Op != event.OpEnvelope {
				evs = append(evs, ev.Queue+":"+ev.Op+":"+ev.ID)
				continue
			}
			var env envelopeJSON
			if err := json.Unmarshal(ev.Payload, &env); err != nil {
				e.t.Fatalf("envelope %s: %v", ev.Payload, err)
			}
			if env.Op != "x" || env.ID != ev.Tx || env.LSN != ev.LSN || env.Xid != ev.Xid || env.TS != "2026-10-03T06:15:03.583036Z" ||
				ev.ID != pointer.EnvelopeID(ev.Tx, env.Part) {
				e.t.Errorf("envelope head %s (message id %s)", ev.Payload, ev.ID)
			}
			var inner []string
			for _, raw := range env.Events {
				var c struct {
					Op    string  `json:"op"`
					Table *string `json:"table"`
					Seq   int     `json:"seq"`
				}
				if err := json.Unmarshal(raw, &c); err != nil {
					e.t.Fatal(err)
				}
				name := "-"
				if c.Table != nil {
					name = strings.TrimPrefix(*c.Table, "public.")
				}
				inner = append(inner, fmt.Sprintf("%s%s%d", c.Op, name, c.Seq))
			}
			evs = append(evs, fmt.Sprintf("%s:%s:t%d,%v{%s}", ev.Queue, ev.Partition, env.Part, env.Last, strings.Join(inner, " ")))
		}
		s := fmt.Sprintf("%d[%s]", it.seq, strings.Join(evs, " "))
		if it.parts != nil {
			s += fmt.Sprint(it.parts)
		}
		out = append(out, s)
	}
	return strings.Join(out, " | ")
}

func TestEnvelopesOfTransactions(t *testing.T) {
	start := pointer.New(1, "0a1b2c3d", "s", "x", 0x100)
	env := func(max int) EnvelopeQueue {
		return EnvelopeQueue{Queue: "env", Partition: "all", MaxEvents: max, MaxBytes: 1 << 20}
	}
	for _, c := range []struct {
		name  string
		start pointer.Pointer
		max   int // bundle messages
		envs  []EnvelopeQueue
		ops   []string
		want  string
	}{
		{"three tables and published messages: one envelope, plain events of other queues beside it", start, 100, []EnvelopeQueue{env(100)},
			[]string{"a1", "p1", "b1", "m", "mo", "a2"},
			"6[plain:c:pg:0a1b2c3d:0000000000000200:1 elsewhere:m:pg:0a1b2c3d:0000000000000200:4 env:all:t1,true{ca0 cb2 m-3 ca5}] | commit"},
		{"plain changes before the first enveloped one go on their own", start, 100, []EnvelopeQueue{env(100)},
			[]string{"p1", "p2", "a1"},
			"0[plain:c:pg:0a1b2c3d:0000000000000200:0] | 1[plain:c:pg:0a1b2c3d:0000000000000200:1] | 3[env:all:t1,true{ca2}] | commit"},
		{"no enveloped change: no envelope", start, 100, []EnvelopeQueue{env(100)},
			[]string{"p1"},
			"0[plain:c:pg:0a1b2c3d:0000000000000200:0] | commit"},
		{"over max_events: parts closed before the change that overflows, the last one at the commit", start, 100, []EnvelopeQueue{env(3)},
			[]string{"a1", "a2", "a3", "a4", "a5", "a6", "a7"},
			"2[env:all:t1,false{ca0 ca1 ca2}]map[env:1] | 5[env:all:t2,false{ca3 ca4 ca5}]map[env:2] | 7[env:all:t3,true{ca6}] | commit"},
		{"resumed inside: covered changes dropped, parts numbered on", start.InsideTxn(0x200, 3).WithParts(map[string]uint64{"env": 1}), 100, []EnvelopeQueue{env(3)},
			[]string{"a1", "a2", "a3", "a4", "a5", "a6", "a7"},
			"5[env:all:t2,false{ca3 ca4 ca5}]map[env:2] | 7[env:all:t3,true{ca6}] | commit"},
		{"resumed after the last change, before the last part", start.InsideTxn(0x200, 6).WithParts(map[string]uint64{"env": 2}), 100, []EnvelopeQueue{env(3)},
			[]string{"a1", "a2", "a3", "a4", "a5", "a6", "a7"},
			"7[env:all:t3,true{ca6}] | commit"},
		{"resumed after the last part, before the commit", start.InsideTxn(0x200, 8).WithParts(map[string]uint64{"env": 2}), 100, []EnvelopeQueue{env(3)},
			[]string{"a1", "a2", "a3", "a4", "a5", "a6", "a7"},
			"commit"},
		{"a part closed by another queue's: an empty last part at the commit", start, 100,
			[]EnvelopeQueue{env(2), {Queue: "other", Partition: "o", MaxEvents: 100, MaxBytes: 1 << 20}},
			[]string{"a1", "c1", "a2", "a3", "a4"},
			"2[env:all:t1,false{ca0 ca2} other:o:t1,false{cc1}]map[env:1 other:1] | 5[env:all:t2,true{ca3 ca4} other:o:t2,true{}] | commit"},
		{"plain events over the bundle close the parts; the changes after go on their own", start, 3, []EnvelopeQueue{env(100)},
			[]string{"a1", "p1", "p2", "p3", "p4", "p5"},
			"2[plain:c:pg:0a1b2c3d:0000000000000200:1 plain:c:pg:0a1b2c3d:0000000000000200:2 env:all:t1,false{ca0}]map[env:1] | " +
				"3[plain:c:pg:0a1b2c3d:0000000000000200:3] | 4[plain:c:pg:0a1b2c3d:0000000000000200:4] | 5[plain:c:pg:0a1b2c3d:0000000000000200:5] | " +
				"6[env:all:t2,true{}] | commit"},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnvTest(t, c.start, c.max, c.envs...)
			e.tx(0x200, c.ops...)
			if got := e.summary(); got != c.want {
				t.Errorf("got  %s\nwant %s", got, c.want)
			}
			// A second transaction starts from nothing.
			e.items = nil
			e.tx(0x300, "a9")
			if got, want := e.summary(), "1[env:all:t1,true{ca0}] | commit"; got != want {
				t.Errorf("next transaction: %s, want %s", got, want)
			}
		})
	}
}

// TestEnvelopePartsExactlyOnceAcrossRestarts decodes one large transaction over tables of two
// enveloped queues and a plain one through the bundler, "crashing" after random batches (the
// batches not acknowledged are lost, the decoder restarts at the last cover and the transaction is
// sent again from its start, as pgoutput does): every part of every queue is written exactly once
// and in order, the last one marked, their events are the transaction's in order, and every plain
// event is written once.
func TestEnvelopePartsExactlyOnceAcrossRestarts(t *testing.T) {
	afterLast := 0 // covers between the last parts and the commit
	for seed := uint64(1); seed <= 100; seed++ {
		rng := rand.New(rand.NewPCG(seed, 1))
		var ops []string
		for i, n := 0, 20+rng.IntN(200); i < n; i++ {
			ops = append(ops, []string{"a", "b", "c", "p", "m"}[rng.IntN(5)]+fmt.Sprint(i))
		}
		maxMessages := 1 + rng.IntN(20)
		envs := []EnvelopeQueue{{Queue: "env", Partition: "all", MaxEvents: 1 + rng.IntN(30), MaxBytes: 1 << 20},
			{Queue: "other", Partition: "o", MaxEvents: 1 + rng.IntN(30), MaxBytes: envelopeRoom + 200 + rng.IntN(2000)}}
		ptr := pointer.New(1, "0a1b2c3d", "s", "x", 0x100)
		var written []Event
		crashes := 0
		for done := false; !done; {
			e := newEnvTest(t, ptr, maxMessages, envs...)
			ss := testSession(maxMessages, ptr)
			ss.src.cfg.MaxBundleBytes = 1 << 20
			ss.lastIdleWrite = time.Now().Add(time.Hour) // a commit alone is moved to below, not through Redis
			errCrash := fmt.Errorf("crash")
			ack := func(b *Batch) error {
				if rng.IntN(8) == 0 && crashes < 20 {
					crashes++
					return errCrash
				}
				written = append(written, b.Events...)
				ptr = b.Cover
				if ptr.InTxn != nil && ptr.InTxn.Done == uint64(len(ops))+1 {
					afterLast++
				}
				ss.plan = b.Cover
				return nil
			}
			e.d.maxMessages = maxMessages
			push := func(it item) error {
				for {
					if ok, _ := ss.q.tryPush(it); ok {
						if rng.IntN(3) > 0 {
							return nil
						}
						// the bundler runs beside the reader: batches may be due now
						for {
							b, _, err := ss.bundle(context.Background())
							if err != nil || b == nil {
								return err
							}
							if err := ack(b); err != nil {
								return err
							}
						}
					}
					b, _, err := ss.bundle(context.Background())
					if err != nil || b == nil {
						t.Fatalf("seed %d: queue full and no batch (%v)", seed, err)
					}
					if err := ack(b); err != nil {
						return err
					}
				}
			}
			err := e.txWith(push, 0x200, ops...)
			for err == nil {
				b, _, berr := ss.bundle(context.Background())
				if berr != nil {
					t.Fatal(berr)
				}
				if b == nil {
					break
				}
				err = ack(b)
			}
			if items, _ := ss.q.peek(); err == nil && len(items) == 1 && items[0].kind == itemCommit {
				// The commit alone: the pointer-only write of an idle advance, which may be lost too.
				if rng.IntN(2) == 0 {
					continue
				}
				ptr = ptr.AtCommit(0x200)
			}
			done = err == nil && ptr.InTxn == nil && ptr.LSNValue() == 0x200
			if err == nil && !done {
				t.Fatalf("seed %d: stuck at %s", seed, ptr.Position())
			}
		}
		checkEnvelopes(t, seed, ops, written)
	}
	if afterLast == 0 {
		t.Error("no cover fell between a transaction's last parts and its commit")
	}
}

// txWith is tx with items going to emit.
func (e *envTest) txWith(emit func(item) error, commit pglogrepl.LSN, ops ...string) error {
	saved := e.items
	defer func() { e.items = saved }()
	var err error
	sink := func(it item) error {
		if err == nil {
			err = emit(it)
		}
		return err
	}
	d := e.d
	ctx := context.Background()
	if d.handle(ctx, &pglogrepl.BeginMessage{FinalLSN: commit, Xid: 42, CommitTime: time.Date(2026, 10, 3, 6, 15, 3, 583036000, time.UTC)}, sink) != nil {
		return err
	}
	for _, op := range ops {
		if op[0] == 'm' {
			if d.handle(ctx, &pglogrepl.LogicalDecodingMessage{Transactional: true, Prefix: PublishPrefix, Content: []byte(`{"queue":"env","partition":"x","payload":{"n":"` + op + `"}}`)}, sink) != nil {
				return err
			}
			continue
		}
		rel := uint32(strings.IndexByte("abpc", op[0]) + 1)
		b := []byte{'I', 0, 0, 0, byte(rel), 'N', 0, 2, 't', 0, 0, 0, byte(len(op))}
		b = append(b, op...)
		b = append(b, 't', 0, 0, 0, byte(len(op)))
		b = append(b, op...)
		if d.decode(ctx, b, sink) != nil {
			return err
		}
	}
	d.handle(ctx, &pglogrepl.CommitMessage{CommitLSN: commit}, sink)
	return err
}

// checkEnvelopes checks what a run of TestEnvelopePartsExactlyOnceAcrossRestarts wrote.
func checkEnvelopes(t *testing.T, seed uint64, ops []string, written []Event) {
	t.Helper()
	want := map[string][]string{} // queue → the seq of its events, in order
	for seq, op := range ops {
		q := map[byte]string{'a': "env", 'b': "env", 'm': "env", 'c': "other", 'p': "plain"}[op[0]]
		want[q] = append(want[q], fmt.Sprint(seq))
	}
	got := map[string][]string{}
	nextPart := map[string]uint64{}
	ended := map[string]bool{}
	ids := map[string]bool{}
	for _, ev := range written {
		key := ev.Queue + " " + ev.ID
		if ids[key] {
			t.Fatalf("seed %d: %s written twice", seed, key)
		}
		ids[key] = true
		if ev.Op != event.OpEnvelope {
			got[ev.Queue] = append(got[ev.Queue], ev.ID[strings.LastIndexByte(ev.ID, ':')+1:])
			continue
		}
		var env envelopeJSON
		if err := json.Unmarshal(ev.Payload, &env); err != nil {
			t.Fatal(err)
		}
		if env.Part != nextPart[ev.Queue]+1 || ended[ev.Queue] {
			t.Fatalf("seed %d: %s part %d after %d (ended %v)", seed, ev.Queue, env.Part, nextPart[ev.Queue], ended[ev.Queue])
		}
		if len(env.Events) == 0 && !env.Last {
			t.Fatalf("seed %d: %s part %d is empty and not the last", seed, ev.Queue, env.Part)
		}
		nextPart[ev.Queue], ended[ev.Queue] = env.Part, env.Last
		for _, raw := range env.Events {
			var c struct {
				Seq int `json:"seq"`
			}
			json.Unmarshal(raw, &c)
			got[ev.Queue] = append(got[ev.Queue], fmt.Sprint(c.Seq))
		}
	}
	for _, q := range []string{"env", "other", "plain"} {
		if strings.Join(got[q], ",") != strings.Join(want[q], ",") {
			t.Fatalf("seed %d: queue %s events\n%v\nwant\n%v", seed, q, got[q], want[q])
		}
		if q != "plain" && len(want[q]) > 0 && !ended[q] {
			t.Fatalf("seed %d: queue %s has no last part", seed, q)
		}
	}
}

func TestEnvelopeChunk(t *testing.T) {
	ev := func(seq int) Event {
		return Event{Queue: "env", Op: event.OpRead, Payload: []byte(fmt.Sprintf(`{"op":"r","seq":%d}`, seq))}
	}
	items := []item{
		{kind: itemChunk, commit: 0x500, events: []Event{ev(0), ev(1), ev(2)}, chunk: &chunkPart{rows: 3}},
		{kind: itemChunk, commit: 0x500, events: []Event{ev(3), ev(5)}, chunk: &chunkPart{rows: 6}},
		{kind: itemChunk, commit: 0x500, chunk: &chunkPart{rows: 7}}, // the rows after the last survivor were dropped
	}
	pos := event.Position{LSN: "0/500", TS: "2026-10-03T06:15:03.583036Z"}
	out := envelopeChunk(items, &EnvelopeQueue{Queue: "env", Partition: "p", MaxEvents: 2, MaxBytes: 1 << 20}, "pg:0a1b2c3d:s:0000000000000500", pos, 7)
	var got []string
	for i, it := range out {
		if it.chunk == nil || it.chunk.rows != items[i].chunk.rows {
			t.Fatalf("item %d lost its cursor", i)
		}
		var parts []string
		for _, e := range it.events {
			parts = append(parts, e.ID+" "+e.Partition+" "+string(e.Payload))
			if !json.Valid(e.Payload) || e.Op != event.OpEnvelope || e.Tx != "pg:0a1b2c3d:s:0000000000000500" || e.LSN != "0/500" || e.CreatedMs != 7 {
				t.Errorf("envelope %+v", e)
			}
		}
		got = append(got, strings.Join(parts, " + "))
	}
	want := []string{
		`pg:0a1b2c3d:s:0000000000000500:t1 p {"op":"x","id":"pg:0a1b2c3d:s:0000000000000500","lsn":"0/500","ts":"2026-10-03T06:15:03.583036Z","part":1,"last":false,"events":[{"op":"r","seq":0},{"op":"r","seq":1}]}` +
			` + pg:0a1b2c3d:s:0000000000000500:t2 p {"op":"x","id":"pg:0a1b2c3d:s:0000000000000500","lsn":"0/500","ts":"2026-10-03T06:15:03.583036Z","part":2,"last":false,"events":[{"op":"r","seq":2}]}`,
		`pg:0a1b2c3d:s:0000000000000500:t3 p {"op":"x","id":"pg:0a1b2c3d:s:0000000000000500","lsn":"0/500","ts":"2026-10-03T06:15:03.583036Z","part":3,"last":true,"events":[{"op":"r","seq":3},{"op":"r","seq":5}]}`,
		``,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if same := envelopeChunk([]item{{kind: itemChunk, events: []Event{ev(0)}}}, nil, "", pos, 0); len(same[0].events) != 1 || same[0].events[0].Op != event.OpRead {
		t.Error("a chunk of a queue without envelopes changed")
	}
}
