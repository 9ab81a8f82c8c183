package queue

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/lease"
	"github.com/pgrelay/pgrelay/internal/redisconn"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// batchOf makes n messages on queue q with ids <prefix>-<i> over parts partitions.
func batchOf(q, prefix string, n, parts int) []Message {
	out := make([]Message, n)
	for i := range out {
		out[i] = Message{Queue: q, Partition: "p" + strconv.Itoa(i%parts), ID: prefix + "-" + strconv.Itoa(i),
			Tx: prefix, CreatedMs: 1700000000000, Payload: []byte(`{"b":"` + prefix + `","i":` + strconv.Itoa(i) + `}`)}
	}
	return out
}

// checkQueue is the queue oracle: queue q holds exactly the messages of batches, each once, in
// the layout of DESIGN §4 (the fields of the queue's layout version, offsets 1, 2, 3... per
// shard, meta off:<n> the last one).
func checkQueue(t *testing.T, rdb redis.Cmdable, l Layout, q string, batches ...[]Message) {
	t.Helper()
	ctx := context.Background()
	want := map[string]bool{}
	for _, b := range batches {
		for _, m := range b {
			want[m.ID] = true
		}
	}
	meta := rdb.HGetAll(ctx, l.Meta(q)).Val()
	shards, _ := strconv.Atoi(meta["shards"])
	seen := map[string]int{}
	for n := 0; n < shards; n++ {
		xs, err := rdb.XRange(ctx, l.Stream(q, n), "-", "+").Result()
		if err != nil {
			t.Fatal(err)
		}
		var es []Entry
		for i, x := range xs {
			if want := map[string]int{"1": 7, "2": 2, "3": 2}[meta["version"]]; len(x.Values) != want {
				t.Fatalf("shard %d entry %d: fields %v, want %d for layout version %s", n, i, x.Values, want, meta["version"])
			}
			es = EntriesOf(es, x)
		}
		for i, e := range es {
			if e.Offset != int64(i+1) {
				t.Fatalf("shard %d message %d: off %v", n, i, e.Offset)
			}
			seen[e.MessageID]++
		}
		if len(es) > 0 && meta["off:"+strconv.Itoa(n)] != strconv.Itoa(len(es)) {
			t.Fatalf("shard %d: meta off %q, %d messages", n, meta["off:"+strconv.Itoa(n)], len(es))
		}
	}
	for id, c := range seen {
		if c != 1 || !want[id] {
			t.Fatalf("message %s written %d times (expected: %v)", id, c, want[id])
		}
	}
	if len(seen) != len(want) {
		t.Fatalf("%d messages in the queue, want %d", len(seen), len(want))
	}
}

// evalCalls is how many script calls (EVAL, EVALSHA) the server has run.
func evalCalls(t *testing.T, rdb *redis.Client) int {
	t.Helper()
	return cmdCalls(t, rdb, "cmdstat_eval")
}

// cmdCalls is how many calls of the commands whose commandstats line starts with prefix the
// server has run.
func cmdCalls(t *testing.T, rdb *redis.Client, prefix string) int {
	t.Helper()
	info := rdb.Info(context.Background(), "commandstats").Val()
	calls := 0
	for _, line := range strings.Split(info, "\n") {
		if strings.HasPrefix(line, prefix) {
			f := strings.SplitN(strings.SplitN(line, "calls=", 2)[1], ",", 2)
			n, _ := strconv.Atoi(f[0])
			calls += n
		}
	}
	return calls
}

// leasedSource takes the lease of source s of queue q and returns its lease and pointer keys and
// the cover of a position under that lease.
func leasedSource(t *testing.T, rdb redis.UniversalClient, q string) (leaseKey, ptrKey string, cover func(pos string) *Cover) {
	t.Helper()
	leaseKey, ptrKey = "pgrelay:{"+q+"}:src:s:lease", "pgrelay:{"+q+"}:src:s:ptr"
	l := lease.New(rdb, leaseKey, 10*time.Second, "me")
	if ok, err := l.TryAcquire(context.Background()); !ok || err != nil {
		t.Fatalf("acquire %v %v", ok, err)
	}
	return leaseKey, ptrKey, func(pos string) *Cover {
		return &Cover{LeaseKey: leaseKey, Fence: l.Token(), PointerKey: ptrKey, Pointer: []byte(`{"pos":"` + pos + `"}`), Pos: pos}
	}
}

