package queue

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/lease"
	"github.com/pgrelay/pgrelay/resources"
)

// failScript is resources/queue_fail.lua: attempts and dead letters, fenced by the shard lease.
var failScript = redis.NewScript(resources.MustRead("queue_fail.lua"))

// Logger is the logging the consumer needs; *service.Logger satisfies it.
type Logger interface {
	Debugf(format string, args ...any)
	Infof(format string, args ...any)
	Warnf(format string, args ...any)
	Errorf(format string, args ...any)
}

type nopLogger struct{}

func (nopLogger) Debugf(string, ...any) {}
func (nopLogger) Infof(string, ...any)  {}
func (nopLogger) Warnf(string, ...any)  {}
func (nopLogger) Errorf(string, ...any) {}

// ConsumerConfig configures a Consumer.
type ConsumerConfig struct {
	Prefix    string // key prefix (DefaultPrefix when "")
	Queue     string // queue to consume
	Group     string // consumer group: one per pipeline
	StartFrom string // "earliest" (default) or "latest": where a new group starts
	// Start, when set, starts a new group after a load from PostgreSQL instead (see Start); the
	// group is created with it at Consumer.Start, which fails if the group exists with another.
	Start       *Start
	BatchCount  int           // most messages per delivery, but whole stream entries (default 500)
	BatchBytes  int           // most payload bytes per delivery, at least one stream entry (default 4 MiB)
	Block       time.Duration // how long one read waits for new entries (default 1 s)
	MaxAttempts int           // failed attempts before a message is dead-lettered (default 3)
	LeaseTTL    time.Duration // shard lease TTL, renewed every TTL/3 (default 10 s)
	Owner       string        // this replica's lease owner id (default host:pid:random)
	// NewReader builds the client of the blocking reads, with room for poolSize connections per
	// server (redisconn.Config.Client with PoolSize). Nil: a copy of a plain or Cluster client's
	// options with a larger pool; give it for a Sentinel client, whose copy would not follow a failover.
	NewReader func(poolSize int) (redis.UniversalClient, error)
	// Backoff is the first wait before a nacked shard is read again; it doubles per consecutive
	// nack of the shard up to MaxBackoff (defaults 100 ms and 5 s).
	Backoff, MaxBackoff time.Duration
	Logger              Logger
	// OnGone is called with the number of pending entries found trimmed away (acked and skipped).
	OnGone func(n int)
	// OnDeadLetter is called with the number of messages moved to the dead-letter stream.
	OnDeadLetter func(n int)
	// OnSkip is called with the number of messages not delivered because the group's start had
	// them in its load.
	OnSkip func(n int)
}

func (c *ConsumerConfig) defaults() error {
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if err := ValidQueueName(c.Queue); err != nil {
		return err
	}
	if c.Group == "" || strings.ContainsAny(c.Group, "{}:") {
		return errcode.New(errcode.BadGroup, fmt.Sprintf("consumer group %q is empty or contains {, } or :", c.Group),
			"name the group after the pipeline, e.g. orders_sink")
	}
	switch c.StartFrom {
	case "":
		c.StartFrom = "earliest"
	case "earliest", "latest":
	default:
		return errcode.New(errcode.BadStartFrom, fmt.Sprintf("start_from %q", c.StartFrom), "use earliest or latest")
	}
	setDefault(&c.BatchCount, 500)
	setDefault(&c.BatchBytes, 4<<20)
	setDefault(&c.MaxAttempts, 3)
	setDefaultDur(&c.Block, time.Second)
	setDefaultDur(&c.LeaseTTL, 10*time.Second)
	setDefaultDur(&c.Backoff, 100*time.Millisecond)
	setDefaultDur(&c.MaxBackoff, 5*time.Second)
	if c.Owner == "" {
		c.Owner = DefaultOwner()
	}
	if c.Logger == nil {
		c.Logger = nopLogger{}
	}
	if c.OnGone == nil {
		c.OnGone = func(int) {}
	}
	if c.OnDeadLetter == nil {
		c.OnDeadLetter = func(int) {}
	}
	if c.OnSkip == nil {
		c.OnSkip = func(int) {}
	}
	return nil
}

func setDefault(v *int, d int) {
	if *v <= 0 {
		*v = d
	}
}

func setDefaultDur(v *time.Duration, d time.Duration) {
	if *v <= 0 {
		*v = d
	}
}

// DefaultOwner is a lease owner id unique to this process life: host:pid:random.
func DefaultOwner() string {
	host, _ := os.Hostname()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%s:%d:%s", host, os.Getpid(), hex.EncodeToString(b))
}

