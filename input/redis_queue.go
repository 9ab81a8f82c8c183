package input

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/redis/go-redis/v9"
	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/pgrelay/pgrelay/internal/confread"
	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/queue"
	"github.com/pgrelay/pgrelay/internal/redisconn"
	"github.com/pgrelay/pgrelay/internal/speclint"
)

// Field names of the redis_queue input (the connection fields are redisconn's).
const (
	rqiFieldQueue          = "queue"
	rqiFieldGroup          = "group"
	rqiFieldStartFrom      = "start_from"
	rqiFieldStartAfterLoad = "start_after_load"
	rqiFieldStartPositions = "positions"
	rqiFieldStartSnapshot  = "snapshot"
	rqiFieldStartLSN       = "lsn"
	rqiFieldBatchCount     = "batch_count"
	rqiFieldBatchBytes     = "batch_bytes"
	rqiFieldBlock          = "block"
	rqiFieldMaxAttempts    = "max_attempts"
	rqiFieldLeaseTTL       = "lease_ttl"
)

// start_from's values.
const rqiStartEarliest, rqiStartLatest = "earliest", "latest"

// RedisQueueSpec is the redis_queue input's config spec.
func RedisQueueSpec() *service.ConfigSpec {
	return service.NewConfigSpec().
		Beta().
		Version("0.1.0").
		Categories("Services").
		Summary("Consumes a pgrelay Redis Streams queue with a consumer group, in order per partition, with dead letters.").
		Description(`
Every replica running the same `+"`group`"+` shares the queue's shards through leases
(`+"`<prefix>:{queue}:g:<group>:lease:<n>`"+`): each takes a fair share, a replica that dies loses its shards
after `+"`lease_ttl`"+`, one that stops hands them over at once. The consumer on shard n is `+"`shard-<n>`"+`, so a new
owner reads the shard's pending entries before new ones.

A batch holds entries of one shard, and a shard has at most one unacknowledged batch, so order within a
partition survives failures: a nack returns the shard to its pending entries (after a short backoff that
grows with consecutive nacks). Errors count failed attempts per message when the output returns a
`+"`*service.BatchError`"+` (only the failed messages), otherwise for every message of the batch. Errors coded
`+"`blocked`"+` (held back behind an earlier failure) or `+"`paused`"+` count no attempt. After `+"`max_attempts`"+`
a message moves to the dead-letter stream `+"`<prefix>:{queue}:dlq`"+` with its error, atomically with its XACK,
and the shard carries on. Keep batches whole between this input and its output (no output `+"`batching`"+`),
or per-message errors are lost.

Metadata: `+"`queue`, `partition`, `message_id`, `transaction_id`"+` (strings), `+"`shard`, `offset`, `created_at`"+`
(Unix ms), `+"`attempts`"+` (failed attempts before this delivery) as integers. Keys of the entry's `+"`h`"+` header
(written by the redis_queue output's `+"`metadata`"+` option) are restored too, except these eight names.`).
		Fields(redisconn.Fields()...).
		Fields(
			service.NewStringField(rqiFieldQueue).Description(fmt.Sprintf("Queue to consume (1-%d bytes, no `{` or `}`).", queue.MaxQueueNameBytes)).Example("orders").
				LintRule(speclint.QueueName(rqiFieldQueue, queue.MaxQueueNameBytes, false)),
			service.NewStringField(rqiFieldGroup).Description("Consumer group: one per pipeline; every replica of the pipeline uses the same name.").Example("orders_sink").
				LintRule(fmt.Sprintf(`root = if this == "" || this.contains(":") || this.contains("{") || this.contains("}") { [%q] }`, rqiFieldGroup+" must be non-empty without ':', '{' or '}'")),
			service.NewStringEnumField(rqiFieldStartFrom, rqiStartEarliest, rqiStartLatest).
				Description("Where a new group starts: the oldest entry kept, or only entries written after it is created.").Default(rqiStartEarliest),
			service.NewObjectField(rqiFieldStartAfterLoad,
				service.NewStringField(rqiFieldStartPositions).Description("The queue's positions read before the load: per shard its last entry id and, after `@`, the entries ever added to it, separated by commas, as `pgrelay queue position` prints them.").
					Example("1718000000000-0@3,0-0@0,1718000000123-4@9").LintRule(speclint.Match(rqiFieldStartAfterLoad+"."+rqiFieldStartPositions, queue.PositionsPattern, false)),
				service.NewStringField(rqiFieldStartSnapshot).Description("`pg_current_snapshot()` of the load's REPEATABLE READ transaction, read by its first statement.").Example("7512:7520:7514").
					LintRule(speclint.Match(rqiFieldStartAfterLoad+"."+rqiFieldStartSnapshot, queue.SnapshotPattern, false)),
				service.NewStringField(rqiFieldStartLSN).Description("`pg_current_wal_insert_lsn()`, read by the same statement.").Example("0/1A2B3C4").
					LintRule(speclint.Match(rqiFieldStartAfterLoad+"."+rqiFieldStartLSN, queue.LSNPattern, false)),
			).Description("For a new group whose consumer loaded its state from PostgreSQL first: the group starts after these positions "+
				"and acks, without delivering, every entry whose transaction the load's snapshot saw, so each transaction reaches the consumer "+
				"exactly once, in the load or from the queue. Read the positions, wait for the transactions in progress "+
				"(`pgrelay queue position --pg <dsn>` does both), then load (docs: queue, \"Load, then follow\"). Stored with the group in "+
				"Redis, so every replica applies it, also one started without it. Refused (`start_conflict`) when the group exists with "+
				"another start or none. Replaces `"+rqiFieldStartFrom+"`.").
				Optional().Advanced(),
			service.NewIntField(rqiFieldBatchCount).Description("Most messages per batch.").Default(500).
				LintRule(speclint.IntMin(rqiFieldBatchCount, 1)),
			service.NewIntField(rqiFieldBatchBytes).Description("Most payload bytes per batch (a batch holds at least one message).").Default(4<<20).
				LintRule(speclint.IntMin(rqiFieldBatchBytes, 1)),
			service.NewDurationField(rqiFieldBlock).Description("How long one read waits for new entries.").Default("1s").Advanced().
				LintRule(speclint.DurationAbove(rqiFieldBlock, 0)),
			service.NewIntField(rqiFieldMaxAttempts).Description("Failed attempts after which a message moves to the dead-letter stream.").Default(3).
				LintRule(speclint.IntMin(rqiFieldMaxAttempts, 1)),
			service.NewDurationField(rqiFieldLeaseTTL).Description("Shard lease TTL; renewed every third of it. A crashed replica's shards move after this.").Default("10s").Advanced().
				LintRule(speclint.DurationAbove(rqiFieldLeaseTTL, 0)),
		).
		LintRule(speclint.Rule(append(speclint.RedisURLChecks(""),
			speclint.Check(fmt.Sprintf(`this.%s != null && this.%s == %q`, rqiFieldStartAfterLoad, rqiFieldStartFrom, rqiStartLatest),
				rqiFieldStartAfterLoad+" replaces "+rqiFieldStartFrom+": leave "+rqiFieldStartFrom+" out"))...)).
		Example("Print a queue", "Reads the queue `orders` as the group `printer` and prints each message; every copy of this pipeline shares the queue's shards, and a message that fails three times moves to the dead-letter stream.", `
input:
  redis_queue:
    url: ${REDIS_URL:redis://127.0.0.1:6379}
    queue: orders
    group: printer
output:
  stdout: {}
`)
}