// keyChange is a change of a writer's watched keys by someone else (another replica, the lease
// renewal, another producer, a re-created queue) while the writer writes its second batch (cover
// 0003, after a first one at 0001), and what that write must end with.
type keyChange struct {
	name   string
	change func(q, leaseKey, ptrKey string)
	want   Result
	code   errcode.Code
	second bool   // the second batch is in the queue afterwards
	ptr    string // pos stored afterwards
	moved  string // where the change itself sets the pointer's pos ("": it does not)
	other  bool   // the other producer's batch is in the queue
	shards int    // shard count afterwards
}

func keyChanges(t *testing.T, rdb *redis.Client) []keyChange {
	ctx := context.Background()
	return []keyChange{
		{name: "a new owner took the lease", change: func(_, lk, _ string) { rdb.Set(ctx, lk, "other|9", 0) },
			code: errcode.Fenced, ptr: "0001", shards: 4},
		{name: "the lease was renewed", change: func(_, lk, _ string) { rdb.PExpire(ctx, lk, time.Minute) },
			want: ResultOK, second: true, ptr: "0003", shards: 4},
		{name: "the pointer moved past the cover", change: func(_, _, pk string) { rdb.Set(ctx, pk, `{"pos":"0005"}`, 0) },
			want: ResultDuplicate, ptr: "0005", moved: "0005", shards: 4},
		{name: "the pointer moved, still below the cover", change: func(_, _, pk string) { rdb.Set(ctx, pk, `{"pos":"0002"}`, 0) },
			want: ResultOK, second: true, ptr: "0003", moved: "0002", shards: 4},
		{name: "another producer wrote the queue", change: func(q, _, _ string) {
			if _, err := NewWriter(rdb, WriterConfig{}).Write(ctx, batchOf(q, "other", 7, 7), nil); err != nil {
				t.Errorf("other producer: %v", err)
			}
		}, want: ResultOK, second: true, ptr: "0003", other: true, shards: 4},
		{name: "the queue was created again with 2 shards", change: func(q, _, _ string) {
			l := NewLayout("")
			keys := []string{l.Meta(q)}
			for n := 0; n < 4; n++ {
				keys = append(keys, l.Stream(q, n))
			}
			rdb.Del(ctx, keys...)
			rdb.HSet(ctx, l.Meta(q), "shards", 2, "version", 1)
		}, want: ResultOK, second: true, ptr: "0003", shards: 2},
	}
}

// check checks the outcome of the second write (res, err) and reads the queue and the pointer back.
func (c keyChange) check(t *testing.T, rdb *redis.Client, w *Writer, q, ptrKey string, first, second []Message, res Result, err error) {
	t.Helper()
	switch {
	case c.code != "":
		if !errcode.Is(err, c.code) {
			t.Fatalf("err %v, want code %s", err, c.code)
		}
	case err != nil || res != c.want:
		t.Fatalf("%v %v, want %v", res, err, c.want)
	}
	var batches [][]Message
	if c.shards == 4 {
		batches = append(batches, first)
	}
	if c.second {
		batches = append(batches, second)
	}
	if c.other {
		batches = append(batches, batchOf(q, "other", 7, 7))
	}
	checkQueue(t, rdb, w.Layout(), q, batches...)
	ctx := context.Background()
	if got := rdb.HGet(ctx, w.Layout().Meta(q), "shards").Val(); got != strconv.Itoa(c.shards) {
		t.Fatalf("shards %s, want %d", got, c.shards)
	}
	if got := rdb.Get(ctx, ptrKey).Val(); got != `{"pos":"`+c.ptr+`"}` {
		t.Fatalf("pointer %s, want pos %s", got, c.ptr)
	}
}