// Entry is one message read from a shard. In layout version 3 a stream entry holds several
// messages: each is an Entry with the stream entry's ID, told apart by Index.
type Entry struct {
	ID        string // stream entry id
	Index     int    // the message's place in its stream entry (0 in layouts 1 and 2)
	Count     int    // the messages its stream entry holds (1 in layouts 1 and 2)
	Offset    int64  // off: per-shard offset
	Partition string
	MessageID string
	Tx        string
	CreatedMs int64
	Header    []byte // h ("" when absent)
	Payload   []byte // d
	Attempts  int64  // failed attempts counted before this delivery
	packed    bool   // read from a layout-3 entry
}

// Delivery is one batch of entries of one shard; exactly one per shard is unacknowledged at a time.
// Finish it with Consumer.Ack or Consumer.Nack.
type Delivery struct {
	Shard   int
	Entries []Entry
	run     *shardRun
	pending bool // read from the shard's pending entries (or cut short): read pending next
	retried bool // some entry has a value in the attempts hash: Ack clears them
}

type ackResult struct{ nacked bool }

// shardRun is one holding of one shard's lease: a goroutine reading the shard while it is held.
type shardRun struct {
	n      int
	lease  *lease.Lease
	cancel context.CancelFunc
	done   chan struct{}
	acks   chan ackResult // the in-flight delivery's outcome
	mu     sync.Mutex
	busy   bool // a delivery is in flight
	drain  bool // hand the shard over once the in-flight delivery is finished
	// renewed is when the lease was last taken or renewed; only the keeper goroutine uses it
	renewed time.Time
	// startPast: an entry at or past the group's start lsn was read, so no later one is in the
	// load; only the shard's reader uses it
	startPast bool
	// perEntry: the messages per stream entry of the shard's last read (at least 1), so a read of
	// layout-3 entries asks for about BatchCount messages; only the shard's reader uses it
	perEntry int
}

// handOverWhenIdle makes the reader stop and release the shard after its in-flight delivery.
func (r *shardRun) handOverWhenIdle() {
	r.mu.Lock()
	r.drain = true
	r.mu.Unlock()
}

func (r *shardRun) draining() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.drain
}

func (r *shardRun) setBusy(b bool) {
	r.mu.Lock()
	r.busy = b
	r.mu.Unlock()
}

func (r *shardRun) isBusy() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.busy
}

// Consumer reads a queue for one consumer group, spreading the shards over every replica of the
// group through leases (DESIGN §6). Read returns deliveries of one shard at a time; different
// shards may be in flight at once. It is safe for concurrent use.
type Consumer struct {
	rdb    redis.UniversalClient
	reader redis.UniversalClient // blocking reads: a pool with room for one read per shard
	conf   ConsumerConfig
	layout Layout

	out    chan *Delivery
	stop   chan struct{}
	wg     sync.WaitGroup
	closed sync.Once

	mu     sync.Mutex
	shards int    // 0 until the queue exists
	start  *Start // the group's start after a load, read from Redis at setup; nil: none
	runs   map[int]*shardRun
	err    error // a fatal setup error, returned by Read

	hmu          sync.Mutex
	tickErr      error         // the lease keeper's last round's error (nil: it succeeded, or waits for the queue)
	failingSince time.Time     // when its rounds began to fail (zero while they succeed)
	ticked       chan struct{} // closed and replaced after every round of the lease keeper
}

// NewConsumer validates conf and returns a consumer; Start begins the work.
func NewConsumer(rdb redis.UniversalClient, conf ConsumerConfig) (*Consumer, error) {
	if err := conf.defaults(); err != nil {
		return nil, err
	}
	return &Consumer{rdb: rdb, conf: conf, layout: NewLayout(conf.Prefix),
		out: make(chan *Delivery), stop: make(chan struct{}), runs: map[int]*shardRun{}, ticked: make(chan struct{})}, nil
}

// Start checks the connection and starts the lease keeper, which waits for the queue to exist,
// creates the group on every shard and acquires this replica's fair share of shards. With
// ConsumerConfig.Start the queue must exist and the group is created (or found with that start)
// before Start returns: a start_conflict, start_trimmed, bad_start or no_queue error says why not.
// A queue of a layout version this code does not read is refused (layout_version), at Start when it
// exists, else when it appears (logged as an error; nothing is read from it).
func (c *Consumer) Start(ctx context.Context) error {
	if err := c.rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis ping: %w", err)
	}
	if c.conf.Start != nil {
		if _, err := c.setup(ctx); err != nil {
			if errors.Is(err, errNoQueue) {
				return noQueue(c.layout, c.conf.Queue)
			}
			return err
		}
	} else if _, err := c.readMeta(ctx); err != nil && !errors.Is(err, errNoQueue) {
		return err // a queue of a layout this code does not read: refused before anything is read
	}
	c.wg.Add(1)
	go c.keepLeases()
	return nil
}

