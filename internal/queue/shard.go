package queue

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgrelay/pgrelay/internal/retry"
	"github.com/pgrelay/pgrelay/resources"
)

// readShard delivers the shard's entries while this replica holds it: pending entries (`0`)
// first, then new ones (`>`), one delivery in flight at a time; a nack returns to the pending
// entries after a backoff that doubles with every consecutive nack.
func (c *Consumer) readShard(ctx context.Context, r *shardRun) {
	defer close(r.done)
	pending := true
	backoff := c.conf.Backoff
	for ctx.Err() == nil {
		d, more, err := c.fetch(ctx, r, pending)
		if errors.Is(err, errFenced) {
			c.conf.Logger.Warnf("queue %s: lost the lease of shard %d; another replica reads it now", c.conf.Queue, r.n)
			c.dropRun(r)
			return
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			c.conf.Logger.Warnf("queue %s: read shard %d: %v", c.conf.Queue, r.n, err)
			pending = true // entries a failed read took may now be pending: read them first
			retry.Sleep(ctx, time.Second)
			continue
		}
		if d == nil {
			pending = pending && more
			continue
		}
		r.setBusy(true)
		select {
		case c.out <- d:
		case <-ctx.Done():
			r.setBusy(false)
			return
		}
		var res ackResult
		select {
		case res = <-r.acks:
		case <-ctx.Done():
			return
		}
		r.setBusy(false)
		if r.draining() {
			c.handOver(r)
			return
		}
		if res.nacked {
			pending = true
			retry.Sleep(ctx, backoff)
			backoff = min(2*backoff, c.conf.MaxBackoff)
			continue
		}
		backoff = c.conf.Backoff
		pending = d.pending
	}
}

// dropRun ends r from its own reader after a fenced read: the lease is forgotten without a release
// (it is someone else's now) and the keeper may take the shard again later.
func (c *Consumer) dropRun(r *shardRun) {
	r.lease.Drop()
	c.mu.Lock()
	if c.runs[r.n] == r {
		delete(c.runs, r.n)
	}
	c.mu.Unlock()
}

// readScript is resources/queue_read.lua: a read of a shard fenced by the shard lease.
var readScript = redis.NewScript(resources.MustRead("queue_read.lua"))

// errFenced means the shard's lease no longer holds this run's token: another replica owns the
// shard (or will once the TTL runs out), so this run reads nothing more.
var errFenced = errors.New("shard lease taken over")