// TestWriteTxRaces changes a watched key between a transaction's reads and its EXEC (keyChanges):
// the EXEC aborts, and the write is read and checked again, so it ends fenced, duplicate or
// written exactly once. A writer that keeps conflicting falls back to the script. Without the
// WATCH the stale checks would let each of these writes through. Each case runs with the second
// write's reads primed by the first write (the reads travel with its EXEC) and with the second
// write reading for itself.
func TestWriteTxRaces(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := r.Client()
	ctx := context.Background()
	type raceCase struct {
		keyChange
		always bool // the change runs on every attempt, not the first only
		script bool // written by the script
	}
	var cases []raceCase
	for _, c := range keyChanges(t, rdb) {
		cases = append(cases, raceCase{keyChange: c})
	}
	cases = append(cases, raceCase{keyChange: keyChange{name: "conflicts every time: the script writes",
		change: func(_, lk, _ string) { rdb.PExpire(ctx, lk, time.Minute) }, want: ResultOK, second: true, ptr: "0003", shards: 4},
		always: true, script: true})
	for k, c := range cases {
		for _, primed := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/primed=%v", c.name, primed), func(t *testing.T) {
				q := fmt.Sprintf("race%d-%v", k, primed)
				leaseKey, ptrKey, cover := leasedSource(t, rdb, q)
				w := NewWriter(rdb, WriterConfig{Shards: 4})
				defer w.Close()
				if !primed {
					w.primeWait.Store(1 << 40)
				}
				first, second := batchOf(q, "first", 20, 6), batchOf(q, "second", 30, 6)
				if res, err := w.Write(ctx, first, cover("0001")); err != nil || res != ResultOK {
					t.Fatalf("first batch: %v %v", res, err)
				}
				var races atomic.Int32
				w.beforeExec = func() {
					if races.Add(1) == 1 || c.always {
						c.change(q, leaseKey, ptrKey)
					}
				}
				evals, execs := evalCalls(t, rdb), cmdCalls(t, rdb, "cmdstat_exec:")
				res, err := w.Write(ctx, second, cover("0003"))
				if races.Load() == 0 {
					t.Fatal("the race never ran")
				}
				c.check(t, rdb, w, q, ptrKey, first, second, res, err)
				if scripted := evalCalls(t, rdb) > evals; scripted != c.script {
					t.Fatalf("written by the script: %v, want %v", scripted, c.script)
				}
				if n := cmdCalls(t, rdb, "cmdstat_exec:") - execs; c.script && n != maxTxConflicts {
					t.Fatalf("%d EXECs before the script, want %d", n, maxTxConflicts)
				}
			})
		}
	}
}

// cutProxy forwards connections to a Redis server and, once armed, cuts the first one whose
// client sends its marker: in "multi" mode among the queued writes of a transaction (client and
// server side closed, so Redis discards the queued commands), in "exec" mode right after EXEC
// reached the server (only the client side is closed, once ready says EXEC ran: the write is in,
// its reply lost).
type cutProxy struct {
	ln     net.Listener
	target string
	mode   string
	ready  func() bool
	armed  atomic.Bool // cut the next connection that sends the marker
	cut    atomic.Bool
	mu     sync.Mutex
	conns  []net.Conn
}

func startCutProxy(t *testing.T, target, mode string, ready func() bool) *cutProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, target: target, mode: mode, ready: ready}
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
	})
	go func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", target)
			if err != nil {
				client.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, client, server)
			p.mu.Unlock()
			var cutHere atomic.Bool // this connection's replies go nowhere
			go func() {
				buf := make([]byte, 64<<10)
				for {
					n, err := server.Read(buf)
					if n > 0 && !cutHere.Load() {
						if _, err := client.Write(buf[:n]); err != nil {
							return
						}
					}
					if err != nil {
						client.Close()
						return
					}
				}
			}()
			go p.pump(client, server, &cutHere)
		}
	}()
	return p
}

