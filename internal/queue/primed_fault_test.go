package queue

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgrelay/pgrelay/internal/lease"
	"github.com/pgrelay/pgrelay/internal/redisconn"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// Fault tests of the primed write (write_tx.go): the connection that holds the next write's
// WATCH, reads and MULTI is killed between batches or with a batch's EXEC in flight, Redis
// restarts under it, and the write goes through Redis Sentinel with least-privilege ACL users
// and a failover. Each reads the queue back (checkQueue) and the pointer.

// multiClient is a connection of CLIENT LIST inside MULTI (flags has x).
type multiClient struct {
	id, flags, cmd string
}

// inMulti lists the connections inside MULTI.
func inMulti(t *testing.T, rdb redis.Cmdable) []multiClient {
	t.Helper()
	list, err := rdb.ClientList(context.Background()).Result()
	if err != nil {
		t.Fatalf("CLIENT LIST: %v", err)
	}
	var out []multiClient
	for _, line := range strings.Split(list, "\n") {
		var c multiClient
		for _, f := range strings.Fields(line) {
			k, v, _ := strings.Cut(f, "=")
			switch k {
			case "id":
				c.id = v
			case "flags":
				c.flags = v
			case "cmd":
				c.cmd = v
			}
		}
		if strings.Contains(c.flags, "x") {
			out = append(out, c)
		}
	}
	return out
}

// killClient closes connection id on the server.
func killClient(t *testing.T, rdb redis.Cmdable, id string) bool {
	t.Helper()
	n, err := rdb.ClientKillByFilter(context.Background(), "ID", id).Result()
	if err != nil {
		t.Errorf("CLIENT KILL ID %s: %v", id, err)
	}
	return n == 1
}

// longLease takes the lease of source s of queue q with a TTL no test here outlives, and returns
// the pointer key and the cover of a position under it.
func longLease(t *testing.T, rdb redis.UniversalClient, q string) (ptrKey string, cover func(pos string) *Cover) {
	t.Helper()
	leaseKey, ptrKey := "pgrelay:{"+q+"}:src:s:lease", "pgrelay:{"+q+"}:src:s:ptr"
	l := lease.New(rdb, leaseKey, 5*time.Minute, "me")
	if ok, err := l.TryAcquire(context.Background()); !ok || err != nil {
		t.Fatalf("acquire %v %v", ok, err)
	}
	return ptrKey, func(pos string) *Cover {
		return &Cover{LeaseKey: leaseKey, Fence: l.Token(), PointerKey: ptrKey, Pointer: []byte(`{"pos":"` + pos + `"}`), Pos: pos}
	}
}

func pos(i int) string { return fmt.Sprintf("%06d", i) }

// checkPointer fails unless the pointer stored at key has pos want.
func checkPointer(t *testing.T, rdb redis.Cmdable, key, want string) {
	t.Helper()
	if got := rdb.Get(context.Background(), key).Val(); got != `{"pos":"`+want+`"}` {
		t.Fatalf("pointer %s, want pos %s", got, want)
	}
}

// TestPrimedConnectionKilledBetweenBatches kills the connection a write left primed (the only
// one inside MULTI, by its id) before each of three batches: the next batch finds it closed,
// writes on a new connection, reading for itself (its own WATCH), and primes that one (a second
// WATCH, a new id inside MULTI); every batch is in the queue once and the pointer at the last.
func TestPrimedConnectionKilledBetweenBatches(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := r.Client()
	ctx := context.Background()
	const q = "primedkill"
	ptrKey, cover := longLease(t, rdb, q)
	w := NewWriter(rdb, WriterConfig{Shards: 4, Durability: Durability{AOF: true}, RetryFor: 10 * time.Second})
	defer w.Close()
	var all [][]Message
	write := func(i int) {
		t.Helper()
		b := batchOf(q, "b"+strconv.Itoa(i), 50, 5)
		if res, err := w.Write(ctx, b, cover(pos(i))); err != nil || res != ResultOK {
			t.Fatalf("batch %d: %v %v", i, res, err)
		}
		all = append(all, b)
	}
	write(1)
	for i := 2; i <= 4; i++ {
		before := inMulti(t, rdb)
		if len(before) != 1 || before[0].cmd != "multi" {
			t.Fatalf("before batch %d: connections inside MULTI %+v, want the primed one", i, before)
		}
		if !killClient(t, rdb, before[0].id) {
			t.Fatalf("the primed connection %s was not killed", before[0].id)
		}
		watches := cmdCalls(t, rdb, "cmdstat_watch:")
		write(i)
		after := inMulti(t, rdb)
		if len(after) != 1 || after[0].id == before[0].id {
			t.Fatalf("after batch %d: connections inside MULTI %+v, want a new primed one", i, after)
		}
		if n := cmdCalls(t, rdb, "cmdstat_watch:") - watches; n != 2 {
			t.Fatalf("batch %d: %d WATCHes, want 2 (its own reads, the next write's)", i, n)
		}
	}
	write(5) // primed again: no reads of its own
	checkQueue(t, rdb, w.Layout(), q, all...)
	checkPointer(t, rdb, ptrKey, pos(5))
}

