package tests

import (
	"encoding/json"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay/internal/oracle"
	"github.com/pgrelay/pgrelay/internal/pointer"
)

// envelopeKillRows is the size of TestEnvelopeLargeTransactionKilledHalfway's transaction:
// PGRELAY_ENVELOPE_ROWS (200000 for the full size, ~16 s), or 60,000 (120 parts, ~12 s).
func envelopeKillRows(t *testing.T) int {
	if s := os.Getenv("PGRELAY_ENVELOPE_ROWS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 2000 {
			t.Fatalf("PGRELAY_ENVELOPE_ROWS=%q: want a number of at least 2000", s)
		}
		return n
	}
	return 60000
}

// TestEnvelopeLargeTransactionKilledHalfway inserts 60,000 rows (envelopeKillRows) in one transaction into a table
// whose queue is enveloped, 500 events per part and at most two parts per batch, and kills pgrelay
// with SIGKILL when the pointer says about 40 % of the parts are in the queue. The queue must then
// hold the transaction's parts 1..n once each, in order, the last alone marked last, and their
// events must be the transaction's changes seq 0..rows-1, each exactly once and in order.
func TestEnvelopeLargeTransactionKilledHalfway(t *testing.T) {
	rows := envelopeKillRows(t)
	const perPart = 500
	parts := (rows + perPart - 1) / perPart
	e := newCDCEnv(t, "bigenv", `[{table: b, queue: q}]`, `
max_bundle_messages: 2
envelopes: [{queue: q, max_events: 500}]`)
	e.pg.Exec(`CREATE TABLE b (id int PRIMARY KEY, v text)`)
	p := e.start()
	e.waitPointer()
	t0 := time.Now()
	e.pg.Exec(`INSERT INTO b SELECT g, 'row ' || g FROM generate_series(0, $1 - 1) g`, rows)
	covers := map[uint64]bool{} // parts in the queue, as pointers inside the transaction said
	killedAt := uint64(0)
	deadline := time.Now().Add(5 * time.Minute)
	for {
		ptr := e.pointer()
		if ptr != nil && ptr.InTxn != nil {
			n := ptr.InTxn.Parts["q"]
			covers[n] = true
			if killedAt == 0 && n >= uint64(parts)*4/10 {
				p.Kill()
				killedAt = n
				p = e.start()
			}
		}
		if killedAt > 0 && ptr != nil && ptr.InTxn == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pointer %+v after 5 minutes (killed at part %d)", ptr, killedAt)
		}
		time.Sleep(20 * time.Millisecond)
	}
	elapsed := time.Since(t0)
	time.Sleep(2 * time.Second) // no late duplicates
	entries, err := oracle.ReadQueue(e.ctx, e.rd.Client(), "pgrelay", "q")
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != parts {
		t.Errorf("%d messages, want %d parts", len(entries), parts)
	}
	next := 0 // the seq (and id) the next event must have
	tx := ""
	for i, en := range entries {
		if i > 0 && en.Off != entries[i-1].Off+1 {
			t.Fatalf("offset %d after %d", en.Off, entries[i-1].Off)
		}
		var env struct {
			oracle.Envelope
			Events []struct {
				Op  string         `json:"op"`
				Key map[string]int `json:"key"`
				Seq int            `json:"seq"`
			} `json:"events"`
		}
		if err := json.Unmarshal(en.Payload, &env); err != nil || env.Op != "x" {
			t.Fatalf("entry %s is not an envelope (%v): %.200s", en.ID, err, en.Payload)
		}
		if tx == "" {
			tx = env.ID
		}
		if env.ID != tx || en.Tx != tx {
			t.Fatalf("two transactions: %s and %s (entry tx %s)", tx, env.ID, en.Tx)
		}
		if env.Part != uint64(i+1) || env.Last != (i == len(entries)-1) || en.ID != pointer.EnvelopeID(tx, env.Part) {
			t.Fatalf("message %d: part %d, last %v, id %s", i, env.Part, env.Last, en.ID)
		}
		for _, ev := range env.Events {
			if ev.Op != "c" || ev.Seq != next || ev.Key["id"] != next {
				t.Fatalf("part %d: event %s id %d seq %d, want id and seq %d", env.Part, ev.Op, ev.Key["id"], ev.Seq, next)
			}
			next++
		}
	}
	if next != rows {
		t.Errorf("%d events in the parts, want %d", next, rows)
	}
	if killedAt == 0 || killedAt >= uint64(parts) || len(covers) < 3 {
		t.Errorf("killed at part %d of %d, %d distinct covers seen inside the transaction", killedAt, parts, len(covers))
	}
	t.Logf("%d rows in %d parts in %s, killed with %d parts in the queue, %d covers seen inside the transaction",
		rows, len(entries), elapsed.Round(time.Millisecond), killedAt, len(covers))
}
