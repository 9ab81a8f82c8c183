package queue

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/lease"
	"github.com/pgrelay/pgrelay/resources"
)

// Info describes a queue for `pgrelay queue info`.
type Info struct {
	Queue       string      `json:"queue"`
	Shards      int         `json:"shards"`
	Version     string      `json:"version"`
	Length      int64       `json:"length"` // messages kept, all shards
	ShardInfo   []ShardInfo `json:"shard_info"`
	Groups      []GroupInfo `json:"groups"`
	DeadLetters int64       `json:"dead_letters"`
}

// ShardInfo describes one shard stream.
type ShardInfo struct {
	Shard       int   `json:"shard"`
	Length      int64 `json:"length"`       // messages kept
	FirstOffset int64 `json:"first_offset"` // offset of the oldest message kept (0 when empty)
	LastOffset  int64 `json:"last_offset"`  // last offset assigned (meta off:<n>)
}

// GroupInfo describes one consumer group over all shards.
type GroupInfo struct {
	Name     string           `json:"name"`
	Lag      int64            `json:"lag"`     // messages not yet delivered
	Pending  int64            `json:"pending"` // messages delivered, not yet acked
	Replicas int64            `json:"replicas"`
	Shards   []GroupShardInfo `json:"shards"`
}

// GroupShardInfo is one group's state on one shard.
type GroupShardInfo struct {
	Shard         int    `json:"shard"`
	Lag           int64  `json:"lag"`
	Pending       int64  `json:"pending"`
	LastDelivered string `json:"last_delivered_id"`
	Owner         string `json:"owner,omitempty"` // lease holder, "" when free
}

// noQueue is the error for a queue without meta under l's prefix.
func noQueue(l Layout, q string) error {
	return errcode.New(errcode.NoQueue, fmt.Sprintf("queue %q does not exist under prefix %q", q, l.Prefix),
		"check the queue name and the prefix; a queue exists once a producer has written to it")
}

// Inspect reads queue q's shards, groups and dead letters. A queue of a layout version this code
// does not read is refused (layout_version): its offsets, and so its lags, would be wrong.
func Inspect(ctx context.Context, rdb redis.UniversalClient, l Layout, q string) (*Info, error) {
	meta, err := rdb.HGetAll(ctx, l.Meta(q)).Result()
	if err != nil {
		return nil, fmt.Errorf("queue %s: read meta: %w", q, err)
	}
	if meta["shards"] == "" {
		return nil, noQueue(l, q)
	}
	shards, err := parseShards(q, meta["shards"])
	if err == nil {
		err = readable(q, meta["version"])
	}
	if err != nil {
		return nil, err
	}
	info := &Info{Queue: q, Shards: shards, Version: meta["version"]}
	groups := map[string]*GroupInfo{}
	for n := 0; n < shards; n++ {
		si, gs, err := inspectShard(ctx, rdb, l, q, n, meta)
		if err != nil {
			return nil, err
		}
		info.ShardInfo = append(info.ShardInfo, si)
		info.Length += si.Length
		for name, g := range gs {
			gi := groups[name]
			if gi == nil {
				gi = &GroupInfo{Name: name}
				groups[name] = gi
			}
			gi.Lag += g.Lag
			gi.Pending += g.Pending
			gi.Shards = append(gi.Shards, g)
		}
	}
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		return nil, err
	}
	for _, g := range groups {
		g.Replicas, _ = rdb.ZCount(ctx, l.Members(q, g.Name), strconv.FormatInt(now.UnixMilli(), 10), "+inf").Result()
		info.Groups = append(info.Groups, *g)
	}
	sort.Slice(info.Groups, func(i, j int) bool { return info.Groups[i].Name < info.Groups[j].Name })
	if info.DeadLetters, err = rdb.XLen(ctx, l.DLQ(q)).Result(); err != nil {
		return nil, err
	}
	return info, nil
}