// TestPrimedExecOutcomeUnknown kills the primed connection after a batch's writes and EXEC were
// sent on it, so the writer cannot know whether they ran:
//   - not applied: Redis holds the writes (CLIENT PAUSE WRITE: the client is blocked inside
//     MULTI), the connection is killed and the pause lifted. Redis dropped the transaction; the
//     retry reads the pointer below the cover and writes the batch (ok).
//   - applied, reply lost: Redis runs the EXEC and closes the connection before replying (the
//     reply is over a client-output-buffer-limit set for that one write). The retry reads the
//     pointer at the cover: duplicate, nothing written again.
//
// Either way the batch is in the queue once and the pointer at its cover.
func TestPrimedExecOutcomeUnknown(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := r.Client()
	ctx := context.Background()
	cutReply := func(t *testing.T) {
		if err := rdb.ConfigSet(ctx, "client-output-buffer-limit", "normal 1024 0 0").Err(); err != nil {
			t.Errorf("config set: %v", err)
		}
	}
	uncutReply := func(t *testing.T) {
		if err := rdb.ConfigSet(ctx, "client-output-buffer-limit", "normal 0 0 0").Err(); err != nil {
			t.Errorf("config set: %v", err)
		}
	}
	for _, c := range []struct {
		name    string
		want    Result
		size    int
		layout  int // 0: the default
		payload int // the second batch's payload bytes (0: batchOf's)
		// cut runs before the second write's EXEC is sent on the primed connection; done after
		// the write returned
		cut  func(t *testing.T)
		done func(t *testing.T)
	}{
		{name: "not applied", want: ResultOK, size: 300,
			cut: func(t *testing.T) {
				if err := rdb.Do(ctx, "CLIENT", "PAUSE", 20000, "WRITE").Err(); err != nil {
					t.Errorf("pause: %v", err)
					return
				}
				go func() {
					defer rdb.Do(ctx, "CLIENT", "UNPAUSE")
					for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
						for _, m := range inMulti(t, rdb) {
							if strings.Contains(m.flags, "b") {
								killClient(t, rdb, m.id)
								return
							}
						}
					}
					t.Errorf("the write never blocked inside MULTI")
				}()
			}},
		// the EXEC reply (an id per XADD) outgrows the 16 KiB reply buffer: a thousand entries,
		// in layout 2 a message each, in layout 3 a message each too when two payloads do not
		// fit in one entry's bytes (PackBytes)
		{name: "applied, reply lost", want: ResultDuplicate, size: 1000, layout: LayoutV2, cut: cutReply, done: uncutReply},
		{name: "applied, reply lost, layout 3", want: ResultDuplicate, size: 1000, payload: PackBytes/2 + 1, cut: cutReply, done: uncutReply},
	} {
		t.Run(c.name, func(t *testing.T) {
			q := "unknown" + strconv.Itoa(len(c.name))
			ptrKey, cover := longLease(t, rdb, q)
			w := NewWriter(rdb, WriterConfig{Shards: 4, Durability: Durability{AOF: true}, RetryFor: 10 * time.Second,
				CreateVersion: c.layout, MaxScriptBytes: 64 << 20})
			defer w.Close()
			first, second := batchOf(q, "first", 20, 6), batchOf(q, "second", c.size, 7)
			if c.payload > 0 {
				for i := range second {
					second[i].Payload = []byte(`"` + strings.Repeat(string(rune('a'+i%26)), c.payload-2) + `"`)
				}
			}
			if res, err := w.Write(ctx, first, cover(pos(1))); err != nil || res != ResultOK {
				t.Fatalf("first batch: %v %v", res, err)
			}
			primed := inMulti(t, rdb)
			if len(primed) != 1 {
				t.Fatalf("connections inside MULTI %+v, want the primed one", primed)
			}
			var cuts atomic.Int32
			w.beforeExec = func() {
				if cuts.Add(1) == 1 {
					if inMulti(t, rdb)[0].id != primed[0].id {
						t.Errorf("the second write is not on the primed connection")
					}
					c.cut(t)
				} else if c.done != nil {
					c.done(t) // the retry of a write taken as lost must not be cut again
				}
			}
			res, err := w.Write(ctx, second, cover(pos(2)))
			if c.done != nil {
				c.done(t)
			}
			if err != nil || res != c.want {
				t.Fatalf("second batch: %v %v, want %v", res, err, c.want)
			}
			if cuts.Load() == 0 {
				t.Fatal("the cut never ran")
			}
			if m := inMulti(t, rdb); len(m) == 1 && m[0].id == primed[0].id {
				t.Fatal("the primed connection survived")
			}
			checkQueue(t, rdb, w.Layout(), q, first, second)
			checkPointer(t, rdb, ptrKey, pos(2))
		})
	}
}

