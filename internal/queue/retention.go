package queue

import (
	"context"
	"fmt"
	"math"
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
		b, err := lengthBound(ctx, rdb, stream, r.MaxLength)
		if err != nil {
			return 0, err
		}
		if b != "" && (bound == "" || idLess(bound, b)) {
			bound = b
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

// lengthBound is the id of the entry holding the maxLength-th newest message of stream, the
// lowest entry max_length keeps ("" when the stream holds no more messages than that). A shard
// numbers its messages 1, 2, 3... in entry order (DESIGN §4), so that entry is the first whose
// last offset reaches the newest offset - maxLength + 1: a search over entry ids finds it reading
// a few dozen entries, however large max_length is (counting back from the newest entry would
// read max_length messages, payloads and all, on every trim). It reads with XREVRANGE alone, the
// command retention's ACL grants. A stream whose newest entry carries no offset (another
// producer's) is counted back instead.
func lengthBound(ctx context.Context, rdb redis.Cmdable, stream string, maxLength int64) (string, error) {
	newest, err := rdb.XRevRangeN(ctx, stream, "+", "-", 1).Result()
	if err != nil || len(newest) == 0 {
		return "", err
	}
	last := lastOffset(newest[0])
	if last <= 0 {
		return countBound(ctx, rdb, stream, maxLength)
	}
	target := last - maxLength + 1
	if target <= 1 {
		return "", nil
	}
	// probe is the last entry at or before id end, and whether it holds the target offset or a
	// later one.
	probe := func(end string) (redis.XMessage, bool, error) {
		xs, err := rdb.XRevRangeN(ctx, stream, end, "-", 1).Result()
		if err != nil || len(xs) == 0 {
			return redis.XMessage{}, false, err
		}
		return xs[0], lastOffset(xs[0]) >= target, nil
	}
	// search bisects (lo, hi] for the smallest k whose probe at(k) reaches the target, given that
	// at(hi) reaches (x is its entry) and lo does not; it returns k and its entry. Both searches
	// below count from 1 (k - 1 is the millisecond, then the sequence number), so that 0 stands for
	// "before any", which never reaches.
	search := func(lo, hi uint64, x redis.XMessage, at func(k uint64) string) (uint64, redis.XMessage, error) {
		for hi-lo > 1 {
			mid := lo + (hi-lo)/2
			mx, ok, err := probe(at(mid))
			if err != nil {
				return 0, x, err
			}
			if ok {
				hi, x = mid, mx
			} else {
				lo = mid
			}
		}
		return hi, x, nil
	}
	// The millisecond of the entry sought: the first whose entries up to its end reach the
	// target. Galloping back from the newest entry's finds one that does not, then bisecting.
	msEnd := func(k uint64) string {
		return strconv.FormatUint(k-1, 10) + "-" + strconv.FormatUint(math.MaxUint64, 10)
	}
	ms, _ := splitID(newest[0].ID)
	hi, x, lo := ms+1, newest[0], uint64(0)
	for step := uint64(1); hi-lo > 1; step *= 2 {
		k := hi - min(step, hi-1-lo)
		kx, ok, err := probe(msEnd(k))
		if err != nil {
			return "", err
		}
		if !ok {
			lo = k
			break
		}
		hi, x = k, kx
	}
	hi, x, err = search(lo, hi, x, msEnd)
	if err != nil {
		return "", err
	}
	// The entry sought is one of that millisecond's (those before it do not reach, those up to its
	// end do): the same search over its sequence numbers.
	prefix := strconv.FormatUint(hi-1, 10) + "-"
	_, seq := splitID(x.ID)
	_, x, err = search(0, seq+1, x, func(k uint64) string { return prefix + strconv.FormatUint(k-1, 10) })
	return x.ID, err
}

// countBound is lengthBound for a stream without offsets: it counts messages back from the
// newest entry.
func countBound(ctx context.Context, rdb redis.Cmdable, stream string, maxLength int64) (string, error) {
	xs, err := rdb.XRevRangeN(ctx, stream, "+", "-", maxLength).Result()
	if err != nil {
		return "", err
	}
	var kept int64
	for _, x := range xs {
		if kept += messagesIn(x); kept >= maxLength {
			return x.ID, nil
		}
	}
	return "", nil
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
		var p *redis.XPending
		if g.Pending > 0 {
			if p, err = rdb.XPending(ctx, stream, g.Name).Result(); err != nil {
				return "", err
			}
		}
		if need := groupNeeds(g, p); low == "" || idLess(need, low) {
			low = need
		}
	}
	return low, nil
}

// groupNeeds is the lowest entry group g still needs: its lowest pending entry (p, read after g),
// else its last-delivered entry. The two are read one after the other while consumers read and
// ack: a pending summary that comes back empty (the entries were acked in between) leaves the
// last-delivered entry g was read with, which is never above what the group has delivered since.
func groupNeeds(g redis.XInfoGroup, p *redis.XPending) string {
	need := g.LastDeliveredID
	if p != nil && p.Count > 0 && p.Lower != "" && idLess(p.Lower, need) {
		need = p.Lower
	}
	return need
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
