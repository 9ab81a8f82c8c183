package queue

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/lease"
	"github.com/pgrelay/pgrelay/internal/redisconn"
)

// errNoQueue means the queue's meta does not exist yet (no producer has written to it).
var errNoQueue = errors.New("queue does not exist yet")

// keepLeases runs until Close: every LeaseTTL/3 it renews held shards, drops lost ones, gives
// back shards above this replica's fair share and takes free shards up to it.
func (c *Consumer) keepLeases() {
	defer c.wg.Done()
	every := c.conf.LeaseTTL / 3
	waiting := false
	for {
		ctx, cancel := context.WithTimeout(context.Background(), every)
		err := c.tick(ctx)
		cancel()
		c.tickDone(err)
		switch {
		case errors.Is(err, errNoQueue):
			if !waiting {
				c.conf.Logger.Infof("queue %s: waiting for a producer to create the queue", c.conf.Queue)
			}
			waiting = true
		case errcode.Is(err, errcode.LayoutVersion):
			c.conf.Logger.Errorf("queue %s group %s: %v", c.conf.Queue, c.conf.Group, err)
		case err != nil:
			c.conf.Logger.Warnf("queue %s group %s: leases: %v", c.conf.Queue, c.conf.Group, err)
		}
		select {
		case <-c.stop:
			return
		case <-time.After(every):
		}
	}
}

func (c *Consumer) tick(ctx context.Context) error {
	c.mu.Lock()
	shards := c.shards
	c.mu.Unlock()
	if shards == 0 {
		var err error
		if shards, err = c.setup(ctx); err != nil {
			return err
		}
	}
	fair, err := c.fairShare(ctx, shards)
	if err != nil {
		return err
	}
	c.renew(ctx)
	c.giveBack(ctx, fair)
	return c.take(ctx, shards, fair)
}

// setup reads the shard count, creates the group on every shard and the reader client.
func (c *Consumer) setup(ctx context.Context) (int, error) {
	shards, err := c.readMeta(ctx)
	if err != nil {
		return 0, err
	}
	start, err := c.openGroup(ctx, shards)
	if err != nil {
		return 0, err
	}
	reader, err := c.readerClient(shards)
	if err != nil {
		return 0, fmt.Errorf("reader client: %w", err)
	}
	c.mu.Lock()
	c.shards, c.start = shards, start
	c.reader = reader
	c.mu.Unlock()
	c.conf.Logger.Infof("queue %s: %d shards, group %s, replica %s", c.conf.Queue, shards, c.conf.Group, c.conf.Owner)
	if start != nil {
		c.conf.Logger.Infof("queue %s: group %s follows a load: entries of transactions its snapshot %s saw (commit lsn below %s) are acked, not delivered",
			c.conf.Queue, c.conf.Group, start.SnapshotText(), start.LSN)
	}
	return shards, nil
}

// readMeta reads the queue's shard count and checks its layout version: errNoQueue while the
// meta does not exist, a layout_version error for a version this code does not read (a queue a
// later pgrelay created: its entries would be delivered with their fields missing).
func (c *Consumer) readMeta(ctx context.Context) (int, error) {
	vals, err := c.rdb.HMGet(ctx, c.layout.Meta(c.conf.Queue), "shards", "version").Result()
	if err != nil {
		return 0, fmt.Errorf("queue %s: read meta: %w", c.conf.Queue, err)
	}
	s, ok := vals[0].(string)
	if !ok {
		return 0, errNoQueue
	}
	shards, err := parseShards(c.conf.Queue, s)
	v, _ := vals[1].(string)
	if err == nil {
		err = readable(c.conf.Queue, v)
	}
	if err != nil {
		return 0, err
	}
	return shards, nil
}

// createGroup creates the group on shard n, if it is not there: at the group's start position, or
// where start_from says.
func (c *Consumer) createGroup(ctx context.Context, n int) error {
	start := "0"
	if c.conf.StartFrom == "latest" {
		start = "$"
	}
	if s := c.groupStart(); s != nil {
		start = s.position(n)
	}
	err := c.rdb.XGroupCreateMkStream(ctx, c.layout.Stream(c.conf.Queue, n), c.conf.Group, start).Err()
	if err != nil && !redis.HasErrorPrefix(err, "BUSYGROUP") {
		return fmt.Errorf("create group %s on shard %d: %w", c.conf.Group, n, err)
	}
	return nil
}

// readerClient returns a client whose pool has room for a blocking read on every shard: from
// ConsumerConfig.NewReader, or else a copy of a plain or Cluster client with a larger pool.
func (c *Consumer) readerClient(shards int) (redis.UniversalClient, error) {
	need := shards + 8
	if c.conf.NewReader != nil {
		return c.conf.NewReader(need)
	}
	switch cl := c.rdb.(type) {
	case *redis.Client:
		o := *cl.Options()
		if o.PoolSize >= need {
			return c.rdb, nil
		}
		o.PoolSize = need
		return redis.NewClient(&o), nil
	case *redis.ClusterClient:
		o := *cl.Options()
		if o.PoolSize >= need {
			return c.rdb, nil
		}
		o.PoolSize = need
		return redisconn.NewClusterClient(&o), nil
	}
	return c.rdb, nil
}

