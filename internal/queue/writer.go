package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/redisconn"
	"github.com/pgrelay/pgrelay/resources"
)

// writeScript is resources/queue_write.lua, sent once per connection (EVALSHA, EVAL on NOSCRIPT).
var writeScript = redis.NewScript(resources.MustRead("queue_write.lua"))

// Message is one queue entry to write.
type Message struct {
	Queue     string // queue name: the hash tag of every key of the queue
	Partition string // ordering unit; its shard is Shard(Partition, shards)
	ID        string // stable message id (DESIGN §3)
	Tx        string // id shared by the messages of one source transaction; "" for plain producers
	CreatedMs int64  // created-at, Unix milliseconds
	Header    []byte // optional JSON object (entry field h); empty is written as ""
	Payload   []byte // entry field d
}

// size is the message's share of MaxScriptBytes.
func (m *Message) size() int {
	return len(m.Payload) + len(m.Header) + len(m.Partition) + len(m.ID) + len(m.Tx) + 32
}

// Cover makes a batch fenced and pointer-moving (docs/batch-contract.md). The zero value (or a nil
// *Cover) is a plain producer: no fence, no pointer.
type Cover struct {
	LeaseKey   string // full key of the source's lease; "" = not fenced
	Fence      string // the token LeaseKey must hold
	PointerKey string // full key of the source's pointer; "" = no pointer
	Pointer    []byte // the new pointer JSON, SET when the batch is written
	Pos        string // the new pointer's `pos`; the stored one must be strictly below it
	// Prev, when set, is the pos of the batch written just before this one, perhaps still in
	// flight: the write never applies unless the stored pointer is at or past it (ErrBehind),
	// and with Chain it follows that batch's write on its connection (chain.go).
	Prev  string
	Chain *Chain // the source's chain of batches in flight; nil for a lone batch
}

// CoverReceipt lets a writer tell the producer of a covered batch that the batch's cover is the
// stored pointer (the script replied ok or duplicate, so the pointer is at or past it), so the
// producer need not read the pointer back after the ack. It is marked only for the exact
// position it was made for; an unmarked receipt means "unknown": read the pointer.
type CoverReceipt struct {
	pos  string
	done atomic.Bool
}

// NewCoverReceipt returns an unmarked receipt for the cover position pos.
func NewCoverReceipt(pos string) *CoverReceipt { return &CoverReceipt{pos: pos} }

// Mark records that the pointer reached pos; a receipt made for another position ignores it.
func (r *CoverReceipt) Mark(pos string) {
	if r != nil && pos != "" && pos == r.pos {
		r.done.Store(true)
	}
}

// Done reports whether Mark was called with the receipt's position.
func (r *CoverReceipt) Done() bool { return r != nil && r.done.Load() }

// String is the receipt's position (how it prints in logs).
func (r *CoverReceipt) String() string { return r.pos }

// MarshalJSON renders the receipt as its position.
func (r *CoverReceipt) MarshalJSON() ([]byte, error) { return json.Marshal(r.pos) }

// ErrBehind is the error of a write whose Cover.Prev is not in the stored pointer yet: the batch
// before it did not go in, so it was not written either. The source sends both again, in order.
var ErrBehind = errors.New("queue write: the batch before this one is not in the queue; nothing was written")

// Result is the outcome of a successful Write.
type Result int

const (
	// ResultOK means the batch (and the pointer, if covered) was written.
	ResultOK Result = iota
	// ResultDuplicate means the stored pointer is already at or past the cover: nothing was
	// written, and the batch counts as delivered.
	ResultDuplicate
)

// String names the result as the script replies it.
func (r Result) String() string {
	if r == ResultDuplicate {
		return "duplicate"
	}
	return "ok"
}

// Durability says what an acknowledged write must survive.
type Durability struct {
	// AOF requires every master to run appendonly yes with appendfsync always (checked by Connect).
	AOF bool
	// Replicas > 0 makes every write WAIT for that many replicas; a shortfall is an error.
	Replicas int
	// WaitTimeout bounds the WAIT (default 5 s).
	WaitTimeout time.Duration
}

// FailoverWarning is what to log at start when the connection fails over by itself (Redis Sentinel
// or Cluster, failover true) and durability is aof alone: an acknowledged write is on the master's
// disk, but a replica promoted in its place may not have received it. "" when there is nothing to say.
func (d Durability) FailoverWarning(failover bool) string {
	if !failover || !d.AOF || d.Replicas > 0 {
		return ""
	}
	return "durability: aof with Redis Sentinel or Cluster: an acknowledged write is on the master's disk, " +
		"but a replica promoted after the master fails may not have received it, and the write is then lost " +
		"(the queue silently misses it, or pg_cdc stops with slot_ahead). Use durability: {replicas: 1} so a write is " +
		"acknowledged only once a replica has it (docs/queue.md, Failover)"
}