func init() {
	service.MustRegisterBatchInput("redis_queue", RedisQueueSpec(),
		func(conf *service.ParsedConfig, mgr *service.Resources) (service.BatchInput, error) {
			return newQueueInput(conf, mgr)
		})
}

// RedisQueueConfig is a parsed redis_queue input section.
type RedisQueueConfig struct {
	Conn     redisconn.Config
	Consumer queue.ConsumerConfig // without Logger and the metric hooks
}

// RedisQueueConfigFromParsed reads a redis_queue input section parsed with RedisQueueSpec and
// validates it (a bad queue or group name fails here, at start, not at connect).
func RedisQueueConfigFromParsed(conf *service.ParsedConfig) (RedisQueueConfig, error) {
	var rc RedisQueueConfig
	var err error
	if rc.Conn, err = redisconn.Parse(conf); err != nil {
		return rc, err
	}
	c := &rc.Consumer
	c.Prefix = rc.Conn.Prefix
	r := confread.New(conf)
	c.Queue = r.String(rqiFieldQueue)
	c.Group = r.String(rqiFieldGroup)
	c.StartFrom = r.String(rqiFieldStartFrom)
	c.BatchCount = r.Int(rqiFieldBatchCount)
	c.BatchBytes = r.Int(rqiFieldBatchBytes)
	c.Block = r.Duration(rqiFieldBlock)
	c.MaxAttempts = r.Int(rqiFieldMaxAttempts)
	c.LeaseTTL = r.Duration(rqiFieldLeaseTTL)
	if err := r.Err(); err != nil {
		return rc, err
	}
	if conf.Contains(rqiFieldStartAfterLoad) {
		if c.Start, err = startAfterLoad(conf.Namespace(rqiFieldStartAfterLoad)); err != nil {
			return rc, err
		}
	}
	if _, err := queue.NewConsumer(nil, *c); err != nil {
		return rc, err
	}
	return rc, nil
}

