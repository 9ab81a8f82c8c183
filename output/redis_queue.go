package output

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/queue"
	"github.com/pgrelay/pgrelay/internal/redisconn"
	"github.com/pgrelay/pgrelay/internal/speclint"
)

// Field names of the redis_queue output (the connection fields are redisconn's).
const (
	rqoFieldQueue             = "queue"
	rqoFieldPartition         = "partition"
	rqoFieldID                = "id"
	rqoFieldShards            = "shards"
	rqoFieldDurability        = "durability"
	rqoFieldReplicas          = "replicas" // in durability
	rqoFieldTimeout           = "timeout"  // in durability
	rqoFieldMaxAge            = "max_age"
	rqoFieldMaxLength         = "max_length"
	rqoFieldTrimInterval      = "trim_interval"
	rqoFieldMaxScriptMessages = "max_script_messages"
	rqoFieldMaxScriptBytes    = "max_script_bytes"
	rqoFieldLayoutVersion     = "layout_version"
	rqoFieldMetadata          = "metadata"
	rqoFieldBatching          = "batching"
)

// rqoUnreachableFor is how long a write retries while Redis cannot be reached at all before the
// output reports not connected (other transient failures, a failover's, are retried for 30 s).
const rqoUnreachableFor = 5 * time.Second

// durability's values, and the limits of the numeric fields.
const (
	rqoDurabilityNone, rqoDurabilityAOF = "none", "aof"
	rqoMaxShards                        = 1024
	rqoMinScriptBytes                   = 1024
)

