package queue

import (
	"hash/crc32"
	"strconv"
	"unsafe"

	"github.com/pgrelay/pgrelay/internal/redisconn"
)

// DefaultPrefix is the key prefix used when none is configured.
const DefaultPrefix = "pgrelay"

// DefaultShards is the shard count of a queue created without an explicit count.
const DefaultShards = 16

// MaxQueueNameBytes is the longest queue name (ValidQueueName).
const MaxQueueNameBytes = 256

// Layout names the Redis keys of the queues under one prefix (DESIGN §4). Every key of one queue
// carries the hash tag {queue}, so one script call touches one Cluster slot.
type Layout struct {
	Prefix string
}

// NewLayout returns the layout for prefix ("" means DefaultPrefix).
func NewLayout(prefix string) Layout {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	return Layout{Prefix: prefix}
}

// Meta is the hash holding `shards`, `version` and `off:<n>` of queue q.
func (l Layout) Meta(q string) string { return redisconn.Key(l.Prefix, q, "meta") }

// Stream is the stream of shard n of queue q.
func (l Layout) Stream(q string, n int) string {
	return redisconn.Key(l.Prefix, q, "s", strconv.Itoa(n))
}

// GroupLease is the lease of shard n for consumer group g of queue q.
func (l Layout) GroupLease(q, g string, n int) string {
	return redisconn.Key(l.Prefix, q, "g", g, "lease", strconv.Itoa(n))
}

// Attempts is the hash of failed-attempt counts (field: "<shard>:<entry id>") of group g on queue q.
func (l Layout) Attempts(q, g string) string { return redisconn.Key(l.Prefix, q, "g", g, "attempts") }

// GroupStart is the hash holding the start of group g of queue q when it began after a load from
// PostgreSQL (positions, snapshot, lsn, created_at; see Start). Absent for other groups.
func (l Layout) GroupStart(q, g string) string { return redisconn.Key(l.Prefix, q, "g", g, "start") }

// DLQ is the dead-letter stream of queue q.
func (l Layout) DLQ(q string) string { return redisconn.Key(l.Prefix, q, "dlq") }

// ConsumerName is the consumer name of shard n in every group: the pending entries belong to the
// shard, not to a process, so a new owner of the shard finds them.
func ConsumerName(n int) string { return "shard-" + strconv.Itoa(n) }

// Shard maps a partition to its shard: CRC-32 (IEEE) of the partition name mod shards.
func Shard(partition string, shards int) int {
	if shards <= 1 {
		return 0
	}
	// the checksum only reads the bytes: a view of the string, not a copy (which allocated per message)
	return int(crc32.ChecksumIEEE(unsafe.Slice(unsafe.StringData(partition), len(partition))) % uint32(shards))
}

// Members is the sorted set of the live replicas of group g on queue q (member: lease owner id,
// score: expiry in Unix ms); each replica takes ceil(shards / live replicas) shards.
func (l Layout) Members(q, g string) string { return l.key(q, "g", g, "members") }

func (l Layout) key(q string, parts ...string) string { return redisconn.Key(l.Prefix, q, parts...) }