// startAfterLoad parses the start_after_load object.
func startAfterLoad(conf *service.ParsedConfig) (*queue.Start, error) {
	r := confread.New(conf)
	positions, snapshot, lsn := r.String(rqiFieldStartPositions), r.String(rqiFieldStartSnapshot), r.String(rqiFieldStartLSN)
	if err := r.Err(); err != nil {
		return nil, err
	}
	return queue.ParseStart(positions, snapshot, lsn)
}

//------------------------------------------------------------------------------

// queueInput is the redis_queue input: a thin shell over queue.Consumer.
type queueInput struct {
	conn redisconn.Config
	conf queue.ConsumerConfig

	gauges groupGauges
	log    *service.Logger
	// tmpl is the message every delivered one is a copy of: no content, no metadata, the context
	// of tracingBase
	tmpl *service.Message

	mu        sync.Mutex
	rdb       redis.UniversalClient
	consumer  *queue.Consumer
	statsStop context.CancelFunc
	statsDone chan struct{}
}

func newQueueInput(conf *service.ParsedConfig, mgr *service.Resources) (*queueInput, error) {
	rc, err := RedisQueueConfigFromParsed(conf)
	if err != nil {
		return nil, err
	}
	in := &queueInput{conn: rc.Conn, conf: rc.Consumer,
		tmpl: service.NewMessage(nil).WithContext(tracingBase(context.Background(), mgr.OtelTracer()))}
	c := &in.conf
	c.Logger = aclLogger{mgr.Logger(), rc.Conn}
	in.log, in.gauges = mgr.Logger(), newGroupGauges(mgr.Metrics())
	redisconn.LogTo(mgr.Logger())
	c.NewReader = func(poolSize int) (redis.UniversalClient, error) {
		conn := in.conn
		conn.PoolSize = poolSize
		return conn.Client()
	}
	dead := mgr.Metrics().NewCounter("redis_queue_dead_letters")
	gone := mgr.Metrics().NewCounter("redis_queue_trimmed_pending")
	skipped := mgr.Metrics().NewCounter("redis_queue_skipped_in_load")
	c.OnDeadLetter = func(n int) { dead.Incr(int64(n)) }
	c.OnGone = func(n int) { gone.Incr(int64(n)) }
	c.OnSkip = func(n int) { skipped.Incr(int64(n)) }
	return in, nil
}

// connectConsumer opens the input's client and runs its start checks (the Redis user's ACL, the
// memory policy, the consumer's settings); the consumer is not started.
func connectConsumer(ctx context.Context, conn redisconn.Config, conf queue.ConsumerConfig) (redis.UniversalClient, *queue.Consumer, error) {
	rdb, err := conn.Client()
	if err != nil {
		return nil, nil, err
	}
	if err := conn.CheckACL(ctx, rdb, conf.Queue, redisconn.ConsumerUses...); err != nil {
		_ = rdb.Close()
		return nil, nil, err
	}
	if err := queue.CheckEviction(ctx, rdb); err != nil {
		_ = rdb.Close()
		return nil, nil, err
	}
	c, err := queue.NewConsumer(rdb, conf)
	if err != nil {
		_ = rdb.Close()
		return nil, nil, err
	}
	return rdb, c, nil
}

// Check runs the input's start checks against its Redis and closes the connection (`pgrelay
// check`); it creates no group and reads nothing.
func (rc RedisQueueConfig) Check(ctx context.Context) error {
	rdb, _, err := connectConsumer(ctx, rc.Conn, rc.Consumer)
	if err != nil {
		return rc.Conn.Explain(err)
	}
	return rdb.Close()
}

// Connect connects and starts the consumer. Called again after ReadBatch reported the replica not
// ready (queue.ErrNotReady), it waits until it is, returning the reason every connectReport, which
// Benthos logs before it calls Connect again: /ready answers 503 meanwhile.
func (in *queueInput) Connect(ctx context.Context) error {
	in.mu.Lock()
	if c := in.consumer; c != nil {
		in.mu.Unlock()
		return in.conn.Explain(c.WaitReady(ctx, connectReport))
	}
	defer in.mu.Unlock()
	rdb, c, err := connectConsumer(ctx, in.conn, in.conf)
	if err != nil {
		return err
	}
	if err := c.Start(ctx); err != nil {
		_ = rdb.Close()
		return err
	}
	in.rdb, in.consumer = rdb, c
	var sctx context.Context
	sctx, in.statsStop = context.WithCancel(context.Background())
	in.statsDone = make(chan struct{})
	go reportGroupStats(sctx, rdb, in.conf, in.gauges, in.log, in.statsDone)
	return nil
}