// fetch reads one delivery from shard r.n: its pending entries when pending, else new ones. The read
// is fenced by the shard lease (resources/queue_read.lua); when nothing new is there it waits up to
// Block for the next entry with a plain XREAD. A nil delivery means nothing to deliver; more then
// says the pending entries are not exhausted (all read ones had been trimmed away).
func (c *Consumer) fetch(ctx context.Context, r *shardRun, pending bool) (*Delivery, bool, error) {
	stream := c.layout.Stream(c.conf.Queue, r.n)
	id := ">"
	if pending {
		id = "0"
	}
	token := r.lease.Token()
	if token == "" {
		return nil, false, errFenced
	}
	c.mu.Lock()
	reader := c.reader
	c.mu.Unlock()
	count := max(1, c.conf.BatchCount/max(1, r.perEntry))
	res, err := readScript.Run(ctx, reader, []string{r.lease.Key(), stream}, token, c.conf.Group, ConsumerName(r.n), count, id).Result()
	if redis.HasErrorPrefix(err, "NOGROUP") {
		c.conf.Logger.Warnf("queue %s: group %s missing on shard %d (stream deleted?); creating it", c.conf.Queue, c.conf.Group, r.n)
		return nil, pending, c.createGroup(ctx, r.n)
	}
	if err != nil {
		return nil, false, err
	}
	last, msgs, err := readReply(res)
	if err != nil {
		return nil, false, fmt.Errorf("read shard %d: %w", r.n, err)
	}
	if len(msgs) == 0 && !pending {
		err := reader.XRead(ctx, &redis.XReadArgs{Streams: []string{stream, last}, Count: 1, Block: c.conf.Block}).Err()
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, false, err
		}
		return nil, false, nil
	}
	d := &Delivery{Shard: r.n, run: r, pending: pending}
	var gone, skipped []string // entries trimmed away; entries whose every message the load has
	// Pending entries are judged again from their first message: a layout-3 entry in which the rule
	// ended holds messages in the load before the first past its lsn, and those are not acked alone.
	// (Judging is the same each time: a shard's events are in commit order.)
	start, past := c.groupStart(), r.startPast && !pending
	bytes, read, kept, skips := 0, 0, 0, 0
	for _, m := range msgs {
		if len(m.Values) == 0 {
			gone = append(gone, m.ID)
			continue
		}
		if len(d.Entries) > 0 && (bytes >= c.conf.BatchBytes || len(d.Entries) >= c.conf.BatchCount) {
			d.pending = true // the rest were delivered to this shard's consumer: read them as pending
			break
		}
		n0 := len(d.Entries)
		d.Entries = EntriesOf(d.Entries, m)
		read++
		kept += len(d.Entries) - n0
		if start != nil && !past {
			// the messages the load holds are not delivered; an entry none of whose messages
			// is delivered is acked
			k := n0
			for _, e := range d.Entries[n0:] {
				if !past {
					switch start.judge(e.Payload) {
					case startSkip:
						skips++
						continue
					case startPast:
						past = true
					}
				}
				d.Entries[k] = e
				k++
			}
			d.Entries = d.Entries[:k]
			if k == n0 {
				skipped = append(skipped, m.ID)
				continue
			}
		}
		for _, e := range d.Entries[n0:] {
			bytes += len(e.Payload)
		}
	}
	if read > 0 {
		r.perEntry = max(1, kept/read)
	}
	if len(gone) > 0 {
		if err := c.ackGone(ctx, r.n, gone); err != nil {
			return nil, false, err
		}
	}
	if len(skipped) > 0 {
		if err := c.ackSkipped(ctx, r.n, skipped); err != nil {
			return nil, false, err
		}
	}
	if skips > 0 {
		c.conf.Logger.Debugf("queue %s group %s: skipped %d messages of shard %d already in the load", c.conf.Queue, c.conf.Group, skips, r.n)
		c.conf.OnSkip(skips)
	}
	r.startPast = r.startPast || past
	if len(d.Entries) == 0 {
		return nil, pending && len(gone)+len(skipped) > 0, nil
	}
	if pending {
		if err := c.loadAttempts(ctx, d); err != nil {
			return nil, false, err
		}
		if len(d.Entries) == 0 { // every message read was dead-lettered (their entries now acked)
			return nil, true, nil
		}
	}
	return d, false, nil
}

// ackGone acks pending entries that were trimmed away before they were processed: logged, counted.
func (c *Consumer) ackGone(ctx context.Context, n int, ids []string) error {
	c.conf.Logger.Warnf("queue %s group %s: %d pending entries of shard %d were trimmed before being processed (first %s); acking them",
		c.conf.Queue, c.conf.Group, len(ids), n, ids[0])
	if err := c.ackUndelivered(ctx, n, ids); err != nil {
		return fmt.Errorf("ack trimmed entries: %w", err)
	}
	c.conf.OnGone(len(ids))
	return nil
}

// ackUndelivered acks entries of shard n that are never delivered, and drops their attempt counts.
func (c *Consumer) ackUndelivered(ctx context.Context, n int, ids []string) error {
	_, err := c.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.XAck(ctx, c.layout.Stream(c.conf.Queue, n), c.conf.Group, ids...)
		p.HDel(ctx, c.layout.Attempts(c.conf.Queue, c.conf.Group), attemptFields(n, ids)...)
		return nil
	})
	return err
}