func inspectShard(ctx context.Context, rdb redis.UniversalClient, l Layout, q string, n int, meta map[string]string) (ShardInfo, map[string]GroupShardInfo, error) {
	stream := l.Stream(q, n)
	si := ShardInfo{Shard: n}
	si.LastOffset, _ = strconv.ParseInt(meta["off:"+strconv.Itoa(n)], 10, 64)
	var err error
	if si.Length, err = rdb.XLen(ctx, stream).Result(); err != nil {
		return si, nil, err
	}
	if first, err := rdb.XRangeN(ctx, stream, "-", "+", 1).Result(); err == nil && len(first) > 0 {
		si.FirstOffset = firstOffset(first[0])
	}
	// version 3: an entry holds several messages, and Redis counts entries
	packed := layoutOf(meta["version"]) == LayoutV3
	if packed && si.Length > 0 {
		si.Length = si.LastOffset - si.FirstOffset + 1
	}
	out := map[string]GroupShardInfo{}
	groups, err := rdb.XInfoGroups(ctx, stream).Result()
	if err != nil {
		if strings.Contains(err.Error(), "no such key") {
			return si, out, nil
		}
		return si, nil, err
	}
	var lowest map[string]string // layout 3: each group's lowest pending entry
	if packed {
		lowest = lowestPending(ctx, rdb, stream)
	}
	for _, g := range groups {
		gs := GroupShardInfo{Shard: n, Pending: g.Pending, LastDelivered: g.LastDeliveredID, Lag: g.Lag}
		if gs.Lag < 0 || packed {
			gs.Lag = lagByOffset(ctx, rdb, stream, g.LastDeliveredID, si)
		}
		if low := lowest[g.Name]; packed && gs.Pending > 0 && low != "" {
			gs.Pending = pendingByOffset(ctx, rdb, stream, low, g.LastDeliveredID, gs.Pending)
		}
		gs.Owner, _, _ = lease.Holder(ctx, rdb, l.GroupLease(q, g.Name, n))
		out[g.Name] = gs
	}
	return si, out, nil
}

// lagByOffset counts the messages after lastDelivered from the offsets, when Redis cannot say (or
// counts entries where a layout-3 entry holds several messages).
func lagByOffset(ctx context.Context, rdb redis.Cmdable, stream, lastDelivered string, si ShardInfo) int64 {
	xs, err := rdb.XRangeN(ctx, stream, lastDelivered, lastDelivered, 1).Result()
	if err == nil && len(xs) == 1 {
		return si.LastOffset - lastOffset(xs[0])
	}
	// the last delivered entry is gone: count what is kept after it
	after, err := rdb.XRange(ctx, stream, "("+lastDelivered, "+").Result()
	if err != nil {
		return -1
	}
	if len(after) == 0 {
		return 0
	}
	return si.LastOffset - firstOffset(after[0]) + 1
}

// lowestPending is each group's lowest pending entry on a shard (XINFO STREAM FULL lists a
// group's pending entries lowest first), none for a group with nothing pending.
func lowestPending(ctx context.Context, rdb redis.Cmdable, stream string) map[string]string {
	full, err := rdb.XInfoStreamFull(ctx, stream, 1).Result()
	if err != nil {
		return nil
	}
	out := map[string]string{}
	for _, g := range full.Groups {
		if len(g.Pending) > 0 {
			out[g.Name] = g.Pending[0].ID
		}
	}
	return out
}

// pendingByOffset counts the messages of a layout-3 group's pending entries on a shard from the
// offsets of the lowest of them and of the last delivered one (a redis_queue consumer has one
// delivery of consecutive entries in flight per shard); entries, Redis' count, when they are gone.
func pendingByOffset(ctx context.Context, rdb redis.Cmdable, stream, lowest, lastDelivered string, entries int64) int64 {
	lo, err1 := rdb.XRangeN(ctx, stream, lowest, lowest, 1).Result()
	hi, err2 := rdb.XRangeN(ctx, stream, lastDelivered, lastDelivered, 1).Result()
	if err1 != nil || err2 != nil || len(lo) != 1 || len(hi) != 1 {
		return entries
	}
	return lastOffset(hi[0]) - firstOffset(lo[0]) + 1
}

// firstOffset and lastOffset are the offsets of the first and the last message of an entry.
func firstOffset(x redis.XMessage) int64 { return EntriesOf(nil, x)[0].Offset }

func lastOffset(x redis.XMessage) int64 {
	es := EntriesOf(nil, x)
	return es[len(es)-1].Offset
}

// DeadLetter is one entry of a queue's dead-letter stream.
type DeadLetter struct {
	EntryID   string `json:"entry_id"`
	Group     string `json:"group"`
	Error     string `json:"error"`
	Attempts  int64  `json:"attempts"`
	FailedAt  int64  `json:"failed_at"`
	Offset    int64  `json:"offset"`
	Partition string `json:"partition"`
	MessageID string `json:"message_id"`
	Tx        string `json:"transaction_id"`
	CreatedMs int64  `json:"created_at"`
	Header    string `json:"header,omitempty"`
	Payload   string `json:"payload"`
}

// ListDeadLetters returns up to limit dead letters of queue q (oldest first; limit <= 0: all),
// optionally only those of group.
func ListDeadLetters(ctx context.Context, rdb redis.Cmdable, l Layout, q, group string, limit int64) ([]DeadLetter, error) {
	var out []DeadLetter
	start := "-"
	for {
		xs, err := rdb.XRangeN(ctx, l.DLQ(q), start, "+", 1000).Result()
		if err != nil {
			return nil, fmt.Errorf("queue %s: read dead letters: %w", q, err)
		}
		for _, x := range xs {
			d := deadLetterOf(x)
			if group == "" || d.Group == group {
				out = append(out, d)
				if limit > 0 && int64(len(out)) >= limit {
					return out, nil
				}
			}
		}
		if len(xs) < 1000 {
			return out, nil
		}
		start = "(" + xs[len(xs)-1].ID
	}
}