// RedisQueueSpec is the redis_queue output's config spec.
func RedisQueueSpec() *service.ConfigSpec {
	durabilityMsg := fmt.Sprintf("%s must be %s, %s or {%s: N, %s: 5s}", rqoFieldDurability, rqoDurabilityNone, rqoDurabilityAOF, rqoFieldReplicas, rqoFieldTimeout)
	return service.NewConfigSpec().
		Beta().
		Version("0.1.0").
		Categories("Services").
		Summary("Writes messages to a pgrelay Redis Streams queue, one atomic write per batch.").
		Description(`
Each batch is one atomic write: every check first, then an XADD of each message to its shard (CRC-32 of
the partition mod shards) with the shard's next offset, then the source pointer when the batch carries
one. It is an optimistic transaction (WATCH, reads, MULTI … EXEC), retried when another writer changed
the watched keys, and pgrelay's write script after 3 such conflicts. The queue's layout is public: any
Redis client can consume it.

When a batch carries a source's cover (`+"`pg_cdc`"+` hands it in the messages' context; other producers set the
metadata `+"`pgrelay_lease_key`, `pgrelay_fence`, `pgrelay_pointer_key`, `pgrelay_cover`"+`), the write is fenced by
the source's lease and moves the source's pointer in the same atomic step: a stale fence is refused with an
error coded `+"`fenced`"+`, and a cover that is already in is a `+"`duplicate`"+`, a success that writes nothing.

A batch over `+"`max_script_messages`"+` or `+"`max_script_bytes`"+` is written in several writes; only then is it
not atomic (a crash between the writes repeats the earlier ones under the same message ids).

With any input other than `+"`pg_cdc`"+` this output is at-least-once: a write that fails after Redis ran it
is retried and may repeat messages (same ids).`).
		Fields(redisconn.Fields()...).
		Fields(
			service.NewInterpolatedStringField(rqoFieldQueue).
				Description(fmt.Sprintf("Queue name (1-%d bytes, no `{` or `}`).", queue.MaxQueueNameBytes)).
				Default(`${! meta("queue") }`).Example("orders").
				LintRule(speclint.QueueName(rqoFieldQueue, queue.MaxQueueNameBytes, true)),
			service.NewInterpolatedStringField(rqoFieldPartition).
				Description("Partition: messages of one partition go to one shard and are read back in the order written.").
				Default(`${! meta("partition") }`).Example(`${! json("customer_id") }`),
			service.NewInterpolatedStringField(rqoFieldID).
				Description("Message id, stable across re-sends so consumers can recognise repeats.").
				Default(`${! meta("message_id") }`).Example(`${! uuid_v4() }`),
			service.NewIntField(rqoFieldShards).
				Description(fmt.Sprintf("Shard count of a queue this output creates (default %d, at most %d). An existing queue keeps its count; when this field is set and differs from an existing queue's count, writing fails with `shards_mismatch` (never a silent reshard).", queue.DefaultShards, rqoMaxShards)).
				Optional().LintRule(speclint.Int(rqoFieldShards, 1, rqoMaxShards)),
			service.NewAnyField(rqoFieldDurability).
				Description("What an acknowledged write survives: `none`; `aof` (requires appendonly yes and appendfsync always on every master, checked at connect); or `{replicas: N, timeout: 5s}` (WAIT for N replicas; a shortfall is an error so the source never confirms a write that might vanish).").
				Default(rqoDurabilityNone).Example(rqoDurabilityAOF).Example(map[string]any{rqoFieldReplicas: 1, rqoFieldTimeout: "5s"}).
				LintRule(fmt.Sprintf(`root = if this.type() == "string" { if ![%q, %q].contains(this) { [%q] } } else if this.type() == "object" {
  if this.keys().any(k -> ![%q, %q].contains(k)) { [%q + this.keys().filter(k -> ![%q, %q].contains(k)).sort().join(", ") + %q] } else { [
  if this.%s.type() != "number" || this.%s < 1 { %q },
  if this.%s.or("") != "" && this.%s.parse_duration().catch(null) == null { %q },
].filter(e -> e != null) } } else { [%q] }`,
					rqoDurabilityNone, rqoDurabilityAOF, durabilityMsg,
					rqoFieldReplicas, rqoFieldTimeout, rqoFieldDurability+" has no field ", rqoFieldReplicas, rqoFieldTimeout, "; "+durabilityMsg,
					rqoFieldReplicas, rqoFieldReplicas, rqoFieldDurability+"."+rqoFieldReplicas+" must be a number, at least 1",
					rqoFieldTimeout, rqoFieldTimeout, rqoFieldDurability+"."+rqoFieldTimeout+" must be a duration such as 5s",
					durabilityMsg)),
			service.NewDurationField(rqoFieldMaxAge).
				Description("Retention: entries older than this may be trimmed, but only once every consumer group has acked them. Empty: no age bound.").
				Default("").Example("168h").Advanced().
				LintRule(fmt.Sprintf(`root = if this != "" && this.parse_duration().catch(null) == null { [%q] }`, rqoFieldMaxAge+" must be empty or a duration such as 168h")),
			service.NewIntField(rqoFieldMaxLength).
				Description("Retention: messages beyond the newest max_length of a shard may be trimmed (whole entries: the oldest entry kept may hold older ones), but only once every consumer group has acked them. 0: no length bound.").
				Default(0).Advanced(),
			service.NewDurationField(rqoFieldTrimInterval).Description("How often retention runs (more than 0s).").Default("30s").Advanced().
				LintRule(speclint.DurationAbove(rqoFieldTrimInterval, 0)),
			service.NewIntField(rqoFieldMaxScriptMessages).Description("Most messages per write (transaction or script call).").Default(1000).Advanced().
				LintRule(speclint.IntMin(rqoFieldMaxScriptMessages, 1)),
			service.NewIntField(rqoFieldMaxScriptBytes).Description(fmt.Sprintf("Most bytes per write (transaction or script call; at least %d).", rqoMinScriptBytes)).Default(8<<20).Advanced().
				LintRule(speclint.IntMin(rqoFieldMaxScriptBytes, rqoMinScriptBytes)),
			service.NewIntField(rqoFieldLayoutVersion).
				Description(fmt.Sprintf("The layout version of a queue this output creates (%s, docs/queue.md): %d packs up to %d consecutive messages of a shard into one stream entry and costs Redis about a third of version %d per message; %d, one message per entry in two fields, and %d, seven fields, are for consumers that read only those layouts while they are upgraded. A queue that exists keeps its own version.",
					queue.LayoutsText(), queue.LayoutV3, queue.PackMessages, queue.LayoutV2, queue.LayoutV2, queue.LayoutV1)).
				Default(queue.LayoutVersion).Advanced().
				LintRule(speclint.Int(rqoFieldLayoutVersion, queue.Layouts[0], queue.Layouts[len(queue.Layouts)-1])),
			service.NewMetadataFilterField(rqoFieldMetadata).
				Description("Metadata keys written into each entry's `h` header (a JSON object); the `redis_queue` input restores them. None by default; the `pgrelay_*` keys are never written.").
				Optional().Advanced().
				LintRule(fmt.Sprintf(`root = if this.type() == "object" && this.include_patterns.or([]).any(p -> "".re_match(p).catch(null) == null) { [%q] }`,
					rqoFieldMetadata+".include_patterns must be regular expressions (Go's syntax)")),
			service.NewOutputMaxInFlightField().Default(1).
				Description("Batches written at the same time. 1 (the default) keeps the order of a partition across batches; more trades that order for throughput (messages inside one batch always stay in order). pg_cdc's batches keep their order at any value: with 2 or more, pg_cdc hands out a full batch while the one before it is written, and the second is queued behind the first's EXEC on the same connection and applies only after it."),
			service.NewBatchPolicyField(rqoFieldBatching),
		).
		LintRule(speclint.Rule(speclint.RedisURLChecks("")...)).
		Example("Generated messages into a queue", "Any Benthos pipeline can produce into a queue: here four partitions of generated numbers, each message with a fresh id.", `
input:
  generate:
    interval: 1s
    mapping: 'root = {"n": counter()}'
output:
  redis_queue:
    url: ${REDIS_URL:redis://127.0.0.1:6379}
    queue: numbers
    partition: ${! json("n") % 4 }
    id: ${! uuid_v4() }
`).
		Example("A durable source queue", "The output of a pg_cdc pipeline: queue, partition and id come from pg_cdc's metadata (the defaults), and an acknowledged write survives a Redis crash (aof) before PostgreSQL is told it may drop the WAL.", `
output:
  redis_queue:
    url: ${REDIS_URL:redis://127.0.0.1:6379}
    durability: aof
`)
}

