package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgrelay/pgrelay/internal/queue"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

func TestQueueCLIInfoAndDLQ(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := r.Client()
	ctx := context.Background()
	w := queue.NewWriter(rdb, queue.WriterConfig{Shards: 2})
	var msgs []queue.Message
	for i := 0; i < 10; i++ {
		msgs = append(msgs, queue.Message{Queue: "cq", Partition: fmt.Sprintf("p%d", i%2), ID: fmt.Sprintf("m%d", i),
			Payload: []byte(fmt.Sprintf(`{"n":%d}`, i))})
	}
	if _, err := w.Write(ctx, msgs, nil); err != nil {
		t.Fatal(err)
	}
	// group g reads everything, fails m0..m2 once with max_attempts 1 (dead letters), acks the rest
	c, err := queue.NewConsumer(rdb, queue.ConsumerConfig{Queue: "cq", Group: "g", MaxAttempts: 1,
		Block: 50 * time.Millisecond, LeaseTTL: time.Second, Backoff: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	for done := 0; done < 10; {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		d, err := c.Read(rctx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		failed := map[int]error{}
		for i, e := range d.Entries {
			if e.MessageID <= "m2" {
				failed[i] = fmt.Errorf("cannot apply %s", e.MessageID)
			}
		}
		done += len(d.Entries)
		if len(failed) > 0 {
			_ = c.Nack(ctx, d, failed)
			done -= len(d.Entries) - len(failed)
			continue
		}
		_ = c.Ack(ctx, d)
	}
	_ = c.Close(ctx)

	var info queue.Info
	if err := json.Unmarshal([]byte(runCLI(t, "queue", "info", "--url", r.URL(), "--json", "cq")), &info); err != nil {
		t.Fatal(err)
	}
	if info.Shards != 2 || info.Length != 10 || info.DeadLetters != 3 || len(info.Groups) != 1 ||
		info.Groups[0].Name != "g" || info.Groups[0].Lag != 0 || info.Groups[0].Pending != 0 {
		t.Fatalf("info %+v", info)
	}
	// the same from a pipeline config (-c): connection and queue from its redis_queue input
	cfg := writeConfig(t, "p.yaml", fmt.Sprintf("input:\n  redis_queue:\n    url: ${PGRELAY_TEST_UNSET_URL:%s}\n    queue: cq\n    group: g\noutput:\n  drop: {}\n", r.URL()))
	var fromCfg queue.Info
	if err := json.Unmarshal([]byte(runCLI(t, "queue", "info", "-c", cfg, "--json")), &fromCfg); err != nil {
		t.Fatal(err)
	}
	if fromCfg.Queue != "cq" || fromCfg.Length != 10 {
		t.Fatalf("info -c: %+v", fromCfg)
	}
	human := runCLI(t, "queue", "info", "cq", "--url", r.URL()) // flags may follow the name
	for _, want := range []string{"queue cq: 2 shards, 10 messages kept, 3 dead letters", "group g: lag 0, pending 0"} {
		if !strings.Contains(human, want) {
			t.Fatalf("info lacks %q:\n%s", want, human)
		}
	}
	var dls []queue.DeadLetter
	if err := json.Unmarshal([]byte(runCLI(t, "queue", "dlq", "--url", r.URL(), "--json", "cq")), &dls); err != nil {
		t.Fatal(err)
	}
	if len(dls) != 3 || dls[0].Error != "cannot apply "+dls[0].MessageID || dls[0].Group != "g" || dls[0].Attempts != 1 {
		t.Fatalf("dead letters %+v", dls)
	}
	if out := runCLI(t, "queue", "dlq", "--url", r.URL(), "cq"); !strings.Contains(out, "3 dead letters") || !strings.Contains(out, "error: cannot apply m") {
		t.Fatalf("dlq listing:\n%s", out)
	}
	if out := runCLI(t, "queue", "dlq", "--url", r.URL(), "--replay", "--limit", "2", "cq"); !strings.Contains(out, "replayed 2") {
		t.Fatalf("replay: %s", out)
	}
	if got := rdb.XLen(ctx, "pgrelay:{cq}:dlq").Val(); got != 1 {
		t.Fatalf("%d dead letters after replaying 2", got)
	}
	if err := json.Unmarshal([]byte(runCLI(t, "queue", "info", "--url", r.URL(), "--json", "cq")), &info); err != nil {
		t.Fatal(err)
	}
	if info.Length != 12 || info.Groups[0].Lag != 2 {
		t.Fatalf("after replay: length %d lag %d", info.Length, info.Groups[0].Lag)
	}
	if out := runCLI(t, "queue", "dlq", "--url", r.URL(), "--drop", "--json", "cq"); !strings.Contains(out, `"dropped": 1`) {
		t.Fatalf("drop: %s", out)
	}
	// a second group makes replay ask for --all-groups
	rdb.XGroupCreate(ctx, "pgrelay:{cq}:s:0", "other", "0")
	rdb.XAdd(ctx, &redis.XAddArgs{Stream: "pgrelay:{cq}:dlq", Values: []string{"off", "1", "p", "p0", "id", "mx",
		"tx", "", "ts", "0", "h", "", "d", "{}", "group", "g", "error", "x", "attempts", "1", "failed_at", "0"}})
	out, err := exec.Command(testenv.Binary(t), "queue", "dlq", "--url", r.URL(), "--replay", "cq").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "replay_all_groups") {
		t.Fatalf("replay with two groups: %v %s", err, out)
	}
	out, err = exec.Command(testenv.Binary(t), "queue", "info", "--url", r.URL(), "nosuch").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "no_queue") {
		t.Fatalf("missing queue: %v %s", err, out)
	}
}