func (in *queueInput) ReadBatch(ctx context.Context) (service.MessageBatch, service.AckFunc, error) {
	in.mu.Lock()
	c := in.consumer
	in.mu.Unlock()
	if c == nil {
		return nil, nil, service.ErrNotConnected
	}
	d, err := c.Read(ctx)
	if err != nil {
		if queue.IsClosed(err) || errors.Is(err, queue.ErrNotReady) {
			return nil, nil, service.ErrNotConnected
		}
		return nil, nil, in.conn.Explain(err)
	}
	batch := make(service.MessageBatch, len(d.Entries))
	for i := range d.Entries {
		batch[i] = in.message(d.Shard, &d.Entries[i])
	}
	idx := batch.Index()
	return batch, func(ctx context.Context, err error) error {
		if err == nil {
			return in.conn.Explain(c.Ack(ctx, d))
		}
		return in.conn.Explain(c.Nack(ctx, d, failures(err, idx, len(d.Entries))))
	}, nil
}

// aclLogger is the consumer's logger, with an ACL refusal among the arguments given its redis_acl
// code and fix (a permission taken away while the input runs: its shard reads, lease renewals).
type aclLogger struct {
	*service.Logger
	conn redisconn.Config
}

func (l aclLogger) Warnf(format string, args ...any)  { l.Logger.Warnf(format, l.explain(args)...) }
func (l aclLogger) Errorf(format string, args ...any) { l.Logger.Errorf(format, l.explain(args)...) }

func (l aclLogger) explain(args []any) []any {
	for i, a := range args {
		if err, ok := a.(error); ok {
			args[i] = l.conn.Explain(err)
		}
	}
	return args
}

// standardMeta are the metadata keys the input sets itself; a header never overrides them.
var standardMeta = map[string]bool{"queue": true, "shard": true, "offset": true, "partition": true,
	"message_id": true, "transaction_id": true, "created_at": true, "attempts": true}

func (in *queueInput) message(shard int, e *queue.Entry) *service.Message {
	m := in.tmpl.Copy()
	m.SetBytes(e.Payload)
	for k, v := range headerMeta(e.Header) {
		if !standardMeta[k] {
			m.MetaSetMut(k, v)
		}
	}
	m.MetaSetMut("queue", in.conf.Queue)
	m.MetaSetMut("shard", int64(shard))
	m.MetaSetMut("offset", e.Offset)
	m.MetaSetMut("partition", e.Partition)
	m.MetaSetMut("message_id", e.MessageID)
	m.MetaSetMut("transaction_id", e.Tx)
	m.MetaSetMut("created_at", e.CreatedMs)
	m.MetaSetMut("attempts", e.Attempts)
	return m
}

// headerMeta decodes an entry's h header (a JSON object; anything else is ignored). Integers come
// back as int64, other numbers as float64, the rest as JSON decodes them.
func headerMeta(h []byte) map[string]any {
	if len(h) == 0 {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(h))
	dec.UseNumber()
	var out map[string]any
	if dec.Decode(&out) != nil {
		return nil
	}
	for k, v := range out {
		if n, ok := v.(json.Number); ok {
			if i, err := n.Int64(); err == nil {
				out[k] = i
			} else if f, err := n.Float64(); err == nil {
				out[k] = f
			}
		}
	}
	return out
}

// failures maps a nack's error to the messages it counts an attempt for: the failed ones of a
// *service.BatchError, else all; errors coded blocked or paused count none.
func failures(err error, idx *service.Indexer, n int) map[int]error {
	counts := func(e error) bool {
		return e != nil && !errcode.Is(e, errcode.Blocked) && !errcode.Is(e, errcode.Paused)
	}
	out := map[int]error{}
	var bErr *service.BatchError
	if errors.As(err, &bErr) {
		bErr.WalkMessagesIndexedBy(idx, func(i int, _ *service.Message, e error) bool {
			if i >= 0 && i < n && counts(e) {
				out[i] = e
			}
			return true
		})
		return out
	}
	if counts(err) {
		for i := 0; i < n; i++ {
			out[i] = err
		}
	}
	return out
}

func (in *queueInput) Close(ctx context.Context) error {
	in.mu.Lock()
	c, rdb := in.consumer, in.rdb
	in.consumer, in.rdb = nil, nil
	stop, done := in.statsStop, in.statsDone
	in.mu.Unlock()
	if c == nil {
		return nil
	}
	stop()
	<-done
	err := c.Close(ctx)
	if cerr := rdb.Close(); err == nil {
		err = cerr
	}
	return err
}