func init() {
	service.MustRegisterBatchOutput("redis_queue", RedisQueueSpec(),
		func(conf *service.ParsedConfig, mgr *service.Resources) (service.BatchOutput, service.BatchPolicy, int, error) {
			c, err := RedisQueueConfigFromParsed(conf)
			if err != nil {
				return nil, service.BatchPolicy{}, 0, err
			}
			pol, err := conf.FieldBatchPolicy(rqoFieldBatching)
			if err != nil {
				return nil, pol, 0, err
			}
			mif, err := conf.FieldMaxInFlight()
			if err != nil {
				return nil, pol, 0, err
			}
			o := newQueueOutput(c, mgr)
			o.inFlight = mif
			return o, pol, mif, nil
		})
}

// RedisQueueConfig is a parsed redis_queue output section.
type RedisQueueConfig struct {
	Conn           redisconn.Config
	queueField     fieldReader
	partitionField fieldReader
	idField        fieldReader
	writer         queue.WriterConfig
	retention      queue.Retention
	trimEvery      time.Duration
	metadata       *service.MetadataFilter
}

// aclUses are what the output does in Redis, as its start check sees them (redisconn.CheckACL).
func (c RedisQueueConfig) aclUses() []redisconn.Use {
	uses := []redisconn.Use{redisconn.UseServer, redisconn.UseWrite}
	if c.writer.Durability.AOF {
		uses = append(uses, redisconn.UseAOF)
	}
	if c.writer.Durability.Replicas > 0 {
		uses = append(uses, redisconn.UseReplicas)
	}
	if c.retention.Enabled() {
		uses = append(uses, redisconn.UseRetention)
	}
	return uses
}

