package tests

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgrelay/pgrelay/internal/cdctest"
	"github.com/pgrelay/pgrelay/internal/oracle"
	"github.com/pgrelay/pgrelay/internal/queue"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// exampleLine is what the example consumers print for each message (examples/README.md).
type exampleLine struct {
	Shard     int    `json:"shard"`
	Offset    int64  `json:"offset"`
	EntryID   string `json:"entry_id"`
	ID        string `json:"id"`
	Partition string `json:"partition"`
	Tx        string `json:"tx"`
	CreatedAt int64  `json:"created_at"`
	Header    string `json:"header"`
	Payload   string `json:"payload"`
}

// deadLetterLine is what the examples print with --dlq.
type deadLetterLine struct {
	Group    string `json:"group"`
	Error    string `json:"error"`
	Attempts int    `json:"attempts"`
	FailedAt int64  `json:"failed_at"`
	Offset   int64  `json:"offset"`
	ID       string `json:"id"`
	Payload  string `json:"payload"`
}

// messageIDPattern is the documented shape of a pg_cdc message id (docs/design.md §3): epoch in
// lower-case hex, LSNs in upper-case hex.
var messageIDPattern = regexp.MustCompile(`^pg:[0-9a-f]{8}:(s:)?[0-9A-F]{16}:(f?[0-9]+)(\.1)?$`)

// exampleRunner is one example consumer: how to start it.
type exampleRunner struct {
	name string
	cmd  []string // program and script; the queue arguments follow
}

// exampleRunners finds Debian's python3 with redis-py and node with examples/node's ioredis
// (both installed by scripts/setup).
func exampleRunners(t *testing.T) []exampleRunner {
	root := testenv.RepoRoot()
	unavailable := func(what string) {
		if testenv.InCI() {
			t.Fatalf("%s (run scripts/setup)", what)
		}
		t.Skipf("%s (run scripts/setup)", what)
	}
	if out, err := exec.Command("/usr/bin/python3", "-c", "import redis").CombinedOutput(); err != nil {
		unavailable(fmt.Sprintf("/usr/bin/python3 cannot import redis: %v %s", err, out))
	}
	node, err := exec.LookPath("node")
	if err != nil {
		unavailable("node not found")
	}
	if _, err := os.Stat(filepath.Join(root, "examples/node/node_modules/ioredis")); err != nil {
		unavailable("examples/node/node_modules/ioredis missing")
	}
	return []exampleRunner{
		{"python", []string{"/usr/bin/python3", filepath.Join(root, "examples/python/consumer.py")}},
		{"node", []string{node, filepath.Join(root, "examples/node/consumer.js")}},
	}
}

func (r exampleRunner) start(t *testing.T, args ...string) *testenv.Process {
	return testenv.StartProcess(t, nil, r.cmd[0], append(r.cmd[1:], args...)...)
}