// TestPrimedConnectionKilledInLoop streams batches while another client kills whatever
// connection is inside MULTI, again and again (a random 0–3 ms after the pointer last moved):
// the primed connection between batches, and a batch's transaction with its writes or EXEC in
// flight. Every batch ends ok or duplicate (its EXEC ran but the reply was lost: settled by the
// pointer), every message is in the queue once and the pointer at the last cover.
// PGRELAY_PRIMED_KILL_BATCHES sets the number of batches (default 120).
func TestPrimedConnectionKilledInLoop(t *testing.T) {
	batches := 120
	if n, err := strconv.Atoi(os.Getenv("PGRELAY_PRIMED_KILL_BATCHES")); err == nil && n > 0 {
		batches = n
	}
	r := testenv.StartRedis(t)
	rdb := r.Client()
	killer := r.Client()
	ctx := context.Background()
	const q = "killloop"
	ptrKey, cover := longLease(t, rdb, q)
	w := NewWriter(rdb, WriterConfig{Shards: 4, Durability: Durability{AOF: true}, RetryFor: 20 * time.Second})
	defer w.Close()

	stop := make(chan struct{})
	var kills atomic.Int32
	killed := make(chan struct{})
	go func() {
		defer close(killed)
		rng := rand.New(rand.NewPCG(13, 13))
		last := ""
		for {
			select {
			case <-stop:
				return
			default:
			}
			// one kill per move of the pointer, so every batch gets through
			if p := killer.Get(ctx, ptrKey).Val(); p == last {
				time.Sleep(time.Millisecond)
				continue
			} else {
				last = p
			}
			time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
			for _, m := range inMulti(t, killer) {
				if killClient(t, killer, m.id) {
					kills.Add(1)
				}
			}
		}
	}()
	var all [][]Message
	dups := 0
	start := time.Now()
	for i := 1; i <= batches; i++ {
		b := batchOf(q, "b"+strconv.Itoa(i), 20+i%7*40, 9)
		res, err := w.Write(ctx, b, cover(pos(i)))
		if err != nil {
			close(stop)
			<-killed
			t.Fatalf("batch %d: %v", i, err)
		}
		if res == ResultDuplicate {
			dups++
		}
		all = append(all, b)
	}
	close(stop)
	<-killed
	checkQueue(t, rdb, w.Layout(), q, all...)
	checkPointer(t, rdb, ptrKey, pos(batches))
	if kills.Load() == 0 {
		t.Fatalf("no connection killed in %d batches", batches)
	}
	t.Logf("%d batches in %.1fs, %d connections killed, %d batches settled as duplicate by the pointer",
		batches, time.Since(start).Seconds(), kills.Load(), dups)
}