func (p *cutProxy) pump(client, server net.Conn, cutHere *atomic.Bool) {
	marker := []byte("$4\r\nXADD\r\n") // the first queued write
	if p.mode == "exec" {
		marker = []byte("*1\r\n$4\r\nEXEC\r\n")
	}
	buf := make([]byte, 64<<10)
	var tail []byte
	for {
		n, err := client.Read(buf)
		chunk := buf[:n]
		if n > 0 && p.armed.Load() && !p.cut.Load() {
			joined := append(tail, chunk...)
			if i := bytes.Index(joined, marker); i >= 0 && p.cut.CompareAndSwap(false, true) {
				end := i + len(marker) - len(tail) // in chunk, just after the marker
				cutHere.Store(true)
				if p.mode == "multi" {
					end = min(end+200, n) // into the first queued commands
					server.Write(chunk[:end])
					server.Close()
					client.Close()
					return
				}
				server.Write(chunk[:end])
				for deadline := time.Now().Add(20 * time.Second); !p.ready() && time.Now().Before(deadline); {
					time.Sleep(5 * time.Millisecond)
				}
				client.Close() // the server side stays open: Redis runs EXEC, its reply goes nowhere
				return
			}
			tail = append(tail[:0], joined[max(0, len(joined)-len(marker)):]...)
		}
		if n > 0 {
			if _, werr := server.Write(chunk); werr != nil {
				client.Close()
				return
			}
		}
		if err != nil {
			server.Close()
			return
		}
	}
}

// TestWriteTxConnectionCut loses the writer's connection at the two points that matter: inside
// the transaction (Redis discards it; the retry writes the batch) and after EXEC ran but before
// its reply arrived (the retry finds the pointer at the cover: duplicate). Either way the batch is
// in the queue exactly once and the pointer at its cover.
func TestWriteTxConnectionCut(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := r.Client()
	ctx := context.Background()
	for _, mode := range []string{"multi", "exec"} {
		t.Run(mode, func(t *testing.T) {
			q := "cut" + mode
			ptrKey := "pgrelay:{" + q + "}:src:s:ptr"
			cover := &Cover{PointerKey: ptrKey, Pointer: []byte(`{"pos":"0002"}`), Pos: "0002"}
			p := startCutProxy(t, r.Addr(), mode, func() bool { return rdb.Get(ctx, ptrKey).Val() == string(cover.Pointer) })
			prdb := redis.NewClient(&redis.Options{Addr: p.ln.Addr().String()})
			defer prdb.Close()
			w := NewWriter(prdb, WriterConfig{Shards: 3})
			defer w.Close()
			first := batchOf(q, "first", 10, 5)
			if _, err := w.Write(ctx, first, &Cover{PointerKey: ptrKey, Pointer: []byte(`{"pos":"0001"}`), Pos: "0001"}); err != nil {
				t.Fatal(err)
			}
			p.armed.Store(true)
			second := batchOf(q, "second", 500, 7)
			res, err := w.Write(ctx, second, cover)
			want := map[string]Result{"multi": ResultOK, "exec": ResultDuplicate}[mode]
			if err != nil || res != want {
				t.Fatalf("%v %v, want %v", res, err, want)
			}
			if !p.cut.Load() {
				t.Fatal("no connection was cut")
			}
			checkQueue(t, rdb, w.Layout(), q, first, second)
			if got := rdb.Get(ctx, ptrKey).Val(); got != string(cover.Pointer) {
				t.Fatalf("pointer %s", got)
			}
		})
	}
}

