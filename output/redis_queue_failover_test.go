package output

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/redpanda-data/benthos/v4/public/service"
)

// TestQueueOutputWarnsAOFOnFailover builds the output from linted configs and checks that it warns
// at start exactly when its Redis fails over by itself (Sentinel or Cluster) and durability is aof
// alone.
func TestQueueOutputWarnsAOFOnFailover(t *testing.T) {
	const sentinel = `sentinel: {master_name: m, addresses: ["127.0.0.1:26379"]}`
	spec := RedisQueueSpec()
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
		if err := service.NewStreamBuilder().AddOutputYAML("redis_queue: " + yaml); err != nil {
			t.Fatalf("%s: lint: %v", yaml, err)
		}
		pc, err := spec.ParseYAML(yaml, nil)
		if err != nil {
			t.Fatal(err)
		}
		conf, err := RedisQueueConfigFromParsed(pc)
		if err != nil {
			t.Fatal(err)
		}
		var logs bytes.Buffer
		log := service.NewLoggerFromSlog(slog.New(slog.NewTextHandler(&logs, nil)))
		newQueueOutput(conf, service.MockResources(service.MockResourcesOptUseLogger(log)))
		if got := strings.Contains(logs.String(), "durability: aof with Redis Sentinel or Cluster"); got != c.warn {
			t.Errorf("%s: warned %v, want %v\n%s", yaml, got, c.warn, logs.String())
		}
	}
}
