package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/redis/go-redis/v9"
	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/pgrelay/pgrelay/internal/cdctest"
	"github.com/pgrelay/pgrelay/internal/follow"
	"github.com/pgrelay/pgrelay/internal/queue"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// The load-then-follow tests: writers apply random non-idempotent deltas to accounts (UPDATE
// accounts SET balance = balance + x) and publish the same delta in the same transaction
// (pgrelay.publish('q', <account>, {"delta": x})); a consumer loads the balances and then follows
// the queue, applying balance += delta from the `m` events. Once the writers have stopped and the
// consumer has read and acked everything, its balances must equal the table's exactly: a
// transaction missed or applied twice shows as a wrong balance. Deltas are positive, so a lost
// transaction always shows.

const lfAccounts = 20

type loadFollowEnv struct {
	*cdcEnv
	pg *testenv.Postgres
}

// newLoadFollowEnv is PostgreSQL with the accounts table, Redis, and pg_cdc (the binary) streaming
// accounts into queue q, with pgrelay.publish() installed.
func newLoadFollowEnv(t *testing.T) (*loadFollowEnv, *testenv.Process) {
	e := &loadFollowEnv{cdcEnv: newCDCEnv(t, "follow", `[{table: public.accounts, queue: q}]`, "")}
	e.pg = e.cdcEnv.pg
	e.pg.Exec(`CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL)`)
	e.pg.Exec(`INSERT INTO accounts SELECT i, 1000 * i FROM generate_series(1, $1::int) i`, lfAccounts)
	p := e.start()
	e.waitPointer()
	cdctest.WaitEvery(t, time.Minute, 20*time.Millisecond, "pgrelay.publish() installed", func() (bool, string) {
		var ok bool
		err := e.pg.Pool().QueryRow(e.ctx, `SELECT to_regprocedure('pgrelay.publish(text,text,jsonb)') IS NOT NULL`).Scan(&ok)
		return err == nil && ok, fmt.Sprint(err)
	})
	// The queue exists once a producer has written to it: a change the followers ignore (not an
	// m event) creates it, so the first follower's positions never meet a queue not there yet.
	e.pg.Exec(`UPDATE accounts SET balance = balance WHERE id = 1`)
	cdctest.WaitEvery(t, time.Minute, 20*time.Millisecond, "the queue created", func() (bool, string) {
		_, err := queue.ReadPositions(e.ctx, e.rd.Client(), queue.NewLayout(""), e.queue)
		return err == nil, fmt.Sprint(err)
	})
	return e, p
}

// accountTx is one writer transaction: 1 to 3 accounts (in id order, so writers never deadlock),
// each balance += x with the same x published to the account's partition; one in ten rolls back.
func (e *loadFollowEnv) accountTx(rng *rand.Rand) bool {
	ids := map[int]bool{}
	for n := 1 + rng.IntN(3); len(ids) < n; {
		ids[1+rng.IntN(lfAccounts)] = true
	}
	var sql strings.Builder
	sql.WriteString("BEGIN;\n")
	for _, id := range slices.Sorted(func(yield func(int) bool) {
		for id := range ids {
			if !yield(id) {
				return
			}
		}
	}) {
		x := 1 + rng.IntN(100)
		fmt.Fprintf(&sql, "UPDATE accounts SET balance = balance + %d WHERE id = %d;\n", x, id)
		fmt.Fprintf(&sql, "SELECT pgrelay.publish('q', '%d', '{\"delta\": %d}');\n", id, x)
	}
	commit := rng.IntN(10) > 0
	if commit {
		sql.WriteString("COMMIT;")
	} else {
		sql.WriteString("ROLLBACK;")
	}
	_, err := e.pg.Pool().Exec(e.ctx, sql.String())
	return err == nil && commit
}

