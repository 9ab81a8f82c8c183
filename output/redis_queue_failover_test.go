package output

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/pgrelay/pgrelay/internal/testenv"
)

// TestQueueOutputWarnsAOFOnFailover builds the output from linted configs and checks that it warns
// at start exactly when its Redis fails over by itself (Sentinel or Cluster) and durability is aof
// alone.
func TestQueueOutputWarnsAOFOnFailover(t *testing.T) {
	const sentinel = `sentinel: {master_name: m, addresses: ["127.0.0.1:26379"]}`
	for _, c := range []struct {
		conn, durability string
		warn             bool
	}{
		{sentinel, "aof", true},
		{`cluster_urls: ["redis://127.0.0.1:7000"]`, "aof", true},
		{sentinel, "{replicas: 1}", false},
		{`url: redis://127.0.0.1:6379`, "aof", false},
	} {
		yaml := fmt.Sprintf("{%s, queue: q, durability: %s}", c.conn, c.durability)
		_, logs := lintedQueueOutput(t, yaml)
		if got := strings.Contains(logs.String(), "durability: aof with Redis Sentinel or Cluster"); got != c.warn {
			t.Errorf("%s: warned %v, want %v\n%s", yaml, got, c.warn, logs.String())
		}
	}
}

// TestQueueOutputWarnsTruncatedLoad connects the output with durability aof to a real Redis and
// checks that it warns exactly when the server loads a cut append-only file by truncating it
// (aof-load-truncated yes, Redis' default), the case docs/operations.md describes.
func TestQueueOutputWarnsTruncatedLoad(t *testing.T) {
	r := testenv.StartRedis(t)
	ctx := context.Background()
	for _, c := range []struct {
		setting    string
		durability string
		warn       bool
	}{
		{"yes", "aof", true},
		{"no", "aof", false},
		{"yes", "none", false},
	} {
		if err := r.Client().ConfigSet(ctx, "aof-load-truncated", c.setting).Err(); err != nil {
			t.Fatal(err)
		}
		yaml := fmt.Sprintf("{url: %q, queue: q, durability: %s}", "redis://"+r.Addr(), c.durability)
		o, logs := lintedQueueOutput(t, yaml)
		if err := o.Connect(ctx); err != nil {
			t.Fatalf("%s, aof-load-truncated %s: connect: %v", yaml, c.setting, err)
		}
		_ = o.Close(ctx)
		if got := strings.Contains(logs.String(), "aof-load-truncated yes on redis "+r.Addr()); got != c.warn {
			t.Errorf("%s, aof-load-truncated %s: warned %v, want %v\n%s", yaml, c.setting, got, c.warn, logs.String())
		}
	}
}

// lintedQueueOutput builds the redis_queue output of yaml, after the linter accepted it, with a
// logger whose lines it returns.
func lintedQueueOutput(t *testing.T, yaml string) (*queueOutput, *bytes.Buffer) {
	t.Helper()
	if err := service.NewStreamBuilder().AddOutputYAML("redis_queue: " + yaml); err != nil {
		t.Fatalf("%s: lint: %v", yaml, err)
	}
	conf := parsedConfig(t, yaml)
	logs := &bytes.Buffer{}
	log := service.NewLoggerFromSlog(slog.New(slog.NewTextHandler(logs, nil)))
	return newQueueOutput(conf, service.MockResources(service.MockResourcesOptUseLogger(log))), logs
}