// WriterConfig configures a Writer.
type WriterConfig struct {
	Prefix string // key prefix (DefaultPrefix when "")
	// Shards is the shard count of a queue this writer creates (DefaultShards when 0). An existing
	// queue's count wins, unless StrictShards: then a different existing count is a shards_mismatch error.
	Shards       int
	StrictShards bool
	// MaxScriptMessages and MaxScriptBytes bound one script call (defaults 1000 and 8 MiB). A batch
	// over them is written in several calls; only the last carries the pointer, so only such a
	// batch is not atomic (a crash between calls repeats the earlier pieces under the same ids).
	MaxScriptMessages int
	MaxScriptBytes    int
	// CreateVersion is the layout version of a queue this writer creates (LayoutVersion when 0);
	// an existing queue keeps its own.
	CreateVersion int
	Durability    Durability
	// RetryFor bounds how long Write retries transient failures (lost connection, LOADING, ...)
	// with backoff; 0 means 30 s, negative means no retry.
	RetryFor time.Duration
	// UnreachableFor, when set, is how long Write retries while no connection to Redis can be
	// opened at all (redisconn.Unreachable), shorter than RetryFor: a caller that waits for Redis
	// on its own (the redis_queue output reports not connected) hears of it sooner.
	UnreachableFor time.Duration
}

func (c *WriterConfig) defaults() {
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if c.Shards <= 0 {
		c.Shards = DefaultShards
	}
	if c.MaxScriptMessages <= 0 {
		c.MaxScriptMessages = 1000
	}
	if c.CreateVersion <= 0 {
		c.CreateVersion = LayoutVersion
	}
	if c.MaxScriptBytes <= 0 {
		c.MaxScriptBytes = 8 << 20
	}
	if c.Durability.WaitTimeout <= 0 {
		c.Durability.WaitTimeout = 5 * time.Second
	}
	if c.RetryFor == 0 {
		c.RetryFor = 30 * time.Second
	}
}

// Writer writes batches to queues, each in one atomic step with every check (fence, cover, shard
// count) made before it writes: an optimistic transaction (write_tx.go), or a call of
// resources/queue_write.lua when transactions keep conflicting. It is safe for concurrent use.
type Writer struct {
	rdb    redis.UniversalClient
	raw    *redisconn.Raw // connections for the transactions
	conf   WriterConfig
	layout Layout
	keys   keyCache // the queues' keys, made once

	mu     sync.Mutex
	shards map[string]int // shard count per queue, read from meta (or conf.Shards for a new queue)

	// for tests and benchmarks in this package: write every piece with the script; run a
	// function between a transaction's reads and its MULTI
	scriptOnly bool
	beforeExec func()
	conflicts  atomic.Int64 // aborted EXECs

	primeWait atomic.Int64 // writes left before priming again (write_tx.go)
	bufs      sync.Pool    // *[]byte: the commands a chained write queues behind another (chain.go)
}

// NewWriter returns a Writer over rdb; nothing is sent until Connect or Write.
func NewWriter(rdb redis.UniversalClient, conf WriterConfig) *Writer {
	conf.defaults()
	l := NewLayout(conf.Prefix)
	return &Writer{rdb: rdb, raw: redisconn.NewRaw(rdb), conf: conf, layout: l, keys: keyCache{layout: l}, shards: map[string]int{}}
}

// Close closes the writer's own connections (not rdb's); later writes use the script alone.
func (w *Writer) Close() error { return w.raw.Close() }

// Layout is the writer's key layout.
func (w *Writer) Layout() Layout { return w.layout }

// Connect checks the server: it answers, never evicts keys, and meets the configured durability.
func (w *Writer) Connect(ctx context.Context) error {
	if err := w.rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis ping: %w", err)
	}
	if err := CheckEviction(ctx, w.rdb); err != nil {
		return err
	}
	if w.conf.Durability.AOF {
		return CheckAOF(ctx, w.rdb)
	}
	return nil
}

