package output

import (
	"testing"
	"time"
)

func TestQueueOutputParse(t *testing.T) {
	cases := []struct {
		name, yaml string
		check      func(queueOutputConfig) bool
		wantErr    bool
	}{
		{"defaults", "queue: q\n", func(c queueOutputConfig) bool {
			d := c.writer.Durability
			return !d.AOF && d.Replicas == 0 && c.writer.Shards == 0 && !c.writer.StrictShards &&
				c.writer.Prefix == "pgrelay" && !c.retention.Enabled() && (c.metadata == nil || c.metadata.IsEmpty())
		}, false},
		{"aof, explicit shards", "queue: q\ndurability: aof\nshards: 8\n", func(c queueOutputConfig) bool {
			return c.writer.Durability.AOF && c.writer.Shards == 8 && c.writer.StrictShards
		}, false},
		{"replicas", "queue: q\ndurability:\n  replicas: 2\n  timeout: 250ms\n", func(c queueOutputConfig) bool {
			d := c.writer.Durability
			return d.Replicas == 2 && d.WaitTimeout == 250*time.Millisecond
		}, false},
		{"retention and header", "queue: q\nmax_age: 1h\nmax_length: 10\nmetadata:\n  include_prefixes: [x_]\n", func(c queueOutputConfig) bool {
			return c.retention.MaxAge == time.Hour && c.retention.MaxLength == 10 && c.metadata != nil && c.metadata.Match("x_a") && !c.metadata.Match("y")
		}, false},
		{"replicas zero", "queue: q\ndurability:\n  replicas: 0\n", nil, true},
		{"unknown durability", "queue: q\ndurability: fsync\n", nil, true},
	}
	spec := redisQueueOutputSpec()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pc, err := spec.ParseYAML(c.yaml, nil)
			if err != nil {
				t.Fatal(err)
			}
			got, err := parseQueueOutput(pc)
			if c.wantErr {
				if err == nil {
					t.Fatal("no error")
				}
				return
			}
			if err != nil || !c.check(got) {
				t.Fatalf("%+v %v", got, err)
			}
		})
	}
}
