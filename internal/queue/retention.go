package queue

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Retention bounds what a queue keeps: entries older than MaxAge or beyond those holding the
// newest MaxLength messages of a shard may be trimmed, but only below the lowest entry some consumer group has not yet acked
// (its lowest pending entry, or its last-delivered entry). A shard without groups is trimmed by the
// policy alone. Zero values mean no bound.
type Retention struct {
	MaxAge    time.Duration
	MaxLength int64
}

// Enabled reports whether the policy trims anything.
func (r Retention) Enabled() bool { return r.MaxAge > 0 || r.MaxLength > 0 }

// Trim applies the policy to every shard of queue q and returns how many entries it removed.
func Trim(ctx context.Context, rdb redis.Cmdable, l Layout, q string, r Retention) (int64, error) {
	if !r.Enabled() {
		return 0, nil
	}
	shards, err := ShardCount(ctx, rdb, l, q)
	if err != nil || shards == 0 {
		return 0, err
	}
	var total int64
	for n := 0; n < shards; n++ {
		removed, err := trimShard(ctx, rdb, l.Stream(q, n), r)
		if err != nil {
			return total, fmt.Errorf("queue %s shard %d: trim: %w", q, n, err)
		}
		total += removed
	}
	return total, nil
}

// ShardCount reads queue q's shard count; 0 when the queue does not exist.
// It uses HGET alone: the least-privilege roles of `pgrelay queue` (docs/operations.md) grant no more.
func ShardCount(ctx context.Context, rdb redis.Cmdable, l Layout, q string) (int, error) {
	s, err := rdb.HGet(ctx, l.Meta(q), "shards").Result()
	if err == redis.Nil {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("queue %s: read meta: %w", q, err)
	}
	return parseShards(q, s)
}

// parseShards is the shard count s that queue q's meta holds.
func parseShards(q, s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("queue %q: meta shards %q is not a positive number", q, s)
	}
	return n, nil
}

func trimShard(ctx context.Context, rdb redis.Cmdable, stream string, r Retention) (int64, error) {
	bound := ""
	if r.MaxAge > 0 {
		bound = strconv.FormatInt(time.Now().Add(-r.MaxAge).UnixMilli(), 10) + "-0"
	}
	if r.MaxLength > 0 {
		xs, err := rdb.XRevRangeN(ctx, stream, "+", "-", r.MaxLength).Result()
		if err != nil {
			return 0, err
		}
		// the newest entry holding the MaxLength-th newest message (a layout-3 entry holds several)
		var kept int64
		for _, x := range xs {
			if kept += messagesIn(x); kept >= r.MaxLength {
				if bound == "" || idLess(bound, x.ID) {
					bound = x.ID
				}
				break
			}
		}
	}
	if bound == "" {
		return 0, nil
	}
	safe, err := ackedBelow(ctx, rdb, stream)
	if err != nil {
		return 0, err
	}
	if safe != "" && idLess(safe, bound) {
		bound = safe
	}
	return rdb.XTrimMinID(ctx, stream, bound).Result()
}

// ackedBelow returns the lowest entry id some group of stream still needs: every entry below it is
// acked by every group. "" when the stream has no groups.
func ackedBelow(ctx context.Context, rdb redis.Cmdable, stream string) (string, error) {
	groups, err := rdb.XInfoGroups(ctx, stream).Result()
	if err != nil {
		if strings.Contains(err.Error(), "no such key") {
			return "", nil
		}
		return "", err
	}
	low := ""
	for _, g := range groups {
		need := g.LastDeliveredID
		if g.Pending > 0 {
			p, err := rdb.XPending(ctx, stream, g.Name).Result()
			if err != nil {
				return "", err
			}
			need = p.Lower
		}
		if low == "" || idLess(need, low) {
			low = need
		}
	}
	return low, nil
}

// idLess compares stream entry ids "ms-seq" numerically.
func idLess(a, b string) bool {
	am, as := splitID(a)
	bm, bs := splitID(b)
	if am != bm {
		return am < bm
	}
	return as < bs
}

func splitID(id string) (uint64, uint64) {
	ms, seq, _ := strings.Cut(id, "-")
	m, _ := strconv.ParseUint(ms, 10, 64)
	s, _ := strconv.ParseUint(seq, 10, 64)
	return m, s
}

// messagesIn is the number of messages stream entry x holds: several in layout 3, else one.
func messagesIn(x redis.XMessage) int64 {
	if m, ok := x.Values[FieldMeta].(string); ok && isPacked(m) {
		return int64(len(EntriesOf(nil, x)))
	}
	return 1
}