// CheckAOF returns a coded error unless every master runs appendonly yes with appendfsync always.
func CheckAOF(ctx context.Context, rdb redis.UniversalClient) error {
	check := func(ctx context.Context, c *redis.Client) error {
		vals, err := c.ConfigGet(ctx, "append*").Result()
		if err != nil {
			return fmt.Errorf("redis %s: CONFIG GET appendfsync: %w", c.Options().Addr, err)
		}
		if vals["appendonly"] != "yes" || vals["appendfsync"] != "always" {
			return errcode.New(errcode.DurabilityAOF,
				fmt.Sprintf("durability: aof needs appendonly yes and appendfsync always, but redis %s has appendonly %s, appendfsync %s",
					c.Options().Addr, vals["appendonly"], vals["appendfsync"]),
				"run CONFIG SET appendonly yes and CONFIG SET appendfsync always (and put them in redis.conf), or choose another durability")
		}
		return nil
	}
	return eachMaster(ctx, rdb, check)
}

// TruncatedLoadWarning is what to log at start with durability aof when a master loads a cut
// append-only file by truncating it (aof-load-truncated yes, Redis' default): Redis 7.0 cuts such
// a file inside the MULTI block of the write it lost and appends the next writes behind it, and the
// load after that runs them together (docs/operations.md, "A crash during an AOF write"). "" when
// every master refuses to start on a cut file instead, or when the setting cannot be read.
func TruncatedLoadWarning(ctx context.Context, rdb redis.UniversalClient) string {
	var mu sync.Mutex // a cluster's masters are asked at once
	var addrs []string
	_ = eachMaster(ctx, rdb, func(ctx context.Context, c *redis.Client) error {
		vals, err := c.ConfigGet(ctx, "aof-load-truncated").Result()
		if err == nil && vals["aof-load-truncated"] == "yes" {
			mu.Lock()
			addrs = append(addrs, c.Options().Addr)
			mu.Unlock()
		}
		return nil
	})
	slices.Sort(addrs)
	if len(addrs) == 0 {
		return ""
	}
	return "durability: aof with aof-load-truncated yes on redis " + strings.Join(addrs, ", ") + ": after a crash during an " +
		"AOF write Redis 7.0 keeps part of the cut transaction in the file and may apply it at the restart after next " +
		"(a batch's entries twice, or acknowledged writes dropped). After a restart whose log says \"Truncating the AOF\", " +
		"run BGREWRITEAOF before Redis can crash again; or set aof-load-truncated no and repair a cut file with " +
		"redis-check-aof --fix (docs/operations.md, A crash during an AOF write)"
}

// Write writes msgs, fenced and moving the pointer when cover says so. With no messages and a
// cover it only compares-and-sets the pointer. A fenced write is an error with code "fenced";
// ResultDuplicate (the cover is already in) is a success with nothing written.
func (w *Writer) Write(ctx context.Context, msgs []Message, cover *Cover) (Result, error) {
	if cover == nil {
		cover = &Cover{}
	}
	if err := validate(msgs, cover); err != nil {
		return ResultOK, err
	}
	if len(msgs) == 0 && cover.PointerKey == "" {
		return ResultOK, nil
	}
	if cover.Chain != nil {
		defer cover.Chain.ended(cover.Pos)
	}
	pieces := w.split(msgs)
	if cover.Chain != nil && cover.Prev != "" {
		if len(pieces) == 1 && !w.scriptOnly && len(msgs) > 0 {
			reply, done, err := w.follow(ctx, msgs, cover)
			if done {
				if err != nil {
					return ResultOK, err
				}
				return w.reply(reply, cover)
			}
			if err != nil {
				return ResultOK, err
			}
		} else if err := cover.Chain.waitEnded(ctx, cover.Prev); err != nil {
			// a batch that cannot follow on the connection still goes only once the write before
			// it ended: written meanwhile it would read the pointer below Prev (ErrBehind)
			return ResultOK, err
		}
	}
	for i, piece := range pieces {
		last := i == len(pieces)-1
		res, err := w.writePiece(ctx, piece, cover, last)
		if err != nil {
			if len(pieces) > 1 {
				return ResultOK, fmt.Errorf("piece %d of %d: %w", i+1, len(pieces), err)
			}
			return ResultOK, err
		}
		if res == ResultDuplicate {
			return ResultDuplicate, nil
		}
	}
	return ResultOK, nil
}