// TestWriteTxTwoProducers: two sources write batches to one queue at the same time, each fenced
// by its own lease and moving its own pointer. Their transactions conflict (each one's EXEC
// changes the meta hash the other watches); every message is in the queue exactly once, the
// offsets contiguous, each pointer at its last cover.
func TestWriteTxTwoProducers(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := r.Client()
	ctx := context.Background()
	const q, batches = "shared", 25
	var wg sync.WaitGroup
	var all [][]Message
	var mu sync.Mutex
	var conflicts atomic.Int64
	for _, src := range []string{"a", "b"} {
		leaseKey, ptrKey := "pgrelay:{"+q+"}:src:"+src+":lease", "pgrelay:{"+q+"}:src:"+src+":ptr"
		l := lease.New(rdb, leaseKey, 10*time.Second, src)
		if ok, err := l.TryAcquire(ctx); !ok || err != nil {
			t.Fatalf("acquire %v %v", ok, err)
		}
		w := NewWriter(rdb, WriterConfig{Shards: 4})
		defer w.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 1; i <= batches; i++ {
				b := batchOf(q, fmt.Sprintf("%s%d", src, i), 200, 9)
				pos := fmt.Sprintf("%04d", i)
				cov := &Cover{LeaseKey: leaseKey, Fence: l.Token(), PointerKey: ptrKey, Pointer: []byte(`{"pos":"` + pos + `"}`), Pos: pos}
				if res, err := w.Write(ctx, b, cov); err != nil || res != ResultOK {
					t.Errorf("%s batch %d: %v %v", src, i, res, err)
					return
				}
				mu.Lock()
				all = append(all, b)
				mu.Unlock()
			}
			conflicts.Add(w.conflicts.Load())
		}()
	}
	wg.Wait()
	checkQueue(t, rdb, NewLayout(""), q, all...)
	for _, src := range []string{"a", "b"} {
		if got := rdb.Get(ctx, "pgrelay:{"+q+"}:src:"+src+":ptr").Val(); got != fmt.Sprintf(`{"pos":"%04d"}`, batches) {
			t.Fatalf("pointer of %s: %s", src, got)
		}
	}
	t.Logf("%d aborted EXECs in %d batches", conflicts.Load(), 2*batches)
}

// TestWriteTxLeastPrivilege writes as a Redis user holding exactly the ACL commands of a queue
// write (redisconn.UseWrite, with UseServer): a batch goes through the transaction (EXEC, no
// script), one that keeps conflicting through the script, and Redis refused nothing (ACL LOG
// empty): every command either path sends is in the documented line.
func TestWriteTxLeastPrivilege(t *testing.T) {
	r := testenv.StartRedis(t)
	admin := r.Client()
	ctx := context.Background()
	r.ACL(redisconn.ACLLine("w", "pw", "pgrelay", redisconn.UseServer, redisconn.UseLease, redisconn.UseWrite))
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr(), Username: "w", Password: "pw", DisableIdentity: true})
	defer rdb.Close()
	const q = "lp"
	leaseKey, ptrKey, cover := leasedSource(t, rdb, q)
	w := NewWriter(rdb, WriterConfig{Shards: 4})
	defer w.Close()
	first, second := batchOf(q, "first", 20, 6), batchOf(q, "second", 30, 6)
	evals, execs := evalCalls(t, admin), cmdCalls(t, admin, "cmdstat_exec:")
	if res, err := w.Write(ctx, first, cover("0001")); err != nil || res != ResultOK {
		t.Fatalf("first batch: %v %v", res, err)
	}
	if evalCalls(t, admin) != evals || cmdCalls(t, admin, "cmdstat_exec:") == execs {
		t.Fatal("the first batch was not written by a transaction")
	}
	if res, err := w.Write(ctx, first, cover("0001")); err != nil || res != ResultDuplicate {
		t.Fatalf("first batch again: %v %v", res, err)
	}
	w.beforeExec = func() { admin.PExpire(ctx, leaseKey, time.Minute) } // every EXEC aborts
	if res, err := w.Write(ctx, second, cover("0002")); err != nil || res != ResultOK {
		t.Fatalf("second batch: %v %v", res, err)
	}
	if evalCalls(t, admin) == evals {
		t.Fatal("the second batch was not written by the script")
	}
	w.beforeExec = nil
	// XADD taken away: refused inside the transaction, which writes nothing; redis_acl with the rule
	r.ACL("ACL SETUSER w -xadd")
	_, err := w.Write(ctx, batchOf(q, "refused", 5, 2), cover("0003"))
	conf := redisconn.Config{Username: "w", Prefix: "pgrelay"}
	if err := conf.Explain(err); !errcode.Is(err, errcode.RedisACL) || !strings.HasSuffix(err.Error(), "Fix: ACL SETUSER w +xadd") {
		t.Fatalf("without XADD: %v, want redis_acl with +xadd", err)
	}
	checkQueue(t, admin, w.Layout(), q, first, second)
	r.ACL("ACL SETUSER w +xadd")
	admin.Do(ctx, "ACL", "LOG", "RESET")
	w.beforeExec = func() { admin.Set(ctx, leaseKey, "other|1", 0) } // fenced: DISCARD, UNWATCH
	if _, err := w.Write(ctx, batchOf(q, "third", 5, 2), cover("0003")); !errcode.Is(err, errcode.Fenced) {
		t.Fatalf("third batch: %v, want fenced", err)
	}
	checkQueue(t, admin, w.Layout(), q, first, second)
	if got := admin.Get(ctx, ptrKey).Val(); got != `{"pos":"0002"}` {
		t.Fatalf("pointer %s", got)
	}
	if log := admin.Do(ctx, "ACL", "LOG").Val(); len(log.([]any)) > 0 {
		t.Fatalf("Redis refused the writer: %v", log)
	}
}

