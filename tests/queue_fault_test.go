package tests

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/pgrelay/pgrelay/internal/cdctest"
	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/queue"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// seqMsgs makes n messages over parts partitions; the payload carries the partition and its
// sequence number (1, 2, 3... per partition), from which order is checked.
type seqGen struct {
	parts int
	next  map[string]int
	total int
}

func (g *seqGen) batch(q string, n int) []queue.Message {
	if g.next == nil {
		g.next = map[string]int{}
	}
	out := make([]queue.Message, n)
	for i := range out {
		p := fmt.Sprintf("p%d", rand.Intn(g.parts))
		g.next[p]++
		g.total++
		out[i] = queue.Message{Queue: q, Partition: p, ID: fmt.Sprintf("%s-%d", p, g.next[p]), CreatedMs: time.Now().UnixMilli(),
			Payload: []byte(fmt.Sprintf(`{"p":%q,"n":%d,"pad":"%0100d"}`, p, g.next[p], 0))}
	}
	return out
}

// checkDelivered reads the recording queue (one shard, so its order is the order of the writes) and
// checks: every message of gen is in; per partition a message is never written before its
// predecessor was (repeats of already written ones are allowed: at least once).
func checkDelivered(t *testing.T, rdb redis.Cmdable, stream string, gen *seqGen) {
	t.Helper()
	xs, err := rdb.XRange(context.Background(), stream, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	maxSeen := map[string]int{}
	distinct := map[string]bool{}
	repeats := 0
	var es []queue.Entry
	for _, x := range xs {
		es = queue.EntriesOf(es, x)
	}
	for _, e := range es {
		var body struct {
			P string
			N int
		}
		if err := json.Unmarshal(e.Payload, &body); err != nil {
			t.Fatalf("payload %s: %v", e.Payload, err)
		}
		if body.N > maxSeen[body.P]+1 {
			t.Fatalf("partition %s: message %d written before %d", body.P, body.N, maxSeen[body.P]+1)
		}
		if body.N <= maxSeen[body.P] {
			repeats++
		}
		maxSeen[body.P] = max(maxSeen[body.P], body.N)
		distinct[fmt.Sprintf("%s-%d", body.P, body.N)] = true
	}
	if len(distinct) != gen.total {
		t.Fatalf("%d distinct messages delivered, want %d", len(distinct), gen.total)
	}
	for p, n := range gen.next {
		if maxSeen[p] != n {
			t.Fatalf("partition %s: delivered up to %d of %d", p, maxSeen[p], n)
		}
	}
	t.Logf("%d writes for %d messages (%d repeats after the kill and nacks)", len(xs), gen.total, repeats)
}

// groupDone reports whether group g has delivered and acked every entry of every shard.
func groupDone(ctx context.Context, rdb redis.UniversalClient, q, g string) (bool, string) {
	in, err := queue.Inspect(ctx, rdb, queue.NewLayout(""), q)
	if err != nil {
		return false, err.Error()
	}
	for _, gi := range in.Groups {
		if gi.Name == g {
			return gi.Lag == 0 && gi.Pending == 0, fmt.Sprintf("group %s: %+v", g, in.Groups)
		}
	}
	return false, fmt.Sprintf("no group %s: %+v", g, in.Groups)
}

// inProcessConsumer runs the redis_queue input in this process; its consumer fails whole batches
// at random (a nack), else records them into the "out" queue and acks.
func inProcessConsumer(t *testing.T, conn string, w *queue.Writer, nackRate float64) {
	t.Helper()
	b := service.NewStreamBuilder()
	b.SetLoggerYAML("level: warn")
	if err := b.AddInputYAML(fmt.Sprintf(`
redis_queue:
  %s
  queue: src
  group: g
  batch_count: 20
  block: 100ms
  lease_ttl: 2s
  max_attempts: 1000000
`, conn)); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	rng := rand.New(rand.NewSource(time.Now().UnixNano()))
	cdctest.RunConsumer(t, b, func(ctx context.Context, batch service.MessageBatch) error {
		mu.Lock()
		fail := rng.Float64() < nackRate
		mu.Unlock()
		if fail {
			return errors.New("random nack")
		}
		msgs := make([]queue.Message, len(batch))
		for i, m := range batch {
			p, _ := m.MetaGet("partition")
			id, _ := m.MetaGet("message_id")
			d, _ := m.AsBytes()
			msgs[i] = queue.Message{Queue: "out", Partition: p, ID: id, Payload: d}
		}
		_, err := w.Write(ctx, msgs, nil)
		return err
	})
}

// binaryConsumerConfig is a pgrelay pipeline: the redis_queue input into a redis_queue output that
// records into the "out" queue.
func binaryConsumerConfig(t *testing.T, conn string) string {
	return binaryConsumerConfigTTL(t, conn, "2s")
}

// binaryConsumerConfigTTL is binaryConsumerConfig with a lease TTL; conn is the YAML connection
// line (url: ... or cluster_urls: [...]).
func binaryConsumerConfigTTL(t *testing.T, conn, ttl string) string {
	path := writeConfig(t, "consumer.yaml", fmt.Sprintf(`
http:
  enabled: false
logger:
  level: warn
input:
  redis_queue:
    %[1]s
    queue: src
    group: g
    batch_count: 20
    block: 100ms
    lease_ttl: %[2]s
    max_attempts: 1000000
pipeline:
  processors:
    - sleep:
        duration: 20ms # so the replica is likely mid-batch when it is killed
output:
  redis_queue:
    %[1]s
    queue: out
    shards: 1
    partition: ${! meta("partition") }
    id: ${! meta("message_id") }
`, conn, ttl))
	return path
}

// TestQueueThreeConsumersRandomNacksAndSIGKILL: three replicas of one group (two in this process with
// random nacks, one pgrelay process killed with SIGKILL mid-run and restarted) consume a queue being
// written; every message is delivered and acked, and no partition's order is ever broken.
func TestQueueThreeConsumersRandomNacksAndSIGKILL(t *testing.T) {
	t.Run("plain", func(t *testing.T) { threeConsumers(t, plainTarget(t)) })
	t.Run("cluster", func(t *testing.T) { threeConsumers(t, clusterTarget(t)) })
}

func threeConsumers(t *testing.T, target redisTarget) {
	rdb := target.rdb
	ctx := context.Background()
	src := queue.NewWriter(rdb, queue.WriterConfig{Shards: 8})
	out := queue.NewWriter(rdb, queue.WriterConfig{Shards: 1})
	gen := &seqGen{parts: 30}
	if _, err := src.Write(ctx, gen.batch("src", 200), nil); err != nil {
		t.Fatal(err)
	}
	cfg := binaryConsumerConfig(t, target.conn)
	bin := testenv.Binary(t)
	killed := testenv.StartProcess(t, nil, bin, "-c", cfg)
	inProcessConsumer(t, target.conn, out, 0.2)
	inProcessConsumer(t, target.conn, out, 0.2)

	// keep producing while the consumers run; SIGKILL the pgrelay replica in the middle
	for i := 0; i < 40; i++ {
		if _, err := src.Write(ctx, gen.batch("src", 50), nil); err != nil {
			t.Fatal(err)
		}
		if i == 15 {
			waitOwners(t, rdb, 3) // the pgrelay replica holds its share of shards when it dies
			killed.Kill()
			t.Logf("the killed replica left %d entries pending on its shards", pendingOfOthers(t, rdb))
		}
		if i == 25 {
			testenv.StartProcess(t, nil, bin, "-c", cfg)
		}
		time.Sleep(50 * time.Millisecond)
	}
	cdctest.WaitEvery(t, 60*time.Second, 200*time.Millisecond, "group g done", func() (bool, string) {
		return groupDone(ctx, rdb, "src", "g")
	})
	time.Sleep(500 * time.Millisecond) // let in-flight recordings land
	checkDelivered(t, rdb, "pgrelay:{out}:s:0", gen)
}

// TestQueuePoisonDeadLettersOnce: messages that always fail land in the dead-letter stream exactly
// once each with their error; every other message is delivered.
func TestQueuePoisonDeadLettersOnce(t *testing.T) {
	t.Run("plain", func(t *testing.T) { poisonOnce(t, plainTarget(t)) })
	t.Run("cluster", func(t *testing.T) { poisonOnce(t, clusterTarget(t)) })
}

func poisonOnce(t *testing.T, target redisTarget) {
	rdb := target.rdb
	ctx := context.Background()
	src := queue.NewWriter(rdb, queue.WriterConfig{Shards: 4})
	gen := &seqGen{parts: 10}
	msgs := gen.batch("src", 300)
	poison := map[string]bool{}
	for i := 7; i < len(msgs); i += 37 {
		poison[msgs[i].ID] = true
	}
	if _, err := src.Write(ctx, msgs, nil); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	delivered := map[string]int{}
	b := service.NewStreamBuilder()
	b.SetLoggerYAML("level: error")
	if err := b.AddInputYAML(fmt.Sprintf(`
redis_queue:
  %s
  queue: src
  group: g
  batch_count: 25
  block: 100ms
  max_attempts: 3
`, target.conn)); err != nil {
		t.Fatal(err)
	}
	// the consumer fails a poison message, holds the rest of its partition back with a "blocked"
	// error (no attempt counted) and processes everything else, like pg_sink does
	cdctest.RunConsumer(t, b, func(ctx context.Context, batch service.MessageBatch) error {
		var bErr *service.BatchError
		blocked := map[string]bool{}
		mu.Lock()
		defer mu.Unlock()
		for i, m := range batch {
			id, _ := m.MetaGet("message_id")
			p, _ := m.MetaGet("partition")
			var err error
			switch {
			case poison[id]:
				err = fmt.Errorf("poison %s", id)
				blocked[p] = true
			case blocked[p]:
				err = errcode.New(errcode.Blocked, "behind a failed message of partition "+p, "")
			default:
				delivered[id]++
				continue
			}
			if bErr == nil {
				bErr = service.NewBatchError(batch, err)
			}
			bErr = bErr.Failed(i, err)
		}
		if bErr != nil {
			return bErr
		}
		return nil
	})
	cdctest.WaitEvery(t, 60*time.Second, 100*time.Millisecond, "group g done", func() (bool, string) {
		return groupDone(ctx, rdb, "src", "g")
	})
	dls, err := queue.ListDeadLetters(ctx, rdb, queue.NewLayout(""), "src", "", 0)
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	inDLQ := map[string]int{}
	for _, d := range dls {
		inDLQ[d.MessageID]++
		if d.Attempts != 3 || d.Group != "g" || d.Error != "poison "+d.MessageID || !poison[d.MessageID] {
			t.Fatalf("dead letter %+v", d)
		}
	}
	for _, m := range msgs {
		switch {
		case poison[m.ID] && (inDLQ[m.ID] != 1 || delivered[m.ID] != 0):
			t.Fatalf("poison %s: %d times in the dead-letter stream, delivered %d", m.ID, inDLQ[m.ID], delivered[m.ID])
		case !poison[m.ID] && delivered[m.ID] == 0:
			t.Fatalf("%s never delivered", m.ID)
		}
	}
	t.Logf("%d poison, %d dead letters", len(poison), len(dls))
}

// waitOwners waits until the shards of src are held by n distinct replicas.
func waitOwners(t *testing.T, rdb redis.UniversalClient, n int) {
	t.Helper()
	cdctest.Wait(t, 20*time.Second, fmt.Sprintf("the shards held by %d replicas", n), func() (bool, string) {
		owners := map[string]bool{}
		if in, err := queue.Inspect(context.Background(), rdb, queue.NewLayout(""), "src"); err == nil {
			for _, g := range in.Groups {
				for _, s := range g.Shards {
					if s.Owner != "" {
						owners[s.Owner[:strings.LastIndex(s.Owner, "|")]] = true
					}
				}
			}
		}
		return len(owners) == n, fmt.Sprintf("held by %d replicas", len(owners))
	})
}

// TestQueueSIGTERMHandsShardsOverAtOnce: a pgrelay replica stopped with SIGTERM releases its shard
// leases, so another replica takes them well before the lease TTL (20 s here) could run out.
func TestQueueSIGTERMHandsShardsOverAtOnce(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := r.Client()
	ctx := context.Background()
	if _, err := queue.NewWriter(rdb, queue.WriterConfig{Shards: 4}).Write(ctx, (&seqGen{parts: 8}).batch("src", 20), nil); err != nil {
		t.Fatal(err)
	}
	p := testenv.StartProcess(t, nil, testenv.Binary(t), "-c", binaryConsumerConfigTTL(t, "url: "+r.URL(), "20s"))
	waitOwners(t, rdb, 1)
	c, err := queue.NewConsumer(rdb, queue.ConsumerConfig{Queue: "src", Group: "g", LeaseTTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	go func() { // keep the in-process replica's shards flowing
		for {
			d, err := c.Read(ctx)
			if err != nil {
				return
			}
			_ = c.Ack(ctx, d)
		}
	}()
	waitOwners(t, rdb, 2)
	stopped := time.Now()
	p.Signal(syscall.SIGTERM)
	if err := p.Wait(15 * time.Second); err != nil {
		t.Fatalf("pgrelay after SIGTERM: %v", err)
	}
	cdctest.WaitEvery(t, 10*time.Second, 20*time.Millisecond, "the other replica to hold all 4 shards after SIGTERM", func() (bool, string) {
		return len(c.Held()) == 4, fmt.Sprintf("it holds %v", c.Held())
	})
	t.Logf("all 4 shards moved %s after SIGTERM (lease TTL 20s)", time.Since(stopped).Round(time.Millisecond))
}

// redisTarget is a Redis to test against: its client and the YAML connection line for configs.
type redisTarget struct {
	rdb  redis.UniversalClient
	conn string
}

func plainTarget(t *testing.T) redisTarget {
	r := testenv.StartRedis(t)
	return redisTarget{rdb: r.Client(), conn: "url: " + r.URL()}
}

func clusterTarget(t *testing.T) redisTarget {
	rc := testenv.StartRedisCluster(t)
	var urls []string
	for _, a := range rc.Addrs() {
		urls = append(urls, "redis://"+a)
	}
	return redisTarget{rdb: rc.Client(t), conn: "cluster_urls: [ " + strings.Join(urls, ", ") + " ]"}
}

// pendingOfOthers sums the pending entries of src's shards leased to replicas outside this process.
func pendingOfOthers(t *testing.T, rdb redis.UniversalClient) int64 {
	t.Helper()
	in, err := queue.Inspect(context.Background(), rdb, queue.NewLayout(""), "src")
	if err != nil {
		t.Fatal(err)
	}
	mine := fmt.Sprintf(":%d:", os.Getpid())
	var n int64
	for _, g := range in.Groups {
		for _, s := range g.Shards {
			if s.Owner != "" && !strings.Contains(s.Owner, mine) {
				n += s.Pending
			}
		}
	}
	return n
}