func validate(msgs []Message, c *Cover) error {
	for i := range msgs {
		if i > 0 && msgs[i].Queue == msgs[i-1].Queue {
			continue // checked already: a batch's messages usually share their queue
		}
		if err := ValidQueueName(msgs[i].Queue); err != nil {
			return fmt.Errorf("message %d (id %q): %w", i, msgs[i].ID, err)
		}
	}
	if (c.LeaseKey == "") != (c.Fence == "") {
		return errors.New("cover: lease key and fence go together")
	}
	if c.PointerKey != "" && (c.Pos == "" || len(c.Pointer) == 0) {
		return errors.New("cover: a pointer key needs the new pointer and its pos")
	}
	return nil
}

// ValidQueueName returns a coded error unless q can be a queue name (the hash tag of its keys).
func ValidQueueName(q string) error {
	if q == "" || strings.ContainsAny(q, "{}") || len(q) > MaxQueueNameBytes {
		return errcode.New(errcode.BadQueue, fmt.Sprintf("queue name %q is empty, too long or contains { or }", q),
			fmt.Sprintf("name queues with 1 to %d characters other than { and }", MaxQueueNameBytes))
	}
	return nil
}

// split cuts msgs into pieces within the script limits (at least one piece, maybe empty).
func (w *Writer) split(msgs []Message) [][]Message {
	var out [][]Message
	start, bytes := 0, 0
	for i := range msgs {
		sz := msgs[i].size()
		if i > start && (i-start >= w.conf.MaxScriptMessages || bytes+sz > w.conf.MaxScriptBytes) {
			out = append(out, msgs[start:i])
			start, bytes = i, 0
		}
		bytes += sz
	}
	return append(out, msgs[start:])
}

// writePiece writes one piece as an optimistic transaction (write_tx.go), or with the script
// after maxTxConflicts aborted EXECs or where no transaction can run; it retries transient
// failures and a stale shard count.
func (w *Writer) writePiece(ctx context.Context, msgs []Message, c *Cover, last bool) (Result, error) {
	start := time.Now()
	deadline := start.Add(w.conf.RetryFor)
	wait := 50 * time.Millisecond
	refreshed := false
	conflicts := 0
	var aborted *ownView // what a primed attempt that aborted had read
	for {
		var reply string
		var err error
		if conflicts < maxTxConflicts && !w.scriptOnly {
			reply, err = w.writeTx(ctx, msgs, c, last, &aborted)
			switch {
			case errors.Is(err, errTxConflict):
				conflicts++
				w.conflicts.Add(1)
				continue
			case errors.Is(err, errTxUnavailable):
				conflicts = maxTxConflicts
				continue
			}
		} else {
			reply, err = w.writeScript(ctx, msgs, c, last)
		}
		if err == nil {
			return w.reply(reply, c)
		}
		var changed *errShardsChanged
		if (errors.As(err, &changed) || redis.HasErrorPrefix(err, luaShardsMismatch)) && !refreshed {
			refreshed = true
			w.forgetShards(msgs)
			continue
		}
		err = classify(err)
		if !isTransient(err) || w.gaveUp(start, err) || !w.sleepRetry(ctx, deadline, &wait) {
			return ResultOK, err
		}
	}
}

// writeScript writes one piece with one call of the write script.
func (w *Writer) writeScript(ctx context.Context, msgs []Message, c *Cover, last bool) (string, error) {
	keys, args, err := w.build(ctx, msgs, c, last)
	if err != nil {
		return "", err
	}
	return w.run(ctx, keys, args)
}

// gaveUp reports whether the write that began at start has found Redis unreachable for
// UnreachableFor (when set).
func (w *Writer) gaveUp(start time.Time, err error) bool {
	return w.conf.UnreachableFor > 0 && redisconn.Unreachable(err) && time.Since(start) >= w.conf.UnreachableFor
}

func (w *Writer) sleepRetry(ctx context.Context, deadline time.Time, wait *time.Duration) bool {
	if w.conf.RetryFor < 0 || time.Now().Add(*wait).After(deadline) {
		return false
	}
	select {
	case <-ctx.Done():
		return false
	case <-time.After(*wait):
	}
	*wait = min(*wait*2, 2*time.Second)
	return true
}

func (w *Writer) reply(reply string, c *Cover) (Result, error) {
	switch reply {
	case "ok":
		return ResultOK, nil
	case "duplicate":
		return ResultDuplicate, nil
	case "behind":
		return ResultOK, fmt.Errorf("%w (the stored pointer is below %s)", ErrBehind, c.Prev)
	case "fenced":
		return ResultOK, errcode.New(errcode.Fenced,
			fmt.Sprintf("lease %s no longer holds this writer's fence; nothing was written", c.LeaseKey),
			"none needed: another replica owns the source now; this one re-acquires the lease and restarts from the pointer")
	default:
		return ResultOK, fmt.Errorf("queue write script: unexpected reply %q", reply)
	}
}