// StaticQueue is the queue the output writes to when it is one fixed name.
func (c RedisQueueConfig) StaticQueue() (string, bool) { return c.queueField.interp.Static() }

// RedisQueueConfigFromParsed reads a redis_queue output section parsed with RedisQueueSpec.
func RedisQueueConfigFromParsed(conf *service.ParsedConfig) (c RedisQueueConfig, err error) {
	if c.Conn, err = redisconn.Parse(conf); err != nil {
		return c, err
	}
	if c.queueField, err = newFieldReader(conf, rqoFieldQueue); err != nil {
		return c, err
	}
	if q, static := c.StaticQueue(); static {
		if err := queue.ValidQueueName(q); err != nil {
			return c, err
		}
	}
	if c.partitionField, err = newFieldReader(conf, rqoFieldPartition); err != nil {
		return c, err
	}
	if c.idField, err = newFieldReader(conf, rqoFieldID); err != nil {
		return c, err
	}
	c.writer.Prefix = c.Conn.Prefix
	c.writer.UnreachableFor = rqoUnreachableFor
	if conf.Contains(rqoFieldShards) {
		if c.writer.Shards, err = conf.FieldInt(rqoFieldShards); err != nil {
			return c, err
		}
		c.writer.StrictShards = true
	}
	if c.writer.MaxScriptMessages, err = conf.FieldInt(rqoFieldMaxScriptMessages); err != nil {
		return c, err
	}
	if c.writer.MaxScriptBytes, err = conf.FieldInt(rqoFieldMaxScriptBytes); err != nil {
		return c, err
	}
	if c.writer.CreateVersion, err = conf.FieldInt(rqoFieldLayoutVersion); err != nil {
		return c, err
	}
	if !slices.Contains(queue.Layouts, c.writer.CreateVersion) {
		return c, fmt.Errorf("%s: %d is not %s", rqoFieldLayoutVersion, c.writer.CreateVersion, strings.Replace(queue.LayoutsText(), " and ", " or ", 1))
	}
	if c.writer.Durability, err = parseDurability(conf); err != nil {
		return c, err
	}
	if s, _ := conf.FieldString(rqoFieldMaxAge); s != "" {
		if c.retention.MaxAge, err = conf.FieldDuration(rqoFieldMaxAge); err != nil {
			return c, err
		}
	}
	maxLen, err := conf.FieldInt(rqoFieldMaxLength)
	if err != nil {
		return c, err
	}
	c.retention.MaxLength = int64(maxLen)
	if c.trimEvery, err = conf.FieldDuration(rqoFieldTrimInterval); err != nil {
		return c, err
	}
	if c.trimEvery <= 0 {
		return c, errcode.New(errcode.QueueConfig, fmt.Sprintf("%s %s is not above 0s", rqoFieldTrimInterval, c.trimEvery),
			fmt.Sprintf("set %s to a positive duration, e.g. 30s", rqoFieldTrimInterval))
	}
	if conf.Contains(rqoFieldMetadata) {
		if c.metadata, err = conf.FieldMetadataFilter(rqoFieldMetadata); err != nil {
			return c, err
		}
	}
	return c, nil
}

