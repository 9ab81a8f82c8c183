package tests

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay/internal/cdctest"
	"github.com/pgrelay/pgrelay/internal/queue"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// TestEvictingRedisRefused runs pg_cdc → redis_queue and redis_queue → drop against a Redis with
// maxmemory and allkeys-lru: the source, the output and the input each refuse it with
// redis_eviction and the fix, and no queue key is written (the source's status shows the code); after CONFIG SET maxmemory-policy
// noeviction all three start without a restart.
func TestEvictingRedisRefused(t *testing.T) {
	e := newCDCEnv(t, "evict", `[{table: w, queue: q}]`, "")
	e.pg.Exec(writerTable)
	rdb := e.rd.Client()
	for k, v := range map[string]string{"maxmemory": "100mb", "maxmemory-policy": "allkeys-lru"} {
		if err := rdb.ConfigSet(e.ctx, k, v).Err(); err != nil {
			t.Fatal(err)
		}
	}
	consumer := writeConfig(t, "consumer.yaml", fmt.Sprintf(`http: {enabled: false}
input:
  redis_queue: {url: %s, queue: q, group: g, lease_ttl: 3s}
output:
  drop: {}
`, e.rd.URL()))
	src := e.start()
	in := testenv.StartProcess(t, nil, testenv.Binary(t), "-c", consumer)

	want := fmt.Sprintf("redis_eviction: redis 127.0.0.1:%d has maxmemory 104857600 bytes with maxmemory-policy allkeys-lru", e.rd.Port)
	fix := "Fix: run CONFIG SET maxmemory-policy noeviction"
	cdctest.WaitEvery(t, 60*time.Second, 250*time.Millisecond, "the source's and the output's refusals", func() (bool, string) {
		out := src.Output()
		bySource := strings.Count(out, "pg_cdc evict: "+want)
		return bySource > 0 && strings.Count(out, want) > bySource && strings.Contains(out, fix), lastBytes(out, 2000)
	})
	cdctest.WaitEvery(t, 60*time.Second, 250*time.Millisecond, "the input's refusal", func() (bool, string) {
		return strings.Contains(in.Output(), want) && strings.Contains(in.Output(), fix), lastBytes(in.Output(), 2000)
	})
	// the source holds its lease and reports the refusal for pgrelay status; no queue key exists
	if keys, _ := rdb.Keys(e.ctx, "*").Result(); len(keys) != 3 || rdb.Exists(e.ctx, e.leaseKey()).Val() != 1 {
		t.Fatalf("refused components wrote more than the lease and the status: %v", keys)
	}
	status := rdb.HGetAll(e.ctx, "pgrelay:{q}:src:evict:status").Val()
	if len(status) != 1 || !strings.Contains(fmt.Sprint(status), `"code":"redis_eviction"`) {
		t.Errorf("status: %v", status)
	}

	if err := rdb.ConfigSet(e.ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	e.waitPointer()
	e.pg.Exec(`INSERT INTO w SELECT g, 'x' FROM generate_series(1, 5) g`)
	cdctest.WaitEvery(t, 60*time.Second, 250*time.Millisecond, "the input to consume the 5 inserts", func() (bool, string) {
		info, err := queue.Inspect(e.ctx, rdb, queue.NewLayout("pgrelay"), "q")
		if err != nil {
			return false, err.Error()
		}
		ok := info.Length == 5 && len(info.Groups) == 1 && info.Groups[0].Lag == 0 && info.Groups[0].Pending == 0
		return ok, fmt.Sprintf("%+v", *info)
	})
}

func lastBytes(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// TestRedisAtItsMemoryLimit: Redis reaches maxmemory (noeviction) while pg_cdc streams a random
// writer's transactions into redis_queue. Its writes are refused with redis_oom and the fix, the
// source re-sends the same batch with backoff and counts the code in pgrelay_source_errors;
// nothing is lost or repeated: once maxmemory is
// raised, with no restart, the queue replays to the table exactly and the source says the batch
// went.
func TestRedisAtItsMemoryLimit(t *testing.T) {
	port := testenv.FreePort(t)
	pg := testenv.StartPostgres(t)
	e := newCDCEnvWith(t, pg, pg.DSN(), "oom", `[{table: w, queue: q}]`, func(p *cdctest.Pipeline, _ *testenv.Redis) {
		p.Top = fmt.Sprintf("http: {address: \"127.0.0.1:%d\"}\nmetrics: {prometheus: {}}", port)
	})
	e.pg.Exec(writerTable)
	rdb := e.rd.Client()
	src := e.start()
	e.waitPointer()
	stop := make(chan struct{})
	committed := e.randomWriter(7, stop)
	time.Sleep(time.Second)
	if err := rdb.ConfigSet(e.ctx, "maxmemory", "1").Err(); err != nil { // below what Redis uses
		t.Fatal(err)
	}
	cdctest.WaitEvery(t, 60*time.Second, 250*time.Millisecond, "the writes refused", func() (bool, string) {
		out := src.Output()
		return strings.Contains(out, "redis_oom: Redis is at its memory limit") && strings.Contains(out, "Fix: raise maxmemory"), lastBytes(out, 2000)
	})
	// counted by code for the alert rules (PgrelaySourceErrorCodes), though the session goes on
	cdctest.WaitEvery(t, 30*time.Second, 250*time.Millisecond, "redis_oom in pgrelay_source_errors", func() (bool, string) {
		body, err := testenv.HTTPGet(e.ctx, fmt.Sprintf("http://127.0.0.1:%d/metrics", port), 10*time.Second)
		if err != nil {
			return false, err.Error()
		}
		return hasSeries(body, "pgrelay_source_errors", `[1-9][0-9]*`, `code="redis_oom"`, `source="oom"`), body
	})
	time.Sleep(2 * time.Second) // several re-sends refused
	close(stop)
	n := committed()
	if err := rdb.ConfigSet(e.ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	e.converge("public.w", "id")
	if out := src.Output(); !strings.Contains(out, "re-sends") {
		t.Errorf("no line says the re-sent batch went:\n%s", lastBytes(out, 2000))
	}
	t.Logf("%d transactions", n)
}