// TestWritePrimed makes each change of keyChanges between two writes of one writer, while its
// connection holds the next write's WATCH, reads and MULTI (primed by the first write's round
// trip): the second write checks against those reads and sends only its writes and EXEC, which the
// changed watched key aborts (the EXEC count shows it ran: reading for itself, the write would see
// the change and never abort); it is then read and checked again and ends fenced, duplicate or
// written exactly once, as the queue and the pointer read back show. A run of unchanged writes
// shows they make no reads of their own.
func TestWritePrimed(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := r.Client()
	ctx := context.Background()
	for i, c := range keyChanges(t, rdb) {
		t.Run(c.name, func(t *testing.T) {
			q := "primed" + strconv.Itoa(i)
			w, leaseKey, ptrKey, cover, first, second := firstOfTwo(t, rdb, q)
			c.change(q, leaseKey, ptrKey)
			execs := cmdCalls(t, rdb, "cmdstat_exec:")
			res, err := w.Write(ctx, second, cover("0003"))
			c.check(t, rdb, w, q, ptrKey, first, second, res, err)
			// the primed EXEC, aborted; then the EXEC of the write read again, unless it ended
			// fenced or duplicate
			want := 2
			if c.code != "" || c.want == ResultDuplicate {
				want = 1
			}
			if n := cmdCalls(t, rdb, "cmdstat_exec:") - execs; n != want {
				t.Fatalf("%d EXECs for the second write, want %d", n, want)
			}
		})
	}

	t.Run("no reads of its own", func(t *testing.T) {
		q := "primedrun"
		_, _, cover := leasedSource(t, rdb, q)
		w := NewWriter(rdb, WriterConfig{Shards: 4})
		defer w.Close()
		var all [][]Message
		for i := 1; i <= 6; i++ {
			if i == 2 {
				// each later write sends one WATCH and the TYPE of the 4 shards, both for the write
				// after it: reading for itself would add a WATCH and TYPEs
				defer func(watches, types int) {
					if n := cmdCalls(t, rdb, "cmdstat_watch:") - watches; n != 5 {
						t.Errorf("%d WATCHes for 5 writes after the first, want 5", n)
					}
					if n := cmdCalls(t, rdb, "cmdstat_type:") - types; n != 5*4 {
						t.Errorf("%d TYPEs for 5 writes after the first, want %d", n, 5*4)
					}
				}(cmdCalls(t, rdb, "cmdstat_watch:"), cmdCalls(t, rdb, "cmdstat_type:"))
			}
			b := batchOf(q, "b"+strconv.Itoa(i), 10, 3)
			if res, err := w.Write(ctx, b, cover(fmt.Sprintf("%04d", i))); err != nil || res != ResultOK {
				t.Fatalf("batch %d: %v %v", i, res, err)
			}
			all = append(all, b)
		}
		checkQueue(t, rdb, w.Layout(), q, all...)
	})
}