// balances reads the accounts table.
func (e *loadFollowEnv) balances(t *testing.T) map[string]int64 {
	t.Helper()
	rows, err := e.pg.Pool().Query(e.ctx, `SELECT id::text, balance FROM accounts`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var id string
		var b int64
		if err := rows.Scan(&id, &b); err != nil {
			t.Fatal(err)
		}
		out[id] = b
	}
	return out
}

// follower is a consumer's state: the balances it loaded plus the deltas it applied.
type follower struct {
	group string
	mu    sync.Mutex
	state map[string]int64
	stop  func()
}

// apply applies one change event: balance += delta for an `m` event; other events are ignored.
func (f *follower) apply(t *testing.T, partition string, payload []byte) {
	var ev struct {
		Op    string `json:"op"`
		After struct {
			Delta *int64 `json:"delta"`
		} `json:"after"`
	}
	if err := json.Unmarshal(payload, &ev); err != nil {
		t.Errorf("group %s: payload %s: %v", f.group, clip(string(payload)), err)
		return
	}
	if ev.Op != "m" {
		return
	}
	if ev.After.Delta == nil {
		t.Errorf("group %s: an m event without a delta: %s", f.group, clip(string(payload)))
		return
	}
	f.mu.Lock()
	f.state[partition] += *ev.After.Delta
	f.mu.Unlock()
}

func (f *follower) balances() map[string]int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[string]int64, len(f.state))
	for k, v := range f.state {
		out[k] = v
	}
	return out
}