// parseDurability reads `durability`: "none", "aof" or {replicas: N, timeout: D}.
func parseDurability(conf *service.ParsedConfig) (queue.Durability, error) {
	var d queue.Durability
	v, err := conf.FieldAny(rqoFieldDurability)
	if err != nil {
		return d, err
	}
	switch t := v.(type) {
	case string:
		switch t {
		case rqoDurabilityNone, "":
			return d, nil
		case rqoDurabilityAOF:
			d.AOF = true
			return d, nil
		}
	case map[string]any:
		for _, k := range slices.Sorted(maps.Keys(t)) {
			if k != rqoFieldReplicas && k != rqoFieldTimeout {
				return d, fmt.Errorf("%s has no field %s: use %s, %s or {%s: N, %s: 5s}", rqoFieldDurability, k, rqoDurabilityNone, rqoDurabilityAOF, rqoFieldReplicas, rqoFieldTimeout)
			}
		}
		n, err := strconv.Atoi(fmt.Sprint(t[rqoFieldReplicas]))
		if err != nil || n < 1 {
			return d, fmt.Errorf("%s.%s: %v is not a positive number", rqoFieldDurability, rqoFieldReplicas, t[rqoFieldReplicas])
		}
		d.Replicas = n
		if s, ok := t[rqoFieldTimeout].(string); ok && s != "" {
			if d.WaitTimeout, err = time.ParseDuration(s); err != nil {
				return d, fmt.Errorf("%s.%s: %w", rqoFieldDurability, rqoFieldTimeout, err)
			}
		}
		return d, nil
	}
	return d, fmt.Errorf("%s: %v: use %s, %s or {%s: N}", rqoFieldDurability, v, rqoDurabilityNone, rqoDurabilityAOF, rqoFieldReplicas)
}

// queueOutput is the redis_queue output: a thin shell over queue.Writer.
type queueOutput struct {
	conf RedisQueueConfig
	log  *service.Logger

	written    *service.MetricCounter
	duplicates *service.MetricCounter
	trimmed    *service.MetricCounter

	mu     sync.Mutex
	rdb    redis.UniversalClient
	writer *queue.Writer
	rc     reconnect           // a write that found Redis not answering: Connect waits until it does
	queues map[string]struct{} // queues written, for retention
	stop   chan struct{}
	done   chan struct{}

	msgBufs sync.Pool // *[]queue.Message: a batch's messages, reused from batch to batch

	inFlight int // max_in_flight: offered to a source's chain as its window
}

func newQueueOutput(c RedisQueueConfig, mgr *service.Resources) *queueOutput {
	if msg := c.writer.Durability.FailoverWarning(c.Conn.HasFailover()); msg != "" {
		mgr.Logger().Warn(msg)
	}
	m := mgr.Metrics()
	redisconn.LogTo(mgr.Logger())
	return &queueOutput{conf: c, log: mgr.Logger(), queues: map[string]struct{}{},
		written:    m.NewCounter("redis_queue_messages_written"),
		duplicates: m.NewCounter("redis_queue_duplicate_batches"),
		trimmed:    m.NewCounter("redis_queue_entries_trimmed")}
}

// connect opens the output's client and runs its start checks: the Redis user's ACL, the memory
// policy and, with durability aof, the server's AOF settings.
func (c RedisQueueConfig) connect(ctx context.Context) (redis.UniversalClient, *queue.Writer, error) {
	rdb, err := c.Conn.Client()
	if err != nil {
		return nil, nil, err
	}
	// With queues from the messages (pg_cdc's) the commands are checked without their keys; pg_cdc
	// checks the keys of its queues.
	static, _ := c.StaticQueue()
	if err := c.Conn.CheckACL(ctx, rdb, static, c.aclUses()...); err != nil {
		_ = rdb.Close()
		return nil, nil, err
	}
	w := queue.NewWriter(rdb, c.writer)
	if err := w.Connect(ctx); err != nil {
		_ = rdb.Close()
		return nil, nil, err
	}
	return rdb, w, nil
}

// Check runs the output's start checks against its Redis and closes the connection (`pgrelay
// check`); it writes nothing.
func (c RedisQueueConfig) Check(ctx context.Context) error {
	rdb, _, err := c.connect(ctx)
	if err != nil {
		return c.Conn.Explain(err)
	}
	return rdb.Close()
}