// storedPos reads the stored pointer's pos as encoding/json read it into a *string field: the
// same value, and "corrupt" for the same documents.
func TestStoredPosReadsAsEncodingJSON(t *testing.T) {
	for _, doc := range []string{
		`{"v":1,"epoch":"0a1b2c3d","lsn":"0/16B3748","in_txn":null,"snapshot":{"pos":"inner"},"pos":"00000001/00000000016b3748/ffffffffffffffff/0000000000000000"}`,
		`{"pos":"a"}`, ` { "pos" : "a\u002fb\"c" } `, `{"POS":"upper"}`, `{"p\u006fs":"escaped key"}`,
		`{"pos":"first","pos":"last"}`, `{"pos":"x","pos":null}`, `{"pos":null}`, `{"pos":5}`, `{"pos":5,"pos":"x"}`,
		`{"pos":["x"]}`, `{"other":"x"}`, `{}`, `null`, `["pos"]`, `"pos"`, `{"pos":"x"`, `{"pos":"x"} trailing`, ``, `not json`,
	} {
		var want struct {
			Pos *string `json:"pos"`
		}
		wantOK := json.Unmarshal([]byte(doc), &want) == nil && want.Pos != nil
		got, ok := storedPos(doc)
		if ok != wantOK || ok && got != *want.Pos {
			t.Errorf("%s: %q %v, encoding/json %v %v", doc, got, ok, want.Pos, wantOK)
		}
	}
}

func BenchmarkStoredPos(b *testing.B) {
	doc := `{"v":1,"epoch":"0a1b2c3d","system_id":"7412345678901234567","slot":"pgrelay_pub","lsn":"0/16B3748","in_txn":null,"snapshot":null,"tables":["public.orders"],"updated_at":"2026-12-01T06:15:03.583036Z","pos":"00000001/00000000016b3748/ffffffffffffffff/0000000000000000"}`
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, ok := storedPos(doc); !ok {
			b.Fatal("no pos")
		}
	}
}

// countDown never takes the priming backoff below zero, however many writes count at once.
func TestCountDownStopsAtZero(t *testing.T) {
	for range 50 {
		var n atomic.Int64
		n.Store(3)
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() { defer wg.Done(); countDown(&n) }()
		}
		wg.Wait()
		if got := n.Load(); got != 0 {
			t.Fatalf("after 8 count-downs from 3: %d", got)
		}
	}
}