// attemptFields are the fields of entries ids of shard n in the attempts hash: "<n>:<id>". The
// shard is part of the field because entry ids repeat across shards (one script writes several
// shards with one clock, each stream numbering its own sequence), and one shard's failures must
// not count for another shard's entry. The value is the entry's failed attempts; for a layout-3
// entry, per message: "<index>=<attempts>" comma-separated, "<index>=d" for a message already
// moved to the dead-letter stream (the entry stays pending until its other messages are done).
func attemptFields(n int, ids []string) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = strconv.Itoa(n) + ":" + id
	}
	return out
}

// loadAttempts fills Entry.Attempts of a redelivery, and leaves out the messages of layout-3
// entries that were moved to the dead-letter stream (an entry left with none is acked).
func (c *Consumer) loadAttempts(ctx context.Context, d *Delivery) error {
	ids := entryIDs(d.Entries)
	vals, err := c.rdb.HMGet(ctx, c.layout.Attempts(c.conf.Queue, c.conf.Group), attemptFields(d.Shard, ids)...).Result()
	if err != nil {
		return fmt.Errorf("read attempts: %w", err)
	}
	byID := make(map[string]string, len(ids))
	for i, v := range vals {
		if s, ok := v.(string); ok {
			byID[ids[i]] = s
		}
	}
	if len(byID) == 0 {
		return nil
	}
	d.retried = true
	k := 0
	for _, e := range d.Entries {
		if s, ok := byID[e.ID]; ok {
			n, dead := messageAttempts(s, e.Index)
			if dead {
				continue
			}
			e.Attempts = n
		}
		d.Entries[k] = e
		k++
	}
	d.Entries = d.Entries[:k]
	left := map[string]bool{}
	for _, e := range d.Entries {
		left[e.ID] = true
	}
	var done []string // entries whose every message is dead
	for _, id := range ids {
		if !left[id] {
			done = append(done, id)
		}
	}
	if len(done) > 0 {
		if err := c.ackUndelivered(ctx, d.Shard, done); err != nil {
			return fmt.Errorf("ack dead-lettered entries: %w", err)
		}
	}
	return nil
}

// messageAttempts reads the attempts of message index of an entry from its attempts value s
// (attemptFields), and whether the message was moved to the dead-letter stream.
func messageAttempts(s string, index int) (n int64, dead bool) {
	if !strings.Contains(s, "=") {
		n, _ = strconv.ParseInt(s, 10, 64)
		return n, false
	}
	want := strconv.Itoa(index) + "="
	for _, part := range strings.Split(s, ",") {
		if v, ok := strings.CutPrefix(part, want); ok {
			if v == "d" {
				return 0, true
			}
			n, _ = strconv.ParseInt(v, 10, 64)
			return n, false
		}
	}
	return 0, false
}

// entryIDs are the stream entries of es, each once (the messages of one entry are adjacent).
func entryIDs(es []Entry) []string {
	ids := make([]string, 0, len(es))
	for i, e := range es {
		if i == 0 || e.ID != es[i-1].ID {
			ids = append(ids, e.ID)
		}
	}
	return ids
}

// Ack acknowledges a delivery: XACK of its entries (and their attempt counts cleared). If the
// XACK cannot be sent, the entries stay pending and are delivered again (at least once).
func (c *Consumer) Ack(ctx context.Context, d *Delivery) error {
	ids := entryIDs(d.Entries)
	retried := d.retried
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		_, err = c.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			p.XAck(ctx, c.layout.Stream(c.conf.Queue, d.Shard), c.conf.Group, ids...)
			if retried {
				p.HDel(ctx, c.layout.Attempts(c.conf.Queue, c.conf.Group), attemptFields(d.Shard, ids)...)
			}
			return nil
		})
		if err == nil || ctx.Err() != nil {
			break
		}
		retry.Sleep(ctx, 100*time.Millisecond)
	}
	c.finish(d, err != nil)
	if err != nil {
		return fmt.Errorf("queue %s shard %d: XACK: %w (the entries will be delivered again)", c.conf.Queue, d.Shard, err)
	}
	return nil
}