// Connect opens the client and runs the start checks. After a write found Redis not answering
// (redis_unreachable: WriteBatch reported not connected, so /ready answers 503), it pings Redis
// until it answers; Benthos then writes the batch again.
func (o *queueOutput) Connect(ctx context.Context) error {
	o.mu.Lock()
	rdb := o.rdb
	o.mu.Unlock()
	if rdb != nil {
		return o.conf.Conn.Explain(o.rc.await(ctx, func(ctx context.Context) error { return rdb.Ping(ctx).Err() }))
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.rdb != nil { // opened meanwhile
		return nil
	}
	rdb, w, err := o.conf.connect(ctx)
	if err != nil {
		return err
	}
	if o.conf.writer.Durability.AOF {
		if msg := queue.TruncatedLoadWarning(ctx, rdb); msg != "" {
			o.log.Warn(msg)
		}
	}
	o.rdb, o.writer = rdb, w
	if q, ok := o.conf.queueField.interp.Static(); ok {
		o.queues[q] = struct{}{}
	}
	if o.conf.retention.Enabled() {
		o.stop, o.done = make(chan struct{}), make(chan struct{})
		go o.trimLoop(o.stop, o.done)
	}
	return nil
}

func (o *queueOutput) WriteBatch(ctx context.Context, batch service.MessageBatch) error {
	o.mu.Lock()
	w := o.writer
	o.mu.Unlock()
	if w == nil {
		return service.ErrNotConnected
	}
	buf, _ := o.msgBufs.Get().(*[]queue.Message)
	if buf == nil {
		buf = new([]queue.Message)
	}
	defer func() {
		clear(*buf) // no references to the batch's strings and payloads are kept
		o.msgBufs.Put(buf)
	}()
	msgs, cover, sb, err := o.toMessages(batch, buf)
	if err != nil {
		return err
	}
	if sb != nil && sb.Chain != nil {
		// with max_in_flight 2 the source may hand out its next batch while this one is written:
		// the writer keeps them in order (docs/batch-contract.md "Two batches in flight")
		sb.Chain.Offer(o.inFlight)
	}
	res, err := w.Write(ctx, msgs, cover)
	if err != nil {
		err = o.conf.Conn.Explain(err)
		if errcode.Of(err) == errcode.RedisUnreachable {
			// not a failed batch: the output waits for Redis in Connect and Benthos writes the same
			// batch again (exactly once with pg_cdc by the pointer's compare-and-set)
			return o.rc.lost(o.log, err)
		}
		o.rc.wrote()
		return err
	}
	o.rc.wrote()
	if sb != nil {
		// the pointer is now at or past the cover: tell the source, which then skips reading it back
		sb.Receipt.Mark(cover.Pos)
	}
	if res == queue.ResultDuplicate {
		o.duplicates.Incr(1)
		return nil
	}
	o.written.Incr(int64(len(msgs)))
	if o.conf.retention.Enabled() {
		o.remember(msgs)
	}
	return nil
}

// remember notes the queues written, for retention (bounded, for interpolated queue names).
func (o *queueOutput) remember(msgs []queue.Message) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for i := range msgs {
		if _, ok := o.queues[msgs[i].Queue]; !ok && len(o.queues) < 10000 {
			o.queues[msgs[i].Queue] = struct{}{}
		}
	}
}

