package tests

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay/internal/cdctest"
	"github.com/pgrelay/pgrelay/internal/lease"
	"github.com/pgrelay/pgrelay/internal/oracle"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

const writerTable = `CREATE TABLE w ` + cdctest.WriterColumns

// TestSourceSurvivesSIGKILLUnderRandomWriter kills pgrelay three times while two writers run
// random transactions; the queue must replay to the table with every id once, and the slot
// must never be confirmed past the pointer.
func TestSourceSurvivesSIGKILLUnderRandomWriter(t *testing.T) {
	e := newCDCEnv(t, "kill", `[{table: w, queue: q}]`, "max_bundle_messages: 7")
	e.pg.Exec(writerTable)
	p := e.start()
	e.waitPointer()
	stop := make(chan struct{})
	samples, waitSampler := e.sampleSlot(stop)
	stopWriter := make(chan struct{})
	wait := e.randomWriter(42, stopWriter)
	rng := rand.New(rand.NewPCG(7, 7))
	for i := 0; i < 3; i++ {
		time.Sleep(time.Duration(1000+rng.IntN(1500)) * time.Millisecond)
		p.Kill()
		time.Sleep(time.Duration(rng.IntN(500)) * time.Millisecond)
		p = e.start()
	}
	time.Sleep(time.Second)
	close(stopWriter)
	committed := wait()
	res := e.converge("public.w", "id")
	close(stop)
	waitSampler()
	if committed < 50 || samples.Load() < 10 {
		t.Errorf("too little happened: %d transactions, %d slot samples", committed, samples.Load())
	}
	t.Logf("%d transactions, %d events, %d slot samples", committed, res.Events, samples.Load())
}