// fairShare refreshes this replica's membership and returns ceil(shards / live replicas).
func (c *Consumer) fairShare(ctx context.Context, shards int) (int, error) {
	now := time.Now().UnixMilli()
	key := c.membersKey()
	var card *redis.IntCmd
	_, err := c.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.ZAdd(ctx, key, redis.Z{Score: float64(now + c.conf.LeaseTTL.Milliseconds()), Member: c.conf.Owner})
		p.ZRemRangeByScore(ctx, key, "-inf", strconv.FormatInt(now, 10))
		card = p.ZCard(ctx, key)
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("membership: %w", err)
	}
	replicas := max(int(card.Val()), 1)
	return (shards + replicas - 1) / replicas, nil
}

// renew extends every held lease and stops the shards whose lease was lost.
func (c *Consumer) renew(ctx context.Context) {
	for _, r := range c.snapshotRuns() {
		ok, err := r.lease.Renew(ctx)
		if err != nil {
			c.conf.Logger.Warnf("queue %s: renew shard %d: %v", c.conf.Queue, r.n, err)
			if time.Since(r.renewed) > c.conf.LeaseTTL {
				// the lease has surely expired: another replica may own the shard by now
				c.conf.Logger.Warnf("queue %s: shard %d not renewed for %s; stopping it", c.conf.Queue, r.n, c.conf.LeaseTTL)
				r.lease.Drop()
				c.stopRun(r)
			}
			continue
		}
		r.renewed = time.Now()
		if !ok {
			c.conf.Logger.Warnf("queue %s: lost the lease of shard %d; another replica reads it now", c.conf.Queue, r.n)
			c.stopRun(r)
		}
	}
}

// giveBack releases idle shards above the fair share so new replicas get theirs at once.
func (c *Consumer) giveBack(ctx context.Context, fair int) {
	runs := c.snapshotRuns()
	held := len(runs)
	for _, r := range runs {
		if held <= fair {
			return
		}
		held--
		if r.isBusy() {
			r.handOverWhenIdle() // its reader releases it after the delivery in flight
			continue
		}
		c.stopRun(r)
		if err := r.lease.Release(ctx); err != nil {
			c.conf.Logger.Warnf("queue %s: release shard %d: %v", c.conf.Queue, r.n, err)
		}
		c.conf.Logger.Debugf("queue %s: handed shard %d over (fair share %d)", c.conf.Queue, r.n, fair)
	}
}

// take acquires free shards until this replica holds its fair share. The scan starts at a
// point derived from the owner id so replicas starting together try different shards first.
func (c *Consumer) take(ctx context.Context, shards, fair int) error {
	first := int(crc32.ChecksumIEEE([]byte(c.conf.Owner)) % uint32(shards))
	for i := 0; i < shards && len(c.Held()) < fair; i++ {
		n := (first + i) % shards
		if c.holds(n) {
			continue
		}
		select {
		case <-c.stop:
			return nil
		default:
		}
		l := lease.New(c.rdb, c.layout.GroupLease(c.conf.Queue, c.conf.Group, n), c.conf.LeaseTTL, c.conf.Owner)
		ok, err := l.TryAcquire(ctx)
		if err != nil {
			return err
		}
		if ok {
			c.startRun(n, l)
		}
	}
	return nil
}

func (c *Consumer) holds(n int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.runs[n]
	return ok
}

func (c *Consumer) snapshotRuns() []*shardRun {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]*shardRun, 0, len(c.runs))
	for _, r := range c.runs {
		out = append(out, r)
	}
	return out
}

// startRun starts reading shard n, whose lease l this replica now holds.
func (c *Consumer) startRun(n int, l *lease.Lease) {
	ctx, cancel := context.WithCancel(context.Background())
	r := &shardRun{n: n, lease: l, cancel: cancel, done: make(chan struct{}), acks: make(chan ackResult, 1), renewed: time.Now()}
	c.mu.Lock()
	select {
	case <-c.stop:
		c.mu.Unlock()
		cancel()
		_ = l.Release(context.Background())
		return
	default:
	}
	c.runs[n] = r
	c.mu.Unlock()
	c.conf.Logger.Debugf("queue %s: took shard %d", c.conf.Queue, n)
	go c.readShard(ctx, r)
}

// handOver is called by a draining shard's reader once its delivery is finished: the shard leaves
// this replica and its lease is released for the replica that is short of its share.
func (c *Consumer) handOver(r *shardRun) {
	c.mu.Lock()
	if c.runs[r.n] == r {
		delete(c.runs, r.n)
	}
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := r.lease.Release(ctx); err != nil {
		c.conf.Logger.Warnf("queue %s: release shard %d: %v", c.conf.Queue, r.n, err)
	}
	c.conf.Logger.Debugf("queue %s: handed shard %d over", c.conf.Queue, r.n)
}

// stopRun stops reading a shard and waits for its goroutine.
func (c *Consumer) stopRun(r *shardRun) {
	c.mu.Lock()
	if c.runs[r.n] == r {
		delete(c.runs, r.n)
	}
	c.mu.Unlock()
	r.cancel()
	<-r.done
}