// load runs step 3: the balances as of a REPEATABLE READ snapshot, with the snapshot and the WAL
// insert position its first statement read.
func (e *loadFollowEnv) load(t *testing.T) (state map[string]int64, snap, lsn string) {
	t.Helper()
	conn := e.conn()
	tx, snap, lsn, err := follow.Begin(e.ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := tx.Query(e.ctx, `SELECT id::text, balance FROM accounts`)
	if err != nil {
		t.Fatal(err)
	}
	state = map[string]int64{}
	for rows.Next() {
		var id string
		var b int64
		if err := rows.Scan(&id, &b); err != nil {
			t.Fatal(err)
		}
		state[id] = b
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(e.ctx); err != nil {
		t.Fatal(err)
	}
	return state, snap, lsn
}

// waitCommitted runs step 2 on a connection of its own.
func (e *loadFollowEnv) waitCommitted(t *testing.T) error {
	c, err := pgconn.Connect(e.ctx, e.pg.DSN())
	if err != nil {
		return err
	}
	defer c.Close(e.ctx)
	return follow.WaitCommitted(e.ctx, c, nil)
}

// startFollower starts queue group `group` with the queue package's consumer at positions ps after
// a load of state with snap and lsn.
func (e *loadFollowEnv) startFollower(t *testing.T, group string, ps []queue.Position, state map[string]int64, snap, lsn string) *follower {
	t.Helper()
	start, err := queue.ParseStart(queue.PositionsText(ps), snap, lsn)
	if err != nil {
		t.Fatal(err)
	}
	c, err := queue.NewConsumer(e.rd.Client(), queue.ConsumerConfig{Queue: e.queue, Group: group, Start: start,
		Block: 200 * time.Millisecond, LeaseTTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(e.ctx); err != nil {
		t.Fatalf("group %s: %v", group, err)
	}
	f := &follower{group: group, state: state}
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			d, err := c.Read(ctx)
			if err != nil {
				return
			}
			for _, en := range d.Entries {
				f.apply(t, en.Partition, en.Payload)
			}
			if err := c.Ack(ctx, d); err != nil && ctx.Err() == nil {
				t.Errorf("group %s: ack: %v", group, err)
			}
		}
	}()
	f.stop = func() {
		cancel()
		<-done
		_ = c.Close(context.Background())
	}
	t.Cleanup(f.stop)
	return f
}

// loadThenFollow runs the recipe with the queue package: positions, the wait (unless skipWait: the
// negative case), the load, the group. pause, when not nil, sleeps between the steps.
func (e *loadFollowEnv) loadThenFollow(t *testing.T, group string, skipWait bool, pause func()) *follower {
	t.Helper()
	if pause == nil {
		pause = func() {}
	}
	ps, err := queue.ReadPositions(e.ctx, e.rd.Client(), queue.NewLayout(""), e.queue)
	if err != nil {
		t.Fatal(err)
	}
	pause()
	if !skipWait {
		if err := e.waitCommitted(t); err != nil {
			t.Fatal(err)
		}
		pause()
	}
	state, snap, lsn := e.load(t)
	pause()
	return e.startFollower(t, group, ps, state, snap, lsn)
}

// drained waits until every commit so far is in the queue (the source's pointer covers the WAL
// insert position) and each group has read and acked every entry of every shard.
func (e *loadFollowEnv) drained(t *testing.T, groups ...string) {
	t.Helper()
	var target string
	if err := e.pg.Pool().QueryRow(e.ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&target); err != nil {
		t.Fatal(err)
	}
	end, _ := pglogrepl.ParseLSN(target)
	cdctest.WaitEvery(t, 60*time.Second, 50*time.Millisecond, "pg_cdc to catch up", func() (bool, string) {
		p := e.pointer()
		if p == nil {
			return false, "no pointer"
		}
		return p.LSNValue()+1 >= end, fmt.Sprintf("pointer %s, WAL %s", p.LSN, target)
	})
	rdb := e.rd.Client()
	l := queue.NewLayout("")
	shards, err := queue.ShardCount(e.ctx, rdb, l, e.queue)
	if err != nil || shards == 0 {
		t.Fatalf("shards %d: %v", shards, err)
	}
	for _, g := range groups {
		cdctest.WaitEvery(t, 60*time.Second, 50*time.Millisecond, "group "+g+" to read and ack everything", func() (bool, string) {
			for n := 0; n < shards; n++ {
				info, err := rdb.XInfoStream(e.ctx, l.Stream(e.queue, n)).Result()
				if err != nil {
					return false, err.Error()
				}
				gs, err := rdb.XInfoGroups(e.ctx, l.Stream(e.queue, n)).Result()
				if err != nil {
					return false, err.Error()
				}
				i := slices.IndexFunc(gs, func(x redis.XInfoGroup) bool { return x.Name == g })
				if i < 0 {
					return false, fmt.Sprintf("shard %d: no group", n)
				}
				if gs[i].Pending != 0 || gs[i].LastDeliveredID != info.LastGeneratedID {
					return false, fmt.Sprintf("shard %d: pending %d, delivered up to %s of %s", n, gs[i].Pending, gs[i].LastDeliveredID, info.LastGeneratedID)
				}
			}
			return true, ""
		})
	}
}

// checkExact fails unless f's balances equal the table's.
func (e *loadFollowEnv) checkExact(t *testing.T, f *follower, want map[string]int64) {
	t.Helper()
	got := f.balances()
	var diffs []string
	for id, w := range want {
		if got[id] != w {
			diffs = append(diffs, fmt.Sprintf("account %s: %d, table %d (%+d)", id, got[id], w, got[id]-w))
		}
	}
	if len(got) != len(want) {
		diffs = append(diffs, fmt.Sprintf("%d accounts, table %d", len(got), len(want)))
	}
	if len(diffs) > 0 {
		slices.Sort(diffs)
		t.Errorf("group %s is not the table: %s", f.group, strings.Join(diffs, "; "))
	}
}

// TestLoadThenFollowExact: 20 consumers, each with its own seed, load and follow while two writers
// apply random deltas; each starts at a random moment of a writer run (four runs of five consumers),
// with random pauses between its steps so transactions commit between the positions, the wait and
// the load. Every one ends equal to the table.
func TestLoadThenFollowExact(t *testing.T) {
	e, _ := newLoadFollowEnv(t)
	const runs, perRun = 4, 5
	for run := 0; run < runs; run++ {
		stop := make(chan struct{})
		wait := cdctest.Writers(uint64(run+1), 2, 4, stop, e.accountTx)
		var fs []*follower
		for k := 0; k < perRun; k++ {
			seed := uint64(run*perRun + k + 1)
			rng := rand.New(rand.NewPCG(seed, 7))
			time.Sleep(time.Duration(rng.IntN(150)) * time.Millisecond)
			fs = append(fs, e.loadThenFollow(t, fmt.Sprintf("s%d", seed), false, func() {
				time.Sleep(time.Duration(rng.IntN(40)) * time.Millisecond)
			}))
		}
		time.Sleep(200 * time.Millisecond)
		close(stop)
		committed := wait()
		groups := make([]string, len(fs))
		for i, f := range fs {
			groups[i] = f.group
		}
		e.drained(t, groups...)
		want := e.balances(t)
		for _, f := range fs {
			e.checkExact(t, f, want)
			f.stop()
		}
		if t.Failed() {
			t.FailNow()
		}
		t.Logf("run %d: %d transactions committed, consumers %v exact", run+1, committed, groups)
	}
}

// TestLoadThenFollowWhilePgCDCLags: pg_cdc is stopped while the writers go on, so the positions lag
// far behind the commits; the consumer takes them with `pgrelay queue position --pg --json` (the
// binary), loads, and follows through the redis_queue input configured with start_after_load.
// pg_cdc starts again after the load: everything committed before the load comes after the
// positions and must be skipped, everything after it applied.
func TestLoadThenFollowWhilePgCDCLags(t *testing.T) {
	e, p := newLoadFollowEnv(t)
	stop := make(chan struct{})
	var commits sync.WaitGroup
	commits.Add(1)
	var committed int
	go func() {
		defer commits.Done()
		committed = cdctest.Writers(11, 2, 4, stop, e.accountTx)()
	}()
	time.Sleep(300 * time.Millisecond)
	p.Signal(syscall.SIGTERM)
	if err := p.Wait(30 * time.Second); err != nil {
		t.Fatalf("pg_cdc did not stop: %v", err)
	}
	var before int64
	_ = e.pg.Pool().QueryRow(e.ctx, `SELECT sum(balance) FROM accounts`).Scan(&before)
	time.Sleep(300 * time.Millisecond) // commits pg_cdc has not sent

	out, err := exec.Command(testenv.Binary(t), "queue", "position", "--url", e.rd.URL(), "--pg", e.pg.DSN(), "--json", e.queue).Output()
	if err != nil {
		t.Fatalf("pgrelay queue position: %v\n%s", err, out)
	}
	var pos struct {
		Positions string `json:"positions"`
		Waited    bool   `json:"waited"`
	}
	if err := json.Unmarshal(out, &pos); err != nil || !pos.Waited {
		t.Fatalf("pgrelay queue position: %v\n%s", err, out)
	}
	state, snap, lsn := e.load(t)
	var atLoad int64
	for _, b := range state {
		atLoad += b
	}
	if atLoad == before {
		t.Fatal("no transaction committed while pg_cdc was stopped, before the load: the case is not exercised")
	}

	f := &follower{group: "lagging", state: state}
	b := service.NewStreamBuilder()
	b.SetLoggerYAML("level: warn")
	if err := b.AddInputYAML(fmt.Sprintf(`
redis_queue:
  url: %s
  queue: %s
  group: %s
  block: 200ms
  start_after_load:
    positions: %q
    snapshot: %q
    lsn: %q
`, e.rd.URL(), e.queue, f.group, pos.Positions, snap, lsn)); err != nil {
		t.Fatal(err)
	}
	cdctest.RunConsumer(t, b, func(_ context.Context, batch service.MessageBatch) error {
		for _, m := range batch {
			part, _ := m.MetaGet("partition")
			payload, err := m.AsBytes()
			if err != nil {
				return err
			}
			f.apply(t, part, payload)
		}
		return nil
	})

	time.Sleep(300 * time.Millisecond)
	e.start() // pg_cdc catches up: the commits before the load arrive after the positions
	time.Sleep(500 * time.Millisecond)
	close(stop)
	commits.Wait()
	e.drained(t, f.group)
	e.checkExact(t, f, e.balances(t))
	t.Logf("%d transactions committed; the load saw %d of deltas pg_cdc had not sent", committed, atLoad-before)
}

// TestLoadThenFollowThroughHeldCommits: a synchronous standby that never answers holds the
// writers' commits: flushed, decoded and in the queue before the positions are read, yet invisible
// to every snapshot. Consumer "exact" reads the positions and waits (step 2) until the commits are
// released; consumer "nowait" skips the wait and loads at once. Then the writers go on and stop.
// "exact" equals the table; "nowait" is short of the held transactions (they are before its
// positions and not in its load): the window step 2 closes.
func TestLoadThenFollowThroughHeldCommits(t *testing.T) {
	e, _ := newLoadFollowEnv(t)
	stop := make(chan struct{})
	var commits sync.WaitGroup
	commits.Add(1)
	go func() { defer commits.Done(); cdctest.Writers(21, 2, 4, stop, e.accountTx)() }()
	time.Sleep(300 * time.Millisecond)

	e.pg.HoldCommits()
	// Both writers stopped: one or both at their commit, the other possibly waiting for a row lock a
	// held transaction keeps (they update the same accounts).
	cdctest.WaitEvery(t, 30*time.Second, 20*time.Millisecond, "both writers held", func() (bool, string) {
		var held, locked int
		err := e.pg.Pool().QueryRow(e.ctx, `SELECT count(*) FILTER (WHERE wait_event = 'SyncRep'),
			count(*) FILTER (WHERE wait_event_type = 'Lock') FROM pg_stat_activity`).Scan(&held, &locked)
		return err == nil && held >= 1 && held+locked >= 2, fmt.Sprintf("%d held, %d waiting for a lock, %v", held, locked, err)
	})
	var flushed string
	if err := e.pg.Pool().QueryRow(e.ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&flushed); err != nil {
		t.Fatal(err)
	}
	end, _ := pglogrepl.ParseLSN(flushed)
	cdctest.WaitEvery(t, 30*time.Second, 20*time.Millisecond, "pg_cdc to have the held commits in the queue", func() (bool, string) {
		p := e.pointer()
		return p != nil && p.LSNValue()+1 >= end, "pointer behind " + flushed
	})

	// "exact": positions now, then the wait, which lasts until the commits are released
	ps, err := queue.ReadPositions(e.ctx, e.rd.Client(), queue.NewLayout(""), e.queue)
	if err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- e.waitCommitted(t) }()
	// "nowait": positions, then the load at once, with the held commits invisible
	nowait := e.loadThenFollow(t, "nowait", true, nil)
	select {
	case err := <-waited:
		t.Fatalf("step 2 returned while commits are held: %v", err)
	case <-time.After(time.Second):
	}
	e.pg.ReleaseCommits()
	select {
	case err := <-waited:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("step 2 did not return after the commits were released")
	}
	state, snap, lsn := e.load(t)
	exact := e.startFollower(t, "exact", ps, state, snap, lsn)

	time.Sleep(500 * time.Millisecond)
	close(stop)
	commits.Wait()
	e.drained(t, "exact", "nowait")
	want := e.balances(t)
	e.checkExact(t, exact, want)
	short := 0
	for id, b := range nowait.balances() {
		if b > want[id] {
			t.Errorf("without step 2, account %s is above the table: %d > %d", id, b, want[id])
		}
		if b < want[id] {
			short++
		}
	}
	if short == 0 {
		t.Fatal("without step 2 the consumer still equals the table: the held commits were not in the window")
	}
	t.Logf("without step 2, %d accounts miss the held transactions' deltas", short)
}