// TestSourceLargeTransactionKilledHalfway inserts 200,000 rows in one transaction, read in
// pieces of 500, and kills pgrelay when the pointer is inside it: exactly 200,000 messages
// must come out, seq 0..199,999 once each, with several covers seen.
func TestSourceLargeTransactionKilledHalfway(t *testing.T) {
	if testing.Short() {
		t.Skip("large transaction")
	}
	const rows = 200000
	e := newCDCEnv(t, "big", `[{table: b, queue: q, partition_by: single}]`, "max_bundle_messages: 500")
	e.pg.Exec(`CREATE TABLE b (id int PRIMARY KEY, v text)`)
	p := e.start()
	e.waitPointer()
	e.pg.Exec(`INSERT INTO b SELECT g, 'row ' || g FROM generate_series(0, $1 - 1) g`, rows)
	covers := map[uint64]bool{}
	killed := false
	deadline := time.Now().Add(5 * time.Minute)
	for {
		ptr := e.pointer()
		if ptr != nil && ptr.InTxn != nil {
			covers[ptr.InTxn.Done] = true
			if !killed && ptr.InTxn.Done > rows*4/10 {
				p.Kill()
				killed = true
				p = e.start()
			}
		}
		if killed && ptr != nil && ptr.InTxn == nil && len(covers) > 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pointer %+v after 5 minutes (killed %v)", ptr, killed)
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(2 * time.Second)
	entries, err := oracle.ReadQueue(e.ctx, e.rd.Client(), "pgrelay", "q")
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != rows {
		t.Errorf("%d messages, want %d", len(entries), rows)
	}
	seen := make([]int, rows)
	tx := ""
	for i, en := range entries {
		if i > 0 && en.Off != entries[i-1].Off+1 {
			t.Fatalf("offset %d after %d", en.Off, entries[i-1].Off)
		}
		if tx == "" {
			tx = en.Tx
		}
		if en.Tx != tx {
			t.Fatalf("two transactions: %s and %s", tx, en.Tx)
		}
		seq, err := strconv.Atoi(en.ID[strings.LastIndexByte(en.ID, ':')+1:])
		if err != nil || seq >= rows {
			t.Fatalf("id %s", en.ID)
		}
		seen[seq]++
	}
	for seq, n := range seen {
		if n != 1 {
			t.Fatalf("seq %d seen %d times", seq, n)
		}
	}
	if len(covers) < 3 {
		t.Errorf("only %d distinct covers seen", len(covers))
	}
	t.Logf("%d covers seen inside the transaction", len(covers))
}

// TestSourceTwoReplicasTakeOverAndHandOver runs two pgrelay processes on one config: SIGKILL of
// the owner → the other takes over within 2×TTL; SIGTERM of the new owner → the lease is
// released before it would have expired. The queue stays exact throughout.
func TestSourceTwoReplicasTakeOverAndHandOver(t *testing.T) {
	e := newCDCEnv(t, "pair", `[{table: w, queue: q}]`, "")
	e.pg.Exec(writerTable)
	a := e.start()
	e.waitPointer()
	b := e.start()
	stopWriter := make(chan struct{})
	wait := e.randomWriter(9, stopWriter)
	time.Sleep(2 * time.Second)
	owner := func() string { o, _, _ := lease.Holder(e.ctx, e.rd.Client(), e.leaseKey()); return o }
	first := owner()
	if first == "" {
		t.Fatal("nobody owns the source")
	}
	// The owner logs that it took the lease.
	victim, other := a, b
	if !strings.Contains(a.Output(), "took the lease") {
		victim, other = b, a
	}
	killedAt := time.Now()
	victim.Kill()
	for owner() == first || owner() == "" {
		if time.Since(killedAt) > 2*3*time.Second+5*time.Second {
			t.Fatalf("no takeover %s after the owner was killed", time.Since(killedAt))
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("takeover after %s", time.Since(killedAt))
	second := owner()
	victim = e.start() // the old owner comes back as standby
	time.Sleep(2 * time.Second)
	_, ttl, _ := lease.Holder(e.ctx, e.rd.Client(), e.leaseKey())
	termAt := time.Now()
	expires := termAt.Add(ttl)
	other.Signal(syscall.SIGTERM)
	for owner() == second {
		time.Sleep(10 * time.Millisecond)
	}
	if released := time.Now(); !released.Before(expires) {
		t.Errorf("lease released at +%s, after it would have expired (+%s)", released.Sub(termAt), ttl)
	}
	if err := other.Wait(30 * time.Second); err != nil {
		t.Errorf("SIGTERM exit: %v", err)
	}
	cdctest.WaitEvery(t, 15*time.Second, 20*time.Millisecond, "a takeover after the hand-over", func() (bool, string) {
		o := owner()
		return o != "" && o != second, "owner " + o
	})
	time.Sleep(2 * time.Second)
	close(stopWriter)
	wait()
	e.converge("public.w", "id")
	_ = victim
}

// TestSourceResumesAfterPostgresAndRedisRestarts kills PostgreSQL and then Redis under a writer:
// pg_cdc backs off, resumes from the pointer, and the queue still replays to the table exactly.
func TestSourceResumesAfterPostgresAndRedisRestarts(t *testing.T) {
	e := newCDCEnv(t, "restart", `[{table: w, queue: q}]`, "max_bundle_messages: 5")
	e.pg.Exec(writerTable)
	e.start()
	e.waitPointer()
	stopWriter := make(chan struct{})
	wait := e.randomWriter(3, stopWriter)
	time.Sleep(1500 * time.Millisecond)
	e.pg.Kill()
	time.Sleep(500 * time.Millisecond)
	e.pg.Restart()
	time.Sleep(2 * time.Second)
	e.rd.Kill()
	time.Sleep(500 * time.Millisecond)
	e.rd.Restart()
	time.Sleep(3 * time.Second)
	close(stopWriter)
	committed := wait()
	res := e.converge("public.w", "id")
	t.Logf("%d transactions, %d events", committed, res.Events)
}

// TestSourceSIGKILLWithTransactionInFlight kills pgrelay three times while one of its queue
// writes (an optimistic transaction) is open on Redis: Redis's writes are paused (CLIENT PAUSE
// WRITE), so the transaction stops among its queued commands (CLIENT LIST shows a client inside
// MULTI, blocked); then SIGKILL, then the pause is lifted. Whether Redis dropped the transaction
// with the connection or ran its EXEC first, the restarted process writes each change exactly
// once: the queue replays to the table. Redis ran the writes as transactions (EXEC calls), most of
// them primed (the WATCH, reads and MULTI sent behind the previous write's EXEC), so the kills
// catch primed transactions in flight.
func TestSourceSIGKILLWithTransactionInFlight(t *testing.T) {
	e := newCDCEnv(t, "txkill", `[{table: w, queue: q}]`, "max_bundle_messages: 7")
	e.pg.Exec(writerTable)
	p := e.start()
	e.waitPointer()
	rc := e.rd.Client()
	stopWriter := make(chan struct{})
	wait := e.randomWriter(11, stopWriter)
	inMulti := func() (bool, string) {
		list := rc.ClientList(e.ctx).Val()
		for _, line := range strings.Split(list, "\n") {
			for _, f := range strings.Fields(line) {
				if flags, ok := strings.CutPrefix(f, "flags="); ok && strings.Contains(flags, "x") && strings.Contains(flags, "b") {
					return true, line
				}
			}
		}
		return false, list
	}
	pos := func() string {
		if ptr := e.pointer(); ptr != nil {
			return ptr.Pos
		}
		return ""
	}
	for i := 0; i < 3; i++ {
		// The process must be writing batches when Redis is paused: one still starting (its
		// lease, its status) blocks on the pause before it opens any queue transaction.
		from := pos()
		cdctest.Wait(t, 30*time.Second, fmt.Sprintf("kill %d: the pointer moves past %s", i+1, from), func() (bool, string) {
			p := pos()
			return p != from, p
		})
		time.Sleep(300 * time.Millisecond)
		if err := rc.Do(e.ctx, "CLIENT", "PAUSE", 20000, "WRITE").Err(); err != nil {
			t.Fatal(err)
		}
		var ok bool
		var seen string
		for deadline := time.Now().Add(15 * time.Second); !ok && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			ok, seen = inMulti()
		}
		p.Kill()
		if err := rc.Do(e.ctx, "CLIENT", "UNPAUSE").Err(); err != nil {
			t.Fatal(err)
		}
		if !ok {
			t.Fatalf("kill %d: no transaction open on Redis: %s", i+1, seen)
		}
		t.Logf("kill %d with %s", i+1, seen)
		p = e.restartAfterKill(i + 1)
	}
	time.Sleep(time.Second)
	close(stopWriter)
	committed := wait()
	res := e.converge("public.w", "id")
	calls := map[string]int{}
	for _, line := range strings.Split(rc.Info(e.ctx, "commandstats").Val(), "\n") {
		if cmd, rest, ok := strings.Cut(strings.TrimPrefix(line, "cmdstat_"), ":calls="); ok {
			calls[cmd], _ = strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
		}
	}
	execs := calls["exec"]
	if execs < 10 {
		t.Errorf("Redis ran %d EXECs: the writes were not transactions", execs)
	}
	// the writes were primed: a primed write reads the TYPE of all 16 shards for the next one, a
	// write reading for itself that of the at most 7 shards its bundle touches (after an aborted
	// primed EXEC, priming backs off for a while: not every write is primed)
	types := float64(calls["type"]) / float64(execs)
	if types <= 7 {
		t.Errorf("%.1f TYPEs per EXEC: the writes were not primed", types)
	}
	t.Logf("%d transactions, %d events, %d EXECs, %.1f TYPEs per EXEC", committed, res.Events, execs, types)
}

// TestSourceSIGKILLWithTwoBatchesInFlight runs pg_cdc into redis_queue with max_in_flight 2 and
// metadata: false (the shipped config's pair: the output takes each message's keys from pg_cdc's
// batch) through a proxy, and kills pgrelay three times while two of its batches are in flight on one
// connection: the proxy holds Redis's replies until the connection has sent a batch's entries
// behind an EXEC it has no reply to (the next batch queued behind the one being written); then
// SIGKILL, and the replies are let go. Redis ran the first EXEC and had the second batch queued
// inside the MULTI that follows it, which dies with the connection; the restarted process writes
// each change exactly once: the queue replays to the table. With one batch in flight nothing is
// ever sent behind an unanswered EXEC, and the test fails.
func TestSourceSIGKILLWithTwoBatchesInFlight(t *testing.T) {
	pg := testenv.StartPostgres(t)
	var proxy *testenv.HoldProxy
	e := newCDCEnvWith(t, pg, pg.DSN(), "winkill", `[{table: w, queue: q}]`, func(p *cdctest.Pipeline, rd *testenv.Redis) {
		proxy = testenv.StartHoldProxy(t, rd.Addr())
		// as config/pg_cdc_redis_queue.yaml: two in flight, messages without metadata
		p.Redis, p.Source, p.Output = proxy.URL(), "max_bundle_messages: 7\nmetadata: false", "max_in_flight: 2"
	})
	e.pg.Exec(writerTable)
	p := e.start()
	e.waitPointer()
	stopWriter := make(chan struct{})
	wait := e.randomWriter(13, stopWriter)
	for i := 0; i < 3; i++ {
		caught := false
		for deadline := time.Now().Add(30 * time.Second); !caught && time.Now().Before(deadline); {
			time.Sleep(300 * time.Millisecond)
			before := proxy.Pipelined()
			proxy.Hold()
			for held := time.Now(); !caught && time.Since(held) < 500*time.Millisecond; time.Sleep(5 * time.Millisecond) {
				caught = proxy.Pipelined() > before
			}
			if caught {
				p.Kill()
			}
			proxy.Release()
		}
		if !caught {
			t.Fatalf("kill %d: no batch was ever sent behind an unanswered EXEC", i+1)
		}
		p = e.restartAfterKill(i + 1)
	}
	time.Sleep(time.Second)
	close(stopWriter)
	committed := wait()
	res := e.converge("public.w", "id")
	t.Logf("%d transactions, %d events, %d entries sent behind an unanswered EXEC", committed, res.Events, proxy.Pipelined())
}

// restartAfterKill starts pgrelay again after kill number n and waits until the new process holds
// the lease (the killed one's expires first): it streams from then on.
func (e *cdcEnv) restartAfterKill(n int) *testenv.Process {
	e.t.Helper()
	rc := e.rd.Client()
	held := rc.Get(e.ctx, e.leaseKey()).Val()
	p := e.start()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if v := rc.Get(e.ctx, e.leaseKey()).Val(); v != "" && v != held {
			return p
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("kill %d: the restarted process never took the lease", n)
		}
	}
}