// build lays out KEYS and ARGV for queue_write.lua.
//
// A message's arguments are pointers to its fields (*string, *bytesArg), which go-redis writes
// like the values themselves: boxing the strings and slices as interface values would allocate
// five times per message.
func (w *Writer) build(ctx context.Context, msgs []Message, c *Cover, last bool) ([]string, []any, error) {
	p, err := w.plan(ctx, msgs)
	if err != nil {
		return nil, nil, err
	}
	keys := make([]string, 0, 2+len(p.queues)+len(p.streams))
	pointer := ""
	if c.LeaseKey != "" {
		keys = append(keys, c.LeaseKey)
	}
	if c.PointerKey != "" {
		keys = append(keys, c.PointerKey)
		if last {
			pointer = string(c.Pointer)
		}
	}
	touch := "0"
	if w.conf.Durability.Replicas > 0 {
		touch = "1"
	}
	// the script takes a pos for a pointer key (KEYS): without one, the cover's pos and prev are
	// not checked, as in the transaction
	pos, prev := c.Pos, c.Prev
	if c.PointerKey == "" {
		pos, prev = "", ""
	}
	args := make([]any, 0, 8+2*len(p.queues)+2*len(p.streams)+8*len(msgs))
	args = append(args, c.Fence, pos, pointer, len(p.queues), len(p.streams), len(msgs), touch)
	if prev != "" {
		args = append(args, prev)
	}
	for i, k := range p.keys {
		keys = append(keys, k.meta)
		args = append(args, p.counts[i], w.conf.CreateVersion)
	}
	for _, s := range p.streams {
		keys = append(keys, p.keys[s.queue].streams[s.shard])
		args = append(args, s.queue+1, s.shard)
	}
	// created-at is usually the same for the whole batch: formatted once per value
	ts := make([]string, 0, 1)
	// each message's m object of a layout-2 queue after its offset, all in one buffer
	var buf []byte
	ends := make([]int, len(msgs))
	for i := range msgs {
		buf = appendMetaTail(buf, &msgs[i])
		ends[i] = len(buf)
	}
	tails := make([]bytesArg, len(msgs))
	from := 0
	for i := range msgs {
		m := &msgs[i]
		if i == 0 || m.CreatedMs != msgs[i-1].CreatedMs {
			ts = append(ts, strconv.FormatInt(m.CreatedMs, 10))
		}
		tails[i], from = buf[from:ends[i]], ends[i]
		args = append(args, p.msgStream[i]+1, &m.Partition, &m.ID, &m.Tx, &ts[len(ts)-1], (*bytesArg)(&m.Header), (*bytesArg)(&m.Payload), &tails[i])
	}
	return keys, args, nil
}

// bytesArg is a byte slice argument that go-redis writes as is (through MarshalBinary); a pointer
// to it is an interface value with no allocation.
type bytesArg []byte

// MarshalBinary returns the bytes.
func (b *bytesArg) MarshalBinary() ([]byte, error) { return *b, nil }

// shardCount returns the shard count of queue q: the stored one, or conf.Shards for a new queue.
func (w *Writer) shardCount(ctx context.Context, q string) (int, error) {
	w.mu.Lock()
	n, ok := w.shards[q]
	w.mu.Unlock()
	if ok {
		return n, nil
	}
	s, err := w.rdb.HGet(ctx, w.layout.Meta(q), "shards").Result()
	switch {
	case errors.Is(err, redis.Nil):
		n = w.conf.Shards
	case err != nil:
		return 0, fmt.Errorf("queue %q: read shard count: %w", q, err)
	default:
		if n, err = parseShards(q, s); err != nil {
			return 0, err
		}
		if w.conf.StrictShards && n != w.conf.Shards {
			return 0, shardsMismatch(q, n, w.conf.Shards)
		}
	}
	w.mu.Lock()
	w.shards[q] = n
	w.mu.Unlock()
	return n, nil
}

func shardsMismatch(q string, stored, configured int) error {
	return errcode.New(errcode.ShardsMismatch,
		fmt.Sprintf("queue %q exists with %d shards but shards: %d is configured", q, stored, configured),
		fmt.Sprintf("set shards: %d (or remove the shards field); a queue is never resharded in place", stored))
}