// run runs the example to its end and returns its output.
func (r exampleRunner) run(t *testing.T, args ...string) string {
	out, err := exec.Command(r.cmd[0], append(r.cmd[1:], args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", r.name, args, err, out)
	}
	return string(out)
}

// exampleLines parses the message lines of an example's output (other lines are its log).
func exampleLines(t *testing.T, out string) []exampleLine {
	var lines []exampleLine
	for _, l := range strings.Split(out, "\n") {
		if !strings.HasPrefix(l, `{"shard"`) {
			continue
		}
		var x exampleLine
		if err := json.Unmarshal([]byte(l), &x); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		lines = append(lines, x)
	}
	return lines
}

// TestExampleConsumers first runs each example alone on 3-shard queues of each layout version
// holding four messages on one shard (two shard streams do not exist yet: the example must create
// its group with MKSTREAM): it prints every message with its fields, header and multi-byte payload
// as written, in the entries the version puts them in (version 3: three in one), and acknowledges
// them all. Then it runs examples/python and examples/node against a queue of layout version 3
// written by pg_cdc (3 shards) while pgrelay's own redis_queue input dead-letters the "poison" rows.
// Each example reads every message exactly once with its id, shard, offset, partition, transaction
// and payload byte for byte as in the queue, some of them packed in one entry; the events replay
// into the source table; after SIGTERM nothing is pending in its group; --dlq prints the dead
// letters. Then the queue is deleted and created again with 5 shards in layout version 2 (a new
// epoch, snapshotted): both examples, still running, follow the new shard count and read the new
// queue exactly once too.
func TestExampleConsumers(t *testing.T) {
	runners := exampleRunners(t)
	e := newCDCEnv(t, "examples", `[{table: w, queue: q}]`, "snapshot: initial")
	raw, _ := os.ReadFile(e.config)
	withShards := func(n int) {
		cfg := regexp.MustCompile(`durability: aof\n(    shards: \d+\n)?`).ReplaceAllString(string(raw), fmt.Sprintf("durability: aof\n    shards: %d\n", n))
		if err := os.WriteFile(e.config, []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	withShards(3)
	e.pg.Exec(writerTable)

	// each example alone, once per layout version, on a queue whose first batch created one of its
	// three shard streams: it creates its group on the other two with MKSTREAM and reads the
	// messages of two batches on that shard. In version 3 the first batch is one entry of three
	// messages and the second one of one; in versions 1 and 2 each message is an entry. The payloads
	// and a header hold multi-byte UTF-8, so a version-3 d sliced by characters, not bytes, shows.
	batches := [][]queue.Message{{
		{Partition: `p "1"`, ID: "m1", Tx: "t1", CreatedMs: 1700000000001, Payload: []byte(`{"op":"m"}`)},
		{Partition: `p "1"`, ID: "m2", Tx: "t1", CreatedMs: 1700000000001, Payload: []byte(`{"op":"m","v":"é"}`), Header: []byte(`{"k":"é 😀","n":1}`)},
		{Partition: `p "1"`, ID: "m3", Tx: "t2", CreatedMs: 1700000000002, Payload: []byte(`{"op":"m","v":"😀 ünïcödé"}`)},
	}, {
		{Partition: `p "1"`, ID: "m4", Tx: "t3", CreatedMs: 1700000000003, Payload: []byte(`{"op":"m","v":"😀"}`)},
	}}
	for _, version := range []int{queue.LayoutV1, queue.LayoutV2, queue.LayoutV3} {
		w := queue.NewWriter(e.rd.Client(), queue.WriterConfig{Shards: 3, CreateVersion: version})
		for _, r := range runners {
			q := fmt.Sprintf("first%d_%s", version, r.name)
			var want []queue.Message
			var entry []int // the stream entry of each message: in version 3 its batch's
			for n, b := range batches {
				b = slices.Clone(b)
				for i := range b {
					b[i].Queue = q
					entry = append(entry, len(entry))
					if version == queue.LayoutV3 {
						entry[len(entry)-1] = n
					}
				}
				if _, err := w.Write(e.ctx, b, nil); err != nil {
					t.Fatal(err)
				}
				want = append(want, b...)
			}
			if v := e.rd.Client().HGet(e.ctx, "pgrelay:{"+q+"}:meta", "version").Val(); v != strconv.Itoa(version) {
				t.Fatalf("%s: layout version %s, want %d", q, v, version)
			}
			p := r.start(t, "--url", e.rd.URL(), "--group", r.name, q)
			waitExampleLines(t, r.name, p, len(want))
			p.Signal(syscall.SIGTERM)
			if err := p.Wait(30 * time.Second); err != nil {
				t.Fatalf("%s on %s: %v\n%s", r.name, q, err, p.Output())
			}
			lines := exampleLines(t, p.Output())
			if len(lines) != len(want) {
				t.Fatalf("%s on %s (layout version %d) printed %d messages, want %d:\n%s", r.name, q, version, len(lines), len(want), p.Output())
			}
			shard := queue.Shard(want[0].Partition, 3)
			for i, l := range lines {
				msg := want[i]
				if l.Offset != int64(i+1) || l.ID != msg.ID || l.Partition != msg.Partition || l.Tx != msg.Tx ||
					l.CreatedAt != msg.CreatedMs || l.Payload != string(msg.Payload) || !sameJSON(l.Header, string(msg.Header)) || l.Shard != shard {
					t.Errorf("%s on %s (layout version %d) printed %+v for %+v", r.name, q, version, l, msg)
				}
			}
			for i := range lines {
				for j := range i {
					if same := lines[i].EntryID == lines[j].EntryID; same != (entry[i] == entry[j]) {
						t.Errorf("%s on %s (layout version %d): messages %d and %d in one entry: %v, want %v", r.name, q, version, j+1, i+1, same, !same)
					}
				}
			}
			if pending, err := e.rd.Client().XPending(e.ctx, fmt.Sprintf("pgrelay:{%s}:s:%d", q, shard), r.name).Result(); err != nil || pending.Count != 0 {
				t.Errorf("%s on %s (layout version %d): pending %+v %v after SIGTERM", r.name, q, version, pending, err)
			}
		}
	}

	// the examples start before the queue exists and wait for it
	consumers := map[string]*testenv.Process{}
	for _, r := range runners {
		consumers[r.name] = r.start(t, "--url", e.rd.URL(), "--group", r.name, "q")
	}
	dlqMaker := startSinkPipeline(t, fmt.Sprintf(`http: {enabled: false}
logger: {level: warn}
input:
  redis_queue: {url: %s, queue: q, group: dlq_maker, max_attempts: 1, lease_ttl: 3s}
output:
  switch:
    cases:
      - check: this.after.v.or("").has_prefix("poison")
        output: {reject: 'poison row ${! json("key.id") }'}
      - output: {drop: {}}
`, e.rd.URL()))
	// the output keeps the layout version of a queue that exists: the first queue is version 3,
	// the second (below) version 2, whatever version the output creates
	createQueue := func(shards, version int) {
		if err := e.rd.Client().HSet(e.ctx, "pgrelay:{q}:meta", "shards", shards, "version", version).Err(); err != nil {
			t.Fatal(err)
		}
	}
	createQueue(3, queue.LayoutV3)
	src := e.start()
	e.waitPointer()

	stop := make(chan struct{})
	wait := e.randomWriter(12, stop)
	time.Sleep(1500 * time.Millisecond)
	close(stop)
	wait()
	e.pg.Exec(`INSERT INTO w (id, v, n, j) VALUES
	  (1001, 'poison 1', 1, '{}'), (1002, 'poison 2', 2, '{}'),
	  (1003, 'ünïcödé "quoted" \ back', 123456789012345678901234567890.123456789, '{"big": 18446744073709551615}')`)
	e.converge("public.w", "id")
	first, err := oracle.ReadQueue(e.ctx, e.rd.Client(), "pgrelay", "q")
	if err != nil {
		t.Fatal(err)
	}
	for name, p := range consumers {
		waitExampleLines(t, name, p, len(first))
		lines := exampleLines(t, p.Output())
		checkExampleRead(t, e, name+" (3 shards, layout version 3)", lines, first)
		if n := entriesOf(lines); n >= len(lines) {
			t.Errorf("%s: %d messages in %d entries of a version-3 queue: none packed", name, len(lines), n)
		} else {
			t.Logf("%s: %d messages in %d entries of the version-3 queue", name, len(lines), n)
		}
	}

	// the dead letters: the two poison inserts, dead-lettered by group dlq_maker
	var poison []oracle.Entry
	for _, en := range first {
		if strings.Contains(string(en.Payload), `"v":"poison`) {
			poison = append(poison, en)
		}
	}
	if len(poison) != 2 {
		t.Fatalf("%d poison entries in the queue, want 2", len(poison))
	}
	cdctest.WaitEvery(t, 60*time.Second, 250*time.Millisecond, "2 dead letters", func() (bool, string) {
		n, _ := e.rd.Client().XLen(e.ctx, "pgrelay:{q}:dlq").Result()
		return n == 2, fmt.Sprintf("%d dead letters", n)
	})
	for _, r := range runners {
		checkDeadLetters(t, r.name, r.run(t, "--url", e.rd.URL(), "--dlq", "q"), poison)
	}
	dlqMaker.Signal(syscall.SIGTERM)
	if err := dlqMaker.Wait(30 * time.Second); err != nil {
		t.Fatalf("dlq_maker: %v", err)
	}

	// the queue is deleted and created again with 5 shards while the examples run
	src.Signal(syscall.SIGTERM)
	if err := src.Wait(30 * time.Second); err != nil {
		t.Fatalf("source: %v", err)
	}
	rdb := e.rd.Client()
	keys, err := rdb.Keys(e.ctx, "pgrelay:{q}:*").Result()
	if err != nil || len(keys) == 0 {
		t.Fatalf("keys: %v %v", keys, err)
	}
	if err := rdb.Del(e.ctx, keys...).Err(); err != nil {
		t.Fatal(err)
	}
	withShards(5)
	createQueue(5, queue.LayoutV2)
	e.pg.Exec(`UPDATE w SET v = 'after the change' WHERE id = 1003`)
	e.start()
	e.waitPointer()
	e.pg.Exec(`INSERT INTO w (id, v) VALUES (2001, 'new queue')`)
	e.converge("public.w", "id")
	second, err := oracle.ReadQueue(e.ctx, rdb, "pgrelay", "q")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the examples read %d messages over 3 shards (layout version 3), then %d over 5 (version 2)", len(first), len(second))
	for name, p := range consumers {
		waitExampleLines(t, name, p, len(first)+len(second))
		p.Signal(syscall.SIGTERM)
		if err := p.Wait(30 * time.Second); err != nil {
			t.Fatalf("%s after SIGTERM: %v", name, err)
		}
		lines := exampleLines(t, p.Output())[len(first):]
		checkExampleRead(t, e, name+" (5 shards, layout version 2)", lines, second)
		if n := entriesOf(lines); n != len(lines) {
			t.Errorf("%s: %d messages in %d entries of a version-2 queue", name, len(lines), n)
		}
		for n := 0; n < 5; n++ {
			pending, err := rdb.XPending(e.ctx, fmt.Sprintf("pgrelay:{q}:s:%d", n), name).Result()
			if err != nil || pending.Count != 0 {
				t.Errorf("%s: shard %d: pending %+v %v after SIGTERM", name, n, pending, err)
			}
		}
	}
}

// entriesOf counts the stream entries the messages printed came in.
func entriesOf(lines []exampleLine) int {
	type entry struct {
		shard int
		id    string
	}
	seen := map[entry]bool{}
	for _, l := range lines {
		seen[entry{l.Shard, l.EntryID}] = true
	}
	return len(seen)
}

// sameJSON says whether a and b are the same JSON value ("" for none): an example prints a version-2
// or -3 header as its JSON encoder writes it.
func sameJSON(a, b string) bool {
	if a == "" || b == "" {
		return a == b
	}
	var x, y any
	return json.Unmarshal([]byte(a), &x) == nil && json.Unmarshal([]byte(b), &y) == nil && reflect.DeepEqual(x, y)
}

// waitExampleLines waits until an example has printed n messages; it fails at once when the
// example exits before.
func waitExampleLines(t *testing.T, name string, p *testenv.Process, n int) {
	t.Helper()
	cdctest.WaitEvery(t, 60*time.Second, 250*time.Millisecond, fmt.Sprintf("%s to print %d messages", name, n), func() (bool, string) {
		exited := p.Exited()
		got := len(exampleLines(t, p.Output()))
		if got < n && exited {
			t.Fatalf("%s exited after printing %d messages of %d:\n%s", name, got, n, p.Output())
		}
		return got >= n, fmt.Sprintf("%d lines", got)
	})
}

// checkExampleRead compares what an example printed with the queue: every entry exactly once,
// with its fields byte for byte, in offset order per shard; and the events replay into the table.
func checkExampleRead(t *testing.T, e *cdcEnv, name string, lines []exampleLine, queue []oracle.Entry) {
	t.Helper()
	byID := map[string]oracle.Entry{}
	shards := map[int]bool{}
	for _, en := range queue {
		byID[en.ID] = en
		shards[en.Shard] = true
	}
	seen := map[string]bool{}
	lastOff := map[int]int64{}
	var read []oracle.Entry
	for _, l := range lines {
		en, ok := byID[l.ID]
		switch {
		case !ok:
			t.Errorf("%s: read %s, not in the queue", name, l.ID)
		case seen[l.ID]:
			t.Errorf("%s: read %s twice", name, l.ID)
		case l.Shard != en.Shard || l.Offset != en.Off || l.Partition != en.Partition || l.Tx != en.Tx || l.Payload != string(en.Payload):
			t.Errorf("%s: %s read as %+v, queue has %+v", name, l.ID, l, en)
		case !messageIDPattern.MatchString(l.ID):
			t.Errorf("%s: id %q does not have the documented shape", name, l.ID)
		case l.Offset <= lastOff[l.Shard]:
			t.Errorf("%s: shard %d offset %d after %d", name, l.Shard, l.Offset, lastOff[l.Shard])
		}
		seen[l.ID] = true
		lastOff[l.Shard] = l.Offset
		read = append(read, oracle.Entry{Shard: l.Shard, Off: l.Offset, Partition: l.Partition, ID: l.ID, Tx: l.Tx, Payload: []byte(l.Payload)})
	}
	if len(seen) != len(byID) || len(lines) != len(queue) {
		t.Errorf("%s: read %d lines, %d distinct ids; the queue has %d entries", name, len(lines), len(seen), len(queue))
	}
	if len(shards) < 2 {
		t.Errorf("%s: the queue used %d shard(s); the test needs several", name, len(shards))
	}
	// the oracle wants shard then offset order
	sort.SliceStable(read, func(i, j int) bool {
		if read[i].Shard != read[j].Shard {
			return read[i].Shard < read[j].Shard
		}
		return read[i].Off < read[j].Off
	})
	res := oracle.Replay(read)
	rows, err := oracle.TableRows(e.ctx, e.conn(), "public.w", []string{"id"})
	if err != nil {
		t.Fatal(err)
	}
	if diffs := append(res.Problems, oracle.Compare(res.Tables["public.w"], rows)...); len(diffs) > 0 {
		t.Errorf("%s: what it read does not replay into the table: %v", name, diffs)
	}
}

// checkDeadLetters compares an example's --dlq output with the poison entries.
func checkDeadLetters(t *testing.T, name, out string, poison []oracle.Entry) {
	t.Helper()
	got := map[string]deadLetterLine{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		var d deadLetterLine
		if err := json.Unmarshal([]byte(l), &d); err != nil {
			t.Fatalf("%s --dlq: line %q: %v", name, l, err)
		}
		got[d.ID] = d
	}
	if len(got) != len(poison) {
		t.Errorf("%s --dlq: %d dead letters, want %d:\n%s", name, len(got), len(poison), out)
	}
	for _, en := range poison {
		d, ok := got[en.ID]
		if !ok || d.Group != "dlq_maker" || !strings.Contains(d.Error, "poison row") || d.Attempts != 1 ||
			d.FailedAt == 0 || d.Offset != en.Off || d.Payload != string(en.Payload) {
			t.Errorf("%s --dlq: %s: %+v", name, en.ID, d)
		}
	}
}

// TestExampleConsumersRefuseUnknownLayout: both examples stop with an error naming the version on a
// queue whose meta has a layout version they do not read (4), print no message and create no group,
// as the redis_queue input refuses it (layout_version).
func TestExampleConsumersRefuseUnknownLayout(t *testing.T) {
	runners := exampleRunners(t)
	rd := testenv.StartRedis(t)
	rdb := rd.Client()
	ctx := t.Context()
	l := queue.NewLayout(queue.DefaultPrefix)
	for _, r := range runners {
		q := "later_" + r.name
		rdb.HSet(ctx, l.Meta(q), "shards", "1", "version", "4", "off:0", "1")
		if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: l.Stream(q, 0), Values: []any{"m", `{"off":1,"p":"k","id":"m1","tx":"t1","ts":1700000000000}`, "d", `{"op":"m"}`}}).Err(); err != nil {
			t.Fatal(err)
		}
		p := r.start(t, "--url", rd.URL(), "--group", r.name, q)
		err := p.Wait(30 * time.Second)
		if !p.Exited() {
			t.Fatalf("%s kept running on a layout-version-4 queue:\n%s", r.name, p.Output())
		}
		out := p.Output()
		if err == nil || !strings.Contains(out, "layout version 4") {
			t.Errorf("%s on a layout-version-4 queue: exit %v\n%s", r.name, err, out)
		}
		if lines := exampleLines(t, out); len(lines) != 0 {
			t.Errorf("%s printed %d messages of a layout-version-4 queue", r.name, len(lines))
		}
		if groups, _ := rdb.XInfoGroups(ctx, l.Stream(q, 0)).Result(); len(groups) != 0 {
			t.Errorf("%s created groups on a refused queue: %+v", r.name, groups)
		}
	}
}