// toMessages converts a batch. The cover comes from the source batch in the messages' context
// (pg_cdc), the same value on every message, or else from the pgrelay_* metadata, parsed once and
// only compared on the other messages. A pg_cdc batch made without metadata (its `metadata: false`)
// also gives each message's queue, partition, id and transaction, by the message's place, where
// the message has no metadata of its own for them; it must then be the batch pg_cdc made, message
// for message.
func (o *queueOutput) toMessages(batch service.MessageBatch, buf *[]queue.Message) ([]queue.Message, *queue.Cover, *queue.SourceBatch, error) {
	if cap(*buf) < len(batch) {
		*buf = make([]queue.Message, len(batch))
	}
	msgs := (*buf)[:len(batch)]
	*buf = msgs
	var cover *queue.Cover
	var sb *queue.SourceBatch
	var keys queue.Keys
	if len(batch) > 0 {
		if sb = queue.SourceBatchOf(batch[0].Context()); sb != nil {
			cover, keys = &sb.Cover, sb.Keys
		}
	}
	if keys != nil && keys.Len() != len(batch) {
		return nil, nil, nil, errcode.New(errcode.BatchReshaped,
			fmt.Sprintf("a pg_cdc batch made without metadata (metadata: false) holds %d messages here where pg_cdc made %d, so their queue, partition and id cannot be known", len(batch), keys.Len()),
			"set metadata: true on pg_cdc (the default) when processors drop, split or add messages")
	}
	qf := o.conf.queueField.reader(batch, keys)
	pf := o.conf.partitionField.reader(batch, keys)
	idf := o.conf.idField.reader(batch, keys)
	var first coverMeta
	now := time.Now().UnixMilli()
	for i, m := range batch {
		var err error
		qm := &msgs[i]
		if qm.Queue, err = qf(i); err != nil {
			return nil, nil, nil, fmt.Errorf("message %d: queue: %w", i, err)
		}
		if qm.Partition, err = pf(i); err != nil {
			return nil, nil, nil, fmt.Errorf("message %d: partition: %w", i, err)
		}
		if qm.ID, err = idf(i); err != nil {
			return nil, nil, nil, fmt.Errorf("message %d: id: %w", i, err)
		}
		var ok bool
		if qm.Tx, ok = metaString(m, "transaction_id"); !ok && keys != nil {
			_, _, _, qm.Tx = keys.Keys(i)
		}
		qm.CreatedMs = now
		if qm.Payload, err = m.AsBytes(); err != nil {
			return nil, nil, nil, fmt.Errorf("message %d: %w", i, err)
		}
		if qm.Header, err = o.header(m); err != nil {
			return nil, nil, nil, fmt.Errorf("message %d: header: %w", i, err)
		}
		if i > 0 && queue.SourceBatchOf(m.Context()) != sb {
			return nil, nil, nil, errMixedBatches
		}
		if sb != nil {
			continue
		}
		cm := coverMetaOf(m)
		if i == 0 {
			first, cover = cm, cm.cover()
		} else if cm != first {
			return nil, nil, nil, errMixedBatches
		}
	}
	return msgs, cover, sb, nil
}

var errMixedBatches = errors.New("the messages of one batch carry different pgrelay_* covers; a source batch must reach this output whole (no output batching across source batches)")

// fieldReader reads an interpolated field (queue, partition, id). The default
// `${! meta("<key>") }` reads the metadata string directly, with no Bloblang evaluation per
// message; any other value (or a non-string metadata value) goes through the interpolation.
type fieldReader struct {
	interp  *service.InterpolatedString
	metaKey string // set when the field is exactly ${! meta("<metaKey>") }
}

func newFieldReader(conf *service.ParsedConfig, name string) (fieldReader, error) {
	f := fieldReader{}
	var err error
	if f.interp, err = conf.FieldInterpolatedString(name); err != nil {
		return f, err
	}
	if raw, err := conf.FieldString(name); err == nil {
		for _, key := range []string{"queue", "partition", "message_id"} {
			if strings.TrimSpace(raw) == `${! meta("`+key+`") }` {
				f.metaKey = key
			}
		}
	}
	return f, nil
}

