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
	// atOrBefore is the last entry with an id at or before end; reaches, whether there is one and
	// it holds the target offset or a later one.
	atOrBefore := func(end string) (redis.XMessage, bool, error) {
		xs, err := rdb.XRevRangeN(ctx, stream, end, "-", 1).Result()
		if err != nil || len(xs) == 0 {
			return redis.XMessage{}, false, err
		}
		return xs[0], true, nil
	}
	newest, found, err := atOrBefore("+")
	if err != nil || !found {
		return "", err
	}
	last := lastOffset(newest)
	if last <= 0 {
		return countBound(ctx, rdb, stream, maxLength)
	}
	target := last - maxLength + 1
	if target <= 1 {
		return "", nil
	}
	reaches := func(end string) (bool, error) {
		x, found, err := atOrBefore(end)
		return found && lastOffset(x) >= target, err
	}
	msEnd := func(ms uint64) string {
		return strconv.FormatUint(ms, 10) + "-" + strconv.FormatUint(math.MaxUint64, 10)
	}
	// The millisecond h of the entry sought: the first whose entries up to its end reach the
	// target. Galloping back from the newest entry's finds a millisecond lo that does not reach,
	// then halving (lo, h] finds it.
	h, _ := splitID(newest.ID) // reaches
	lo, below := uint64(0), false
	for step := uint64(1); h > 0; step *= 2 {
		probe := h - min(step, h)
		ok, err := reaches(msEnd(probe))
		if err != nil {
			return "", err
		}
		if !ok {
			lo, below = probe, true
			break
		}
		h = probe
	}
	for below && h-lo > 1 {
		mid := lo + (h-lo)/2
		ok, err := reaches(msEnd(mid))
		if err != nil {
			return "", err
		}
		if ok {
			h = mid
		} else {
			lo = mid
		}
	}
	// The entry sought is one of millisecond h's (the entries before h do not reach, those up to
	// its end do): the same search over its sequence numbers.
	ms := strconv.FormatUint(h, 10) + "-"
	x, _, err := atOrBefore(msEnd(h))
	if err != nil {
		return "", err
	}
	x0, found, err := atOrBefore(ms + "0")
	if err != nil {
		return "", err
	}
	if found && lastOffset(x0) >= target {
		return x0.ID, nil
	}
	_, seqHi := splitID(x.ID) // reaches
	seqLo := uint64(0)        // does not
	for seqHi-seqLo > 1 {
		mid := seqLo + (seqHi-seqLo)/2
		ok, err := reaches(ms + strconv.FormatUint(mid, 10))
		if err != nil {
			return "", err
		}
		if ok {
			seqHi = mid
		} else {
			seqLo = mid
		}
	}
	x, _, err = atOrBefore(ms + strconv.FormatUint(seqHi, 10))
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
