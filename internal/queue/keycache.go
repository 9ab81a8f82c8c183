package queue

import (
	"strconv"
	"sync"

	"github.com/pgrelay/pgrelay/internal/redisconn"
)

// queueKeys are one queue's keys and meta fields as the writer sends them. A write names the
// queue's meta hash and every shard stream it reads or writes (with the next write's reads primed,
// every shard of its queues, up to maxPrimedStreams): built for each write, those names were a
// fifth of the allocations of a pipeline streaming small transactions. They are made once per
// queue and shard count instead, and never written again (every write may read them at once).
type queueKeys struct {
	meta    string
	streams []string // by shard
	offs    []string // the meta hash's "off:<n>" field, by shard
	bulks   [][]byte // each stream key as a RESP bulk string, by shard
}

// keyCache holds the writer's queueKeys by queue. It grows with the queues written, as the
// writer's shard counts do.
type keyCache struct {
	layout Layout
	mu     sync.Mutex
	queues map[string]*queueKeys
}

// of returns q's keys for at least shards shards. A queue that gained shards gets new keys; keys
// handed out before stay as they were.
func (c *keyCache) of(q string, shards int) *queueKeys {
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.queues[q]
	if old != nil && len(old.streams) >= shards {
		return old
	}
	k := &queueKeys{meta: c.layout.Meta(q)}
	if old != nil {
		k.streams, k.offs, k.bulks = old.streams, old.offs, old.bulks
	}
	for n := len(k.streams); n < shards; n++ {
		stream := c.layout.Stream(q, n)
		k.streams = append(k.streams, stream)
		k.offs = append(k.offs, "off:"+strconv.Itoa(n))
		k.bulks = append(k.bulks, redisconn.AppendBulk(nil, stream))
	}
	if c.queues == nil {
		c.queues = map[string]*queueKeys{}
	}
	c.queues[q] = k
	return k
}