// TestWriteTxConflictKeepsConnection: an EXEC aborted by a changed watched key leaves the
// connection in step, so the write goes again on it: no new connection per conflict (two sources
// writing one queue conflict on about every other batch), and the write lands once.
func TestWriteTxConflictKeepsConnection(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := r.Client()
	ctx := context.Background()
	q := "conflict-conn"
	w, leaseKey, ptrKey, cover, first, second := firstOfTwo(t, rdb, q)
	var races atomic.Int32
	w.beforeExec = func() {
		if races.Add(1) < maxTxConflicts { // aborted EXECs, fewer than make the script write
			rdb.PExpire(ctx, leaseKey, time.Minute)
		}
	}
	connections := func() int64 {
		for _, line := range strings.Split(rdb.Info(ctx, "stats").Val(), "\r\n") {
			if v, ok := strings.CutPrefix(line, "total_connections_received:"); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				return n
			}
		}
		t.Fatal("no total_connections_received in INFO stats")
		return 0
	}
	before, evals := connections(), evalCalls(t, rdb)
	if res, err := w.Write(ctx, second, cover("0003")); err != nil || res != ResultOK {
		t.Fatalf("second batch: %v %v", res, err)
	}
	if races.Load() != maxTxConflicts {
		t.Fatalf("%d EXECs, want %d aborted and the one that wrote", races.Load(), maxTxConflicts-1)
	}
	if n := connections() - before; n != 0 {
		t.Fatalf("%d new connections for a write whose EXEC aborted %d times, want 0", n, maxTxConflicts-1)
	}
	if evalCalls(t, rdb) != evals {
		t.Fatal("written by the script, want the transaction")
	}
	checkQueue(t, rdb, w.Layout(), q, first, second)
	if got := rdb.Get(ctx, ptrKey).Val(); got != `{"pos":"0003"}` {
		t.Fatalf("pointer %s, want pos 0003", got)
	}
}

// firstOfTwo leases a source on queue q, writes the first of two batches with a 4-shard writer
// (closed at the test's end) and returns them, for a test of what happens to the second.
func firstOfTwo(t *testing.T, rdb *redis.Client, q string) (w *Writer, leaseKey, ptrKey string, cover func(string) *Cover, first, second []Message) {
	t.Helper()
	leaseKey, ptrKey, cover = leasedSource(t, rdb, q)
	w = NewWriter(rdb, WriterConfig{Shards: 4})
	t.Cleanup(func() { w.Close() })
	first, second = batchOf(q, "first", 20, 6), batchOf(q, "second", 30, 6)
	if res, err := w.Write(context.Background(), first, cover("0001")); err != nil || res != ResultOK {
		t.Fatalf("first batch: %v %v", res, err)
	}
	return w, leaseKey, ptrKey, cover, first, second
}

// TestWriteMixedLayouts writes batches that span a queue of layout version 1 (an earlier pgrelay's)
// and a new one (version 2) under one cover, one after another so the later ones use the primed
// reads, through the transaction and through the script: each queue holds exactly its messages, each
// in its own layout, and the pointer is the last cover's.
func TestWriteMixedLayouts(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := r.Client()
	ctx := context.Background()
	l := NewLayout("")
	for _, script := range []bool{false, true} {
		t.Run(fmt.Sprintf("script=%v", script), func(t *testing.T) {
			old, fresh := fmt.Sprintf("old%v", script), fmt.Sprintf("new%v", script)
			rdb.HSet(ctx, l.Meta(old), "shards", "4", "version", "1")
			_, ptrKey, cover := leasedSource(t, rdb, old)
			w := NewWriter(rdb, WriterConfig{Shards: 4})
			defer w.Close()
			w.scriptOnly = script
			var olds, news [][]Message
			for b, pos := range []string{"0001", "0002", "0003"} {
				o, n := batchOf(old, fmt.Sprintf("o%d", b), 12, 5), batchOf(fresh, fmt.Sprintf("n%d", b), 12, 5)
				var batch []Message
				for i := range o { // interleaved: each message's queue picks its layout
					batch = append(batch, o[i], n[i])
				}
				if res, err := w.Write(ctx, batch, cover(pos)); err != nil || res != ResultOK {
					t.Fatalf("batch %d: %v %v", b, res, err)
				}
				olds, news = append(olds, o), append(news, n)
			}
			if v := rdb.HGet(ctx, l.Meta(fresh), "version").Val(); v != strconv.Itoa(LayoutVersion) {
				t.Fatalf("new queue: version %s", v)
			}
			checkQueue(t, rdb, l, old, olds...)
			checkQueue(t, rdb, l, fresh, news...)
			if p := rdb.Get(ctx, ptrKey).Val(); p != `{"pos":"0003"}` {
				t.Errorf("pointer %s", p)
			}
		})
	}
}