func (w *Writer) forgetShards(msgs []Message) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := range msgs {
		delete(w.shards, msgs[i].Queue)
	}
}

// run executes the script; with Durability.Replicas it pipelines EVALSHA and WAIT on one
// connection of the queue's master (WAIT counts the replicas that have this connection's writes),
// following Redis Cluster redirections (redisconn.MasterPipeline).
func (w *Writer) run(ctx context.Context, keys []string, args []any) (string, error) {
	if w.conf.Durability.Replicas <= 0 {
		return writeScript.Run(ctx, w.rdb, keys, args...).Text()
	}
	for eval := false; ; eval = true {
		var ev, wt *redis.Cmd
		_, err := redisconn.MasterPipeline(ctx, w.rdb, keys[0], func(p redis.Pipeliner) {
			if eval { // the server does not have the script yet (NOSCRIPT): send it whole
				ev = writeScript.Eval(ctx, p, keys, args...)
			} else {
				ev = writeScript.EvalSha(ctx, p, keys, args...)
			}
			wt = p.Do(ctx, "wait", w.conf.Durability.Replicas, w.conf.Durability.WaitTimeout.Milliseconds())
		})
		if ev == nil {
			return "", err
		}
		if !eval && redis.HasErrorPrefix(ev.Err(), "NOSCRIPT") {
			continue
		}
		reply, err := ev.Text()
		if err != nil {
			return "", err
		}
		if reply == "fenced" {
			return reply, nil
		}
		got, err := wt.Int64()
		if err != nil {
			return "", fmt.Errorf("WAIT %d replicas: %w", w.conf.Durability.Replicas, err)
		}
		return reply, w.shortfall(got)
	}
}

// shortfall is the error of a WAIT that counted got replicas, nil when they are enough.
func (w *Writer) shortfall(got int64) error {
	if got >= int64(w.conf.Durability.Replicas) {
		return nil
	}
	return errcode.New(errcode.ReplicasShortfall,
		fmt.Sprintf("the write reached %d of %d replicas within %s", got, w.conf.Durability.Replicas, w.conf.Durability.WaitTimeout),
		"check the replicas' health and link, lower durability.replicas, or raise durability.timeout")
}

// Error replies of the queue scripts (resources/*.lua): redis.error_reply makes the first word the
// reply's error prefix.
const (
	luaShardsMismatch = "pgrelay_shards_mismatch"
	luaLayoutVersion  = "pgrelay_layout_version"
	luaPointerCorrupt = "pgrelay_pointer_corrupt"
)

// classify turns script and cluster errors into coded errors. A batch whose keys span Redis Cluster
// slots fails with the server's CROSSSLOT error, which go-redis also returns (redis.ErrCrossSlot)
// when it refuses such a batch itself.
func classify(err error) error {
	var changed *errShardsChanged
	switch {
	case redis.HasErrorPrefix(err, "CROSSSLOT"):
		return errcode.Wrap(errcode.CrossSlot, err,
			"one batch names queues (or a source pointer) in different Redis Cluster slots",
			"on Redis Cluster give each source one queue (every queue of a source must hash to its first queue's slot), or use a single Redis server")
	case errors.As(err, &changed) || redis.HasErrorPrefix(err, luaShardsMismatch):
		return errcode.Wrap(errcode.ShardsMismatch, err, "the queue's stored shard count changed while writing",
			"a queue is never resharded in place: drain it and delete its keys, then recreate it")
	case redis.HasErrorPrefix(err, luaLayoutVersion):
		return errcode.Wrap(errcode.LayoutVersion, err, "the queue was created by an incompatible pgrelay version",
			"use a pgrelay version that reads this layout, or a new queue name")
	case redis.HasErrorPrefix(err, luaPointerCorrupt):
		return errcode.Wrap(errcode.PointerCorrupt, err, "the stored source pointer is not JSON with a pos field",
			"run pgrelay resync for the source, or delete the pointer key if the source is being reset")
	}
	return err
}

// isTransient reports whether a failed write may succeed when retried: connection trouble, a
// server that is loading, failing over or busy, or a Cluster redirection left after following some. Coded (user-caused) errors never are.
func isTransient(err error) bool {
	if err == nil || errcode.Lasting(err) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var rErr redis.Error
	if errors.As(err, &rErr) {
		for _, p := range []string{"LOADING", "BUSY", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "READONLY", "NOREPLICAS", "MOVED", "ASK"} {
			if redis.HasErrorPrefix(err, p) {
				return true
			}
		}
		return false
	}
	return true
}