func deadLetterOf(x redis.XMessage) DeadLetter {
	s := func(k string) string { v, _ := x.Values[k].(string); return v }
	i := func(k string) int64 { n, _ := strconv.ParseInt(s(k), 10, 64); return n }
	e := EntriesOf(nil, x)[0] // a dead letter holds one message, in layout 1's or 2's fields
	return DeadLetter{EntryID: x.ID, Group: s("group"), Error: s("error"), Attempts: i("attempts"),
		FailedAt: i("failed_at"), Offset: e.Offset, Partition: e.Partition, MessageID: e.MessageID, Tx: e.Tx,
		CreatedMs: e.CreatedMs, Header: string(e.Header), Payload: string(e.Payload)}
}

// replayScript is resources/queue_replay.lua.
var replayScript = redis.NewScript(resources.MustRead("queue_replay.lua"))

// ReplayDeadLetters moves dead letters back into queue q with resources/queue_replay.lua: each gets
// its shard's next offset (same partition, id, transaction id, created-at, header and payload) and
// leaves the dead-letter stream in the same atomic step, so a replay is never doubled. Every group of
// the queue sees a replayed message again, so with several groups it refuses unless allGroups.
// It returns how many were replayed.
func ReplayDeadLetters(ctx context.Context, rdb redis.UniversalClient, l Layout, q string, dls []DeadLetter, allGroups bool) (int, error) {
	if len(dls) == 0 {
		return 0, nil
	}
	if !allGroups {
		names, err := groupNames(ctx, rdb, l, q)
		if err != nil {
			return 0, err
		}
		if len(names) > 1 {
			return 0, errcode.New(errcode.ReplayAllGroups,
				fmt.Sprintf("queue %q has %d consumer groups (%s) and a replayed message reaches every one of them", q, len(names), strings.Join(names, ", ")),
				"add --all-groups if every group should see the replayed messages again (consumers that already processed them must skip repeats by message id)")
		}
	}
	shards, err := ShardCount(ctx, rdb, l, q)
	if err != nil {
		return 0, err
	}
	if shards == 0 {
		return 0, noQueue(l, q)
	}
	done := 0
	for start := 0; start < len(dls); start += 500 {
		n, err := replayChunk(ctx, rdb, l, q, shards, dls[start:min(start+500, len(dls))])
		done += n
		if err != nil {
			return done, err
		}
	}
	return done, nil
}

func replayChunk(ctx context.Context, rdb redis.UniversalClient, l Layout, q string, shards int, dls []DeadLetter) (int, error) {
	keys := []string{l.Meta(q), l.DLQ(q)}
	streamIdx := map[int]int{}
	var shardArgs, pairs []any
	for _, d := range dls {
		n := Shard(d.Partition, shards)
		j, ok := streamIdx[n]
		if !ok {
			keys = append(keys, l.Stream(q, n))
			shardArgs = append(shardArgs, n)
			j = len(shardArgs)
			streamIdx[n] = j
		}
		pairs = append(pairs, d.EntryID, j)
	}
	args := append([]any{shards, len(shardArgs)}, shardArgs...)
	args = append(args, pairs...)
	res, err := replayScript.Run(ctx, rdb, keys, args...).Int64Slice()
	if err != nil {
		return 0, fmt.Errorf("replay: %w", classify(err))
	}
	return int(res[0]), nil
}

// DropDeadLetters deletes dead letters from the dead-letter stream.
func DropDeadLetters(ctx context.Context, rdb redis.Cmdable, l Layout, q string, dls []DeadLetter) (int64, error) {
	var n int64
	for start := 0; start < len(dls); start += 1000 {
		chunk := dls[start:min(start+1000, len(dls))]
		ids := make([]string, len(chunk))
		for i, d := range chunk {
			ids[i] = d.EntryID
		}
		k, err := rdb.XDel(ctx, l.DLQ(q), ids...).Result()
		if err != nil {
			return n, fmt.Errorf("drop dead letters: %w", err)
		}
		n += k
	}
	return n, nil
}

// groupNames lists the consumer groups of queue q (from shard 0, where every group exists).
func groupNames(ctx context.Context, rdb redis.Cmdable, l Layout, q string) ([]string, error) {
	shards, err := ShardCount(ctx, rdb, l, q)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for n := 0; n < shards; n++ {
		gs, err := rdb.XInfoGroups(ctx, l.Stream(q, n)).Result()
		if err != nil && !strings.Contains(err.Error(), "no such key") {
			return nil, err
		}
		for _, g := range gs {
			seen[g.Name] = true
		}
	}
	var out []string
	for g := range seen {
		out = append(out, g)
	}
	sort.Strings(out)
	return out, nil
}