// reader returns the field's value getter for the messages of batch. A field that is exactly a
// metadata key takes the value from keys (a source batch's, when its messages carry no metadata)
// where the message has no such metadata.
func (f fieldReader) reader(batch service.MessageBatch, keys queue.Keys) func(i int) (string, error) {
	if s, ok := f.interp.Static(); ok {
		return func(int) (string, error) { return s, nil }
	}
	var exec *service.MessageBatchInterpolationExecutor
	return func(i int) (string, error) {
		if f.metaKey != "" {
			if s, ok := metaString(batch[i], f.metaKey); ok {
				return s, nil
			}
			if keys != nil {
				q, p, id, _ := keys.Keys(i)
				switch f.metaKey {
				case "queue":
					return q, nil
				case "partition":
					return p, nil
				default: // message_id
					return id, nil
				}
			}
		}
		if exec == nil {
			exec = batch.InterpolationExecutor(f.interp)
		}
		return exec.TryString(i)
	}
}

// metaString returns metadata key k when it holds a string.
func metaString(m *service.Message, k string) (string, bool) {
	v, ok := m.MetaGetMut(k)
	if !ok {
		return "", false
	}
	s, ok := v.(string)
	return s, ok
}

func (o *queueOutput) header(m *service.Message) ([]byte, error) {
	if o.conf.metadata == nil || o.conf.metadata.IsEmpty() {
		return nil, nil
	}
	h := map[string]any{}
	err := o.conf.metadata.WalkMut(m, func(k string, v any) error {
		if len(k) < 8 || k[:8] != "pgrelay_" {
			h[k] = v
		}
		return nil
	})
	if err != nil || len(h) == 0 {
		return nil, err
	}
	return json.Marshal(h)
}

// coverMeta is the raw pgrelay_* metadata of a message (docs/batch-contract.md).
type coverMeta struct{ leaseKey, fence, pointerKey, coverJSON string }

func coverMetaOf(m *service.Message) coverMeta {
	var c coverMeta
	c.leaseKey, _ = m.MetaGet("pgrelay_lease_key")
	c.fence, _ = m.MetaGet("pgrelay_fence")
	c.pointerKey, _ = m.MetaGet("pgrelay_pointer_key")
	c.coverJSON, _ = m.MetaGet("pgrelay_cover")
	return c
}

// cover parses the metadata into the writer's cover (nil for a plain producer).
func (c coverMeta) cover() *queue.Cover {
	if c.leaseKey == "" && c.pointerKey == "" {
		return nil
	}
	out := &queue.Cover{LeaseKey: c.leaseKey, Fence: c.fence, PointerKey: c.pointerKey}
	if c.coverJSON != "" {
		out.Pointer = []byte(c.coverJSON)
		var doc struct {
			Pos string `json:"pos"`
		}
		_ = json.Unmarshal(out.Pointer, &doc)
		out.Pos = doc.Pos
	}
	return out
}

// trimLoop applies retention to the queues written, every trim_interval.
func (o *queueOutput) trimLoop(stop, done chan struct{}) {
	defer close(done)
	t := time.NewTicker(o.conf.trimEvery)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		o.mu.Lock()
		qs := make([]string, 0, len(o.queues))
		for q := range o.queues {
			qs = append(qs, q)
		}
		rdb := o.rdb
		layout := queue.NewLayout(o.conf.writer.Prefix)
		o.mu.Unlock()
		for _, q := range qs {
			ctx, cancel := context.WithTimeout(context.Background(), o.conf.trimEvery)
			n, err := queue.Trim(ctx, rdb, layout, q, o.conf.retention)
			cancel()
			if err != nil {
				o.log.Warnf("retention: %v", o.conf.Conn.Explain(err))
			}
			o.trimmed.Incr(n)
		}
	}
}

func (o *queueOutput) Close(ctx context.Context) error {
	o.mu.Lock()
	stop, done := o.stop, o.done
	o.stop = nil
	o.mu.Unlock()
	if stop != nil {
		close(stop)
		<-done
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.rdb != nil {
		o.writer.Close()
		err := o.rdb.Close()
		o.rdb, o.writer = nil, nil
		return err
	}
	return nil
}