// Read blocks until a delivery is ready, ctx is done, the consumer is closed, or the replica is
// not ready (ErrNotReady).
func (c *Consumer) Read(ctx context.Context) (*Delivery, error) {
	for {
		ticked := c.lastTick()
		if err := c.notReady(); err != nil {
			select {
			case d := <-c.out: // a delivery a shard's reader holds goes first
				return d, nil
			default:
			}
			return nil, fmt.Errorf("%w: %w", ErrNotReady, err)
		}
		select {
		case d := <-c.out:
			return d, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-ticked:
		case <-c.stop:
			c.mu.Lock()
			err := c.err
			c.mu.Unlock()
			if err != nil {
				return nil, err
			}
			return nil, errClosed
		}
	}
}

// ErrNotReady is what Read returns, having delivered nothing, once the lease keeper's rounds have
// failed for a lease TTL (Redis does not answer, a permission is gone, a queue it cannot read):
// whatever shard leases the replica held have expired by then. The wrapped error says why. A
// shorter failure (a blip) leaves it ready.
var ErrNotReady = errors.New("queue consumer not ready")

// notReady returns the lease keeper's last error once its rounds have failed for a lease TTL, else
// nil.
func (c *Consumer) notReady() error {
	c.hmu.Lock()
	defer c.hmu.Unlock()
	if c.tickErr == nil || time.Since(c.failingSince) < c.conf.LeaseTTL {
		return nil
	}
	return c.tickErr
}

// lastTick returns a channel closed after the lease keeper's next round.
func (c *Consumer) lastTick() <-chan struct{} {
	c.hmu.Lock()
	defer c.hmu.Unlock()
	return c.ticked
}

// tickDone records the lease keeper's round's error (nil for a queue that does not exist yet) and
// wakes the readers waiting for it.
func (c *Consumer) tickDone(err error) {
	if errors.Is(err, errNoQueue) {
		err = nil
	}
	c.hmu.Lock()
	switch {
	case err == nil:
		c.failingSince = time.Time{}
	case c.tickErr == nil:
		c.failingSince = time.Now()
	}
	c.tickErr = err
	close(c.ticked)
	c.ticked = make(chan struct{})
	c.hmu.Unlock()
}

// WaitReady blocks until the replica is ready (see ErrNotReady: nil), ctx ends (its error), the
// consumer closes, or max passes (the reason it is not ready).
func (c *Consumer) WaitReady(ctx context.Context, max time.Duration) error {
	t := time.NewTimer(max)
	defer t.Stop()
	for {
		ticked := c.lastTick()
		err := c.notReady()
		if err == nil {
			return nil
		}
		select {
		case <-ticked:
		case <-t.C:
			return err
		case <-ctx.Done():
			return ctx.Err()
		case <-c.stop:
			return errClosed
		}
	}
}

var errClosed = errors.New("queue consumer closed")

// IsClosed reports whether err is Read's error after Close.
func IsClosed(err error) bool { return errors.Is(err, errClosed) }

// Close stops reading, releases every shard lease at once (another replica takes the shards
// without waiting for the TTL) and leaves the group's membership. Safe to call while Read runs.
func (c *Consumer) Close(ctx context.Context) error {
	c.closed.Do(func() { close(c.stop) })
	c.wg.Wait()
	c.mu.Lock()
	runs := c.runs
	c.runs = map[int]*shardRun{}
	c.mu.Unlock()
	for _, r := range runs {
		r.cancel() // all at once: each reader may be inside a blocking read of up to Block
	}
	for _, r := range runs {
		<-r.done
		if err := r.lease.Release(ctx); err != nil {
			c.conf.Logger.Warnf("queue %s: release shard %d: %v", c.conf.Queue, r.n, err)
		}
	}
	c.rdb.ZRem(ctx, c.membersKey(), c.conf.Owner)
	if c.reader != nil && c.reader != c.rdb {
		return c.reader.Close()
	}
	return nil
}

// membersKey is the sorted set of the group's live replicas (score: expiry, Unix ms), used to
// compute each replica's fair share of shards.
func (c *Consumer) membersKey() string {
	return c.layout.Members(c.conf.Queue, c.conf.Group)
}

// Held lists the shards this replica holds now.
func (c *Consumer) Held() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]int, 0, len(c.runs))
	for n := range c.runs {
		out = append(out, n)
	}
	return out
}