// Nack returns the delivery's shard to its pending entries. failed maps an entry index to the
// error that counts a failed attempt for it; entries not in failed count none. An entry that
// reaches MaxAttempts moves to the dead-letter stream, atomically with its XACK.
func (c *Consumer) Nack(ctx context.Context, d *Delivery, failed map[int]error) error {
	defer c.finish(d, true)
	if len(failed) == 0 {
		return nil
	}
	token := d.run.lease.Token()
	if token == "" {
		return nil // the shard moved on: its new owner counts its own attempts
	}
	args := []any{token, c.conf.Group, c.conf.MaxAttempts, time.Now().UnixMilli(), d.Shard}
	idx := make([]int, 0, len(failed))
	for i := range d.Entries {
		if err, ok := failed[i]; ok {
			e := &d.Entries[i]
			if e.packed {
				// the dead letter holds this message alone, in layout 2's fields
				args = append(args, e.ID, errText(err), e.Index, e.Count, AppendEntryMeta(nil, e), e.Payload)
			} else {
				args = append(args, e.ID, errText(err), "", 1, "", "")
			}
			idx = append(idx, i)
		}
	}
	keys := []string{d.run.lease.Key(), c.layout.Attempts(c.conf.Queue, c.conf.Group),
		c.layout.Stream(c.conf.Queue, d.Shard), c.layout.DLQ(c.conf.Queue)}
	res, err := failScript.Run(ctx, c.rdb, keys, args...).Result()
	if err != nil {
		return fmt.Errorf("queue %s shard %d: count attempts: %w", c.conf.Queue, d.Shard, err)
	}
	counts, ok := res.([]any)
	if !ok {
		c.conf.Logger.Warnf("queue %s: shard %d was taken over before its attempts were counted", c.conf.Queue, d.Shard)
		return nil
	}
	dead := 0
	for k, v := range counts {
		n, _ := v.(int64)
		e := d.Entries[idx[k]]
		if n < 0 {
			dead++
			c.conf.Logger.Errorf("queue %s group %s: message %s (shard %d offset %d) failed %d times, moved to the dead-letter stream: %v",
				c.conf.Queue, c.conf.Group, e.MessageID, d.Shard, e.Offset, -n, failed[idx[k]])
		}
	}
	if dead > 0 {
		c.conf.OnDeadLetter(dead)
	}
	return nil
}

// errText bounds an error's text for the dead-letter stream.
func errText(err error) string {
	s := "failed"
	if err != nil {
		s = err.Error()
	}
	if len(s) > 4096 {
		s = s[:4096]
	}
	return s
}

// finish tells the shard's reader the delivery's outcome (once; later calls are ignored).
func (c *Consumer) finish(d *Delivery, nacked bool) {
	select {
	case d.run.acks <- ackResult{nacked: nacked}:
	default:
	}
}

// readReply decodes queue_read.lua's {last, entries} reply ('fenced' is errFenced).
func readReply(res any) (last string, msgs []redis.XMessage, err error) {
	if s, ok := res.(string); ok && s == "fenced" {
		return "", nil, errFenced
	}
	parts, ok := res.([]any)
	if !ok || len(parts) != 2 {
		return "", nil, fmt.Errorf("unexpected reply %v", res)
	}
	last, _ = parts[0].(string)
	entries, _ := parts[1].([]any)
	for _, raw := range entries {
		e, ok := raw.([]any)
		if !ok || len(e) != 2 {
			return "", nil, fmt.Errorf("unexpected entry %v", raw)
		}
		m := redis.XMessage{Values: map[string]any{}}
		m.ID, _ = e[0].(string)
		fields, _ := e[1].([]any) // nil: deleted while pending
		for i := 0; i+1 < len(fields); i += 2 {
			k, _ := fields[i].(string)
			m.Values[k] = fields[i+1]
		}
		msgs = append(msgs, m)
	}
	return last, msgs, nil
}