// TestPrimedRedisRestart restarts Redis (appendonly yes, appendfsync always; durability aof)
// under a writer that primes: SIGKILL and SIGTERM between two batches (the primed connection is
// gone; the next batch writes on a new one), and SIGKILL in the middle of a stream of batches,
// whose writes retry until Redis is back. Nothing acknowledged is lost, nothing doubled: every
// batch once in the queue, the pointer at the last cover.
func TestPrimedRedisRestart(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := r.Client()
	ctx := context.Background()
	newWriter := func() *Writer {
		w := NewWriter(rdb, WriterConfig{Shards: 4, Durability: Durability{AOF: true}, RetryFor: 20 * time.Second})
		if err := w.Connect(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { w.Close() })
		return w
	}

	t.Run("between batches", func(t *testing.T) {
		const q = "restartgap"
		ptrKey, cover := longLease(t, rdb, q)
		w := newWriter()
		var all [][]Message
		write := func(i int) {
			t.Helper()
			b := batchOf(q, "b"+strconv.Itoa(i), 40, 5)
			if res, err := w.Write(ctx, b, cover(pos(i))); err != nil || res != ResultOK {
				t.Fatalf("batch %d: %v %v", i, res, err)
			}
			all = append(all, b)
		}
		write(1)
		if len(inMulti(t, rdb)) != 1 {
			t.Fatal("no primed connection")
		}
		r.Kill()
		r.Restart()
		write(2)
		if len(inMulti(t, rdb)) != 1 {
			t.Fatal("no primed connection after the restart")
		}
		r.Restart() // SIGTERM
		write(3)
		write(4)
		checkQueue(t, rdb, w.Layout(), q, all...)
		checkPointer(t, rdb, ptrKey, pos(4))
	})

	t.Run("mid-run", func(t *testing.T) {
		const q, batches = "restartrun", 60
		ptrKey, cover := longLease(t, rdb, q)
		w := newWriter()
		var all [][]Message
		var written atomic.Int32
		done := make(chan error, 1)
		go func() {
			for i := 1; i <= batches; i++ {
				b := batchOf(q, "b"+strconv.Itoa(i), 200, 9)
				if _, err := w.Write(ctx, b, cover(pos(i))); err != nil {
					done <- fmt.Errorf("batch %d: %w", i, err)
					return
				}
				all = append(all, b)
				written.Add(1)
			}
			done <- nil
		}()
		for _, at := range []int32{batches / 4, batches / 2} {
			for written.Load() < at {
				select {
				case err := <-done:
					t.Fatalf("before the kill at batch %d: %v", at, err)
				case <-time.After(time.Millisecond):
				}
			}
			r.Kill()
			time.Sleep(200 * time.Millisecond)
			r.Restart()
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		checkQueue(t, rdb, w.Layout(), q, all...)
		checkPointer(t, rdb, ptrKey, pos(batches))
	})
}

// TestWriteSentinelLeastPrivilege writes through Redis Sentinel as least-privilege users: on
// the data nodes the documented line of a queue writer (redisconn.ACLLine: the server check, the
// lease, the write, WAIT), on the sentinels docs/operations.md's sentinel user, with only what the
// failover client asks them (the master's address, the other sentinels, the +switch-master
// messages). In the middle of a stream of primed batches (durability replicas: 1, two replicas)
// the master fails over:
//   - sigkill: the master is SIGKILLed while the batches stream;
//   - sentinel failover: the sentinels fail it over (SENTINEL FAILOVER) while the writer's
//     connection to it waits primed; the writer drops that connection on +switch-master.
//
// Each batch is written again after an error until it ends ok or duplicate, as the pipeline's
// redelivery does. Afterwards the new master holds every batch once, the pointer at the last
// cover, a primed connection again, and no node or sentinel refused a command (ACL LOG empty).
func TestWriteSentinelLeastPrivilege(t *testing.T) {
	for _, graceful := range []bool{false, true} {
		name := map[bool]string{false: "sigkill", true: "sentinel failover"}[graceful]
		t.Run(name, func(t *testing.T) { sentinelLeastPrivilege(t, graceful) })
	}
}

func sentinelLeastPrivilege(t *testing.T, graceful bool) {
	rs := testenv.StartRedisSentinel(t, 2)
	ctx := context.Background()
	const user, pass, sentUser, sentPass = "pgrelay-source", "src-pw", "pgrelay-sentinel", "sen-pw"
	for _, n := range rs.Nodes {
		n.ACL(redisconn.ACLLine(user, pass, "pgrelay", redisconn.UseServer, redisconn.UseLease, redisconn.UseWrite, redisconn.UseReplicas))
	}
	sentinelAdmin := func(addr string) *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
		t.Cleanup(func() { c.Close() })
		return c
	}
	// the sentinels' user, as docs/operations.md gives it
	doc, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	_, line, ok := strings.Cut(string(doc), "ACL SETUSER "+sentUser+" ")
	if !ok {
		t.Fatalf("docs/operations.md has no line for %s", sentUser)
	}
	line, _, _ = strings.Cut(line, "\n")
	args := []any{"ACL", "SETUSER", sentUser}
	for _, w := range strings.Fields(strings.ReplaceAll(line, "SENTINEL_PASSWORD", sentPass)) {
		args = append(args, w)
	}
	for _, s := range rs.Sentinels {
		if err := sentinelAdmin(s.Addr()).Do(ctx, args...).Err(); err != nil {
			t.Fatalf("sentinel %s: %v: %v", s.Addr(), args, err)
		}
	}
	conf := redisconn.Config{Username: user, Password: pass,
		Sentinel: &redisconn.Sentinel{MasterName: testenv.SentinelMaster, Addrs: rs.SentinelAddrs(), Username: sentUser, Password: sentPass}}
	rdb, err := conf.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	const q, batches = "sentinel", 60
	ptrKey, cover := longLease(t, rdb, q)
	w := NewWriter(rdb, WriterConfig{Shards: 4, Durability: Durability{Replicas: 1, WaitTimeout: time.Second}, RetryFor: 5 * time.Second})
	defer w.Close()

	var written atomic.Int32
	done := make(chan error, 1)
	var all [][]Message
	retries := 0
	const failAt = batches / 3
	reached, gate := make(chan struct{}), make(chan struct{})
	go func() {
		for i := 1; i <= batches; i++ {
			if i == failAt+1 && graceful {
				close(reached)
				<-gate
			}
			b := batchOf(q, "b"+strconv.Itoa(i), 100, 9)
			for deadline := time.Now().Add(60 * time.Second); ; {
				_, err := w.Write(ctx, b, cover(pos(i)))
				if err == nil {
					break
				}
				if time.Now().After(deadline) {
					done <- fmt.Errorf("batch %d: %w", i, conf.Explain(err))
					return
				}
				retries++
				time.Sleep(100 * time.Millisecond)
			}
			all = append(all, b)
			written.Add(1)
		}
		done <- nil
	}()
	for written.Load() < failAt {
		select {
		case err := <-done:
			t.Fatalf("before the failover: %v", err)
		case <-time.After(time.Millisecond):
		}
	}
	old := rs.Master()
	var promoted *testenv.Redis
	if !graceful {
		old.Kill()
		if n := written.Load(); n >= batches {
			t.Fatalf("all %d batches were written before the master was killed", n)
		}
		promoted = rs.WaitPromoted(old, 60*time.Second)
	} else {
		<-reached
		if m := inMulti(t, old.Client()); len(m) != 1 {
			t.Fatalf("connections inside MULTI on %s before its failover: %+v, want the primed one", old.Addr(), m)
		}
		if err := sentinelAdmin(rs.Sentinels[0].Addr()).Do(ctx, "SENTINEL", "FAILOVER", testenv.SentinelMaster).Err(); err != nil {
			t.Fatalf("SENTINEL FAILOVER: %v", err)
		}
		promoted = rs.WaitPromoted(old, 60*time.Second)
		// the writer's pool closes its primed connection to the old master when a sentinel
		// announces the switch, before the old master is made a replica
		if !waitNoMulti(t, old, 10*time.Second) {
			t.Fatalf("the primed connection to the old master %s is still open after the switch", old.Addr())
		}
		close(gate)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	admin := promoted.Client()
	checkQueue(t, admin, w.Layout(), q, all...)
	checkPointer(t, admin, ptrKey, pos(batches))
	if m := inMulti(t, admin); len(m) != 1 {
		t.Fatalf("connections inside MULTI on the new master: %+v, want the primed one", m)
	}
	for _, n := range rs.Nodes {
		if !n.Alive() {
			continue
		}
		if log := n.Client().Do(ctx, "ACL", "LOG").Val(); len(log.([]any)) > 0 {
			t.Errorf("node %s refused the writer: %v", n.Addr(), log)
		}
	}
	for _, s := range rs.Sentinels {
		if log := sentinelAdmin(s.Addr()).Do(ctx, "ACL", "LOG").Val(); len(log.([]any)) > 0 {
			t.Errorf("sentinel %s refused the client: %v", s.Addr(), log)
		}
	}
	t.Logf("master %s failed over to %s after batch %d of %d; %d writes retried", old.Addr(), promoted.Addr(), failAt, batches, retries)
}

// waitNoMulti waits up to timeout until no connection of n is inside MULTI (the writer's primed
// connection to it closed), and reports whether that happened.
func waitNoMulti(t *testing.T, n *testenv.Redis, timeout time.Duration) bool {
	t.Helper()
	c := n.Client()
	for deadline := time.Now().Add(timeout); ; time.Sleep(20 * time.Millisecond) {
		if len(inMulti(t, c)) == 0 {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

// TestWriteSentinelFailoverOldMasterUp fails the master over with SENTINEL FAILOVER while the
// writer's connection to it waits primed (inside MULTI), and keeps the old master running as a
// master (it refuses REPLICAOF, so the sentinels cannot make it a replica). The writer's raw
// pool hears +switch-master from the sentinels, closes the connection to the old master, and
// the batches after the switch (durability aof) go to the new master: it holds every batch
// once and the pointer at the last cover, and the old master has no batch after the switch.
func TestWriteSentinelFailoverOldMasterUp(t *testing.T) {
	rs := testenv.StartRedisSentinel(t, 1)
	ctx := context.Background()
	old := rs.Master()
	oldAdmin := old.Client()
	// the sentinels' REPLICAOF (SLAVEOF inside MULTI) is refused: the old master stays a master
	if err := oldAdmin.Do(ctx, "ACL", "SETUSER", "default", "-replicaof", "-slaveof").Err(); err != nil {
		t.Fatal(err)
	}
	conf := redisconn.Config{Sentinel: &redisconn.Sentinel{MasterName: testenv.SentinelMaster, Addrs: rs.SentinelAddrs()}}
	rdb, err := conf.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	const q, batches, failAt = "switch", 24, 8
	ptrKey, cover := longLease(t, rdb, q)
	w := NewWriter(rdb, WriterConfig{Shards: 4, Durability: Durability{AOF: true}, RetryFor: 5 * time.Second})
	defer w.Close()

	done := make(chan error, 1)
	var all [][]Message
	reached, gate := make(chan struct{}), make(chan struct{})
	go func() {
		for i := 1; i <= batches; i++ {
			if i == failAt+1 {
				close(reached)
				<-gate
			}
			b := batchOf(q, "b"+strconv.Itoa(i), 50, 5)
			for deadline := time.Now().Add(30 * time.Second); ; {
				_, err := w.Write(ctx, b, cover(pos(i)))
				if err == nil {
					break
				}
				if time.Now().After(deadline) {
					done <- fmt.Errorf("batch %d: %w", i, err)
					return
				}
				time.Sleep(50 * time.Millisecond)
			}
			all = append(all, b)
		}
		done <- nil
	}()
	select {
	case <-reached:
	case err := <-done:
		t.Fatalf("before the failover: %v", err)
	}
	if m := inMulti(t, oldAdmin); len(m) != 1 {
		t.Fatalf("connections inside MULTI on %s before its failover: %+v, want the primed one", old.Addr(), m)
	}
	// what was acknowledged so far is on the replica before it is promoted: a write, then WAIT on
	// the same connection (it waits for the replica to have every write before it)
	var acked *redis.Cmd
	if _, err := oldAdmin.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, "sync", "1", 0)
		acked = p.Do(ctx, "WAIT", 1, 10000)
		return nil
	}); err != nil || acked.Val() != int64(1) {
		t.Fatalf("WAIT for the replica: %v %v", acked.Val(), err)
	}
	sentinel := redis.NewSentinelClient(&redis.Options{Addr: rs.Sentinels[0].Addr(), MaxRetries: -1})
	defer sentinel.Close()
	if err := sentinel.Failover(ctx, testenv.SentinelMaster).Err(); err != nil {
		t.Fatalf("SENTINEL FAILOVER: %v", err)
	}
	promoted := rs.WaitPromoted(old, 60*time.Second)
	// the pool closes its connection to the old master when it hears the switch; without that,
	// the writer would go on with it (checked below by the data)
	if !waitNoMulti(t, old, 10*time.Second) {
		t.Logf("the primed connection to the old master %s is still open after the switch", old.Addr())
	}
	close(gate)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if repl, err := old.Info("replication"); err != nil || repl["role"] != "master" {
		t.Fatalf("the old master %s runs as %v (%v): the test needs it to stay a master", old.Addr(), repl["role"], err)
	}
	admin := promoted.Client()
	checkQueue(t, admin, w.Layout(), q, all...)
	checkPointer(t, admin, ptrKey, pos(batches))
	checkPointer(t, oldAdmin, ptrKey, pos(failAt))
}

// TestWritePrimedThroughLeaseRenewals renews the writer's lease between its writes, each time
// while its connection holds the next write's WATCH (the lease key among the watched keys), reads
// and MULTI: the write after a renewal aborts its primed EXEC and is read and checked again, and
// as the reads show only the writer's own renewal (same fence, the pointer where it left it),
// the writes go on primed: after each, a connection waits inside MULTI, and the write after it
// sends no reads of its own (one WATCH: the one for the write after it). A write of another
// producer to the queue still backs priming off.
func TestWritePrimedThroughLeaseRenewals(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := r.Client()
	ctx := context.Background()
	const q = "renewals"
	leaseKey, ptrKey := "pgrelay:{"+q+"}:src:s:lease", "pgrelay:{"+q+"}:src:s:ptr"
	l := lease.New(rdb, leaseKey, time.Minute, "me")
	if ok, err := l.TryAcquire(ctx); !ok || err != nil {
		t.Fatalf("acquire %v %v", ok, err)
	}
	w := NewWriter(rdb, WriterConfig{Shards: 4})
	defer w.Close()
	var all [][]Message
	n := 0
	write := func() {
		t.Helper()
		n++
		b := batchOf(q, "b"+strconv.Itoa(n), 10, 3)
		c := &Cover{LeaseKey: leaseKey, Fence: l.Token(), PointerKey: ptrKey, Pointer: []byte(`{"pos":"` + pos(n) + `"}`), Pos: pos(n)}
		if res, err := w.Write(ctx, b, c); err != nil || res != ResultOK {
			t.Fatalf("batch %d: %v %v", n, res, err)
		}
		all = append(all, b)
	}
	write()
	for round := 1; round <= 3; round++ {
		if ok, err := l.Renew(ctx); !ok || err != nil {
			t.Fatalf("renew: %v %v", ok, err)
		}
		execs := cmdCalls(t, rdb, "cmdstat_exec:")
		write() // its primed EXEC aborts: the renewal changed the watched lease key
		if n := cmdCalls(t, rdb, "cmdstat_exec:") - execs; n != 2 {
			t.Fatalf("round %d: %d EXECs for the write after the renewal, want 2 (the aborted primed one, the retry)", round, n)
		}
		if m := inMulti(t, rdb); len(m) != 1 {
			t.Fatalf("round %d: connections inside MULTI after the write that followed the renewal: %+v, want the primed one", round, m)
		}
		watches := cmdCalls(t, rdb, "cmdstat_watch:")
		write()
		if n := cmdCalls(t, rdb, "cmdstat_watch:") - watches; n != 1 {
			t.Fatalf("round %d: %d WATCHes for the next write, want 1 (the priming of the one after it)", round, n)
		}
		if m := inMulti(t, rdb); len(m) != 1 {
			t.Fatalf("round %d: connections inside MULTI after the next write: %+v, want the primed one", round, m)
		}
	}
	// another producer of the queue moves its shards' offsets: that abort still backs priming off
	other := NewWriter(rdb, WriterConfig{Shards: 4})
	ob := batchOf(q, "other", 10, 3)
	if res, err := other.Write(ctx, ob, nil); err != nil || res != ResultOK {
		t.Fatalf("the other producer: %v %v", res, err)
	}
	other.Close() // its own primed connection with it
	all = append(all, ob)
	write()
	if m := inMulti(t, rdb); len(m) != 0 {
		t.Fatalf("connections inside MULTI after a write another producer aborted: %+v, want none (backing off)", m)
	}
	checkQueue(t, rdb, w.Layout(), q, all...)
	checkPointer(t, rdb, ptrKey, pos(n))
}
