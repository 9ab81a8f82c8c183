package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/redis/go-redis/v9"

	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/snapshot"
	"github.com/pgrelay/pgrelay/resources"
)

// groupStartScript is resources/queue_group_start.lua: the group on every shard and its start, at once.
var groupStartScript = redis.NewScript(resources.MustRead("queue_group_start.lua"))

// Start is where a new consumer group begins when its consumer first loaded its state from
// PostgreSQL (docs/queue.md "Load, then follow"):
//
//  1. Positions: the last entry id of every shard, read before step 2;
//  2. then every transaction that may have committed by then is waited for until it is visible
//     (internal/follow.WaitCommitted);
//  3. then the state is loaded in a REPEATABLE READ transaction whose first statement reads
//     Snapshot (pg_current_snapshot()) and LSN (pg_current_wal_insert_lsn()).
//
// The group starts on shard n after Positions[n] and skips every entry whose transaction the
// snapshot sees: those are in the loaded state. Every entry at or before the positions belongs to
// such a transaction (step 2), and every later one whose transaction the snapshot does not see is
// delivered, so the consumer applies each transaction exactly once: in the load or from the queue.
type Start struct {
	Positions []string          // per shard: the last entry id the load covers ("0-0": none)
	Added     []int64           // per shard: entries ever added to it up to that id; -1 when not given
	Snapshot  snapshot.Snapshot // the load's pg_current_snapshot()
	LSN       pglogrepl.LSN     // the load's pg_current_wal_insert_lsn(): a commit at or past it was not seen
}

// startVerdict is what the start rule says of one entry.
type startVerdict uint8

const (
	startDeliver startVerdict = iota // not in the load: deliver it
	startSkip                        // in the load: ack it without delivering
	startPast                        // committed at or after LSN: neither it nor any later entry of its shard is in the load
)

// The text forms of a start (ParseStart, and the redis_queue input's lint rules). A position is a
// stream entry id ("0" for "0-0"), optionally followed by @ and the number of entries ever added
// to the shard up to it (XINFO STREAM's entries-added); positions are separated by commas.
const (
	PositionsPattern = `^\s*` + positionForm + `(\s*,\s*` + positionForm + `)*\s*$`
	SnapshotPattern  = `^\s*[0-9]+:[0-9]+:([0-9]+(,[0-9]+)*)?\s*$`
	LSNPattern       = `^\s*[0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8}\s*$`
	positionForm     = `[0-9]+(-[0-9]+)?(@[0-9]+)?`
)

var (
	positionsRe = regexp.MustCompile(PositionsPattern)
	positionRe  = regexp.MustCompile(`^([0-9]+(-[0-9]+)?)(@([0-9]+))?$`)
	snapshotRe  = regexp.MustCompile(SnapshotPattern)
	lsnRe       = regexp.MustCompile(LSNPattern)
)

// parseLSN reads a WAL position as PostgreSQL prints it ("0/1A2B3C4"), nothing around it.
func parseLSN(s string) (pglogrepl.LSN, bool) {
	hi, lo, ok := strings.Cut(s, "/")
	if !ok || len(hi) == 0 || len(hi) > 8 || len(lo) == 0 || len(lo) > 8 {
		return 0, false
	}
	h, err1 := strconv.ParseUint(hi, 16, 32)
	l, err2 := strconv.ParseUint(lo, 16, 32)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return pglogrepl.LSN(h<<32 | l), true
}

// ParseStart reads a start from its text forms: positions "id@added,..." (per shard its last
// entry id and, optionally, the entries ever added up to it, as `pgrelay queue position` prints
// them), the snapshot as pg_current_snapshot() prints it ("xmin:xmax:xip,..."), the lsn as
// PostgreSQL prints it ("0/1A2B3C4"). A malformed one is a bad_start error naming the part.
func ParseStart(positions, snap, lsn string) (*Start, error) {
	bad := func(what string, err error) error {
		return errcode.Wrap(errcode.BadStart, err, "start after a load: "+what,
			"pass the positions `pgrelay queue position` printed, and pg_current_snapshot() and pg_current_wal_insert_lsn() as the load's first statement returned them")
	}
	switch {
	case !positionsRe.MatchString(positions):
		return nil, bad(fmt.Sprintf("positions %q are not stream entry ids (ms-seq, optionally @entries-added) separated by commas", positions), nil)
	case !snapshotRe.MatchString(snap):
		return nil, bad(fmt.Sprintf("snapshot %q is not pg_current_snapshot() as PostgreSQL prints it (xmin:xmax:xip,...)", snap), nil)
	case !lsnRe.MatchString(lsn):
		return nil, bad(fmt.Sprintf("lsn %q is not a WAL position as PostgreSQL prints it (0/1A2B3C4)", lsn), nil)
	}
	s := &Start{}
	for _, p := range strings.Split(strings.TrimSpace(positions), ",") {
		m := positionRe.FindStringSubmatch(strings.TrimSpace(p))
		id, added := m[1], int64(-1)
		if !strings.Contains(id, "-") {
			id += "-0"
		}
		if m[4] != "" {
			var err error
			if added, err = strconv.ParseInt(m[4], 10, 64); err != nil {
				return nil, bad(fmt.Sprintf("position %q", p), err)
			}
		}
		s.Positions, s.Added = append(s.Positions, id), append(s.Added, added)
	}
	var err error
	if s.Snapshot, err = snapshot.ParseSnapshot(snap); err != nil {
		return nil, bad("snapshot", err)
	}
	if s.Snapshot.Xmin > s.Snapshot.Xmax {
		return nil, bad(fmt.Sprintf("snapshot %q has xmin above xmax", snap), nil)
	}
	for _, x := range s.Snapshot.Xip {
		if x < s.Snapshot.Xmin || x >= s.Snapshot.Xmax {
			return nil, bad(fmt.Sprintf("snapshot %q lists an xid in progress outside [xmin, xmax)", snap), nil)
		}
	}
	s.LSN, _ = parseLSN(strings.TrimSpace(lsn))
	return s, nil
}

// PositionsText is the positions as one string, "id@added,...", the form ParseStart reads.
func (s *Start) PositionsText() string {
	ps := make([]Position, len(s.Positions))
	for i, id := range s.Positions {
		ps[i] = Position{Shard: i, ID: id, Added: s.Added[i]}
	}
	return PositionsText(ps)
}

// SnapshotText is the snapshot as pg_current_snapshot() prints it.
func (s *Start) SnapshotText() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d:%d:", s.Snapshot.Xmin, s.Snapshot.Xmax)
	for i, x := range s.Snapshot.Xip {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatUint(x, 10))
	}
	return b.String()
}

// position is where the group starts on shard n ("0-0" for a shard the start does not know).
func (s *Start) position(n int) string {
	if n < len(s.Positions) {
		return s.Positions[n]
	}
	return "0-0"
}

// startFields are the fields of a change event (DESIGN §2) the start rule reads.
type startFields struct {
	LSN string  `json:"lsn"`
	Xid *uint32 `json:"xid"`
}

// judge applies the start rule to an entry's payload. An entry is in the load iff its transaction
// committed before the load's snapshot was taken: its commit lsn is below LSN (a transaction the
// snapshot sees committed before it, so its commit record is below the insert position read after
// the snapshot) and its xid, widened to 64 bits next to the snapshot's xmax, is one the snapshot
// sees. Below LSN every xid is within 2^31 of xmax, so the widening is exact; at or past LSN
// nothing is compared. An entry without a readable lsn and xid (`r` and fill events, which hold
// whole rows, and the payloads of other producers) is always delivered.
func (s *Start) judge(payload []byte) startVerdict {
	var f startFields
	if json.Unmarshal(payload, &f) != nil || f.LSN == "" {
		return startDeliver
	}
	lsn, ok := parseLSN(f.LSN)
	if !ok {
		return startDeliver
	}
	if lsn >= s.LSN {
		return startPast
	}
	if f.Xid != nil && s.Snapshot.Sees(*f.Xid) {
		return startSkip
	}
	return startDeliver
}

// Position is where one shard ended when the positions were read.
type Position struct {
	Shard int    `json:"shard"`
	ID    string `json:"id"`    // the last id added to the shard (XINFO STREAM last-generated-id); "0-0": none yet
	Added int64  `json:"added"` // entries ever added to the shard (entries-added); -1: not known
}

// PositionsText joins ps in shard order as "id@added,...", the form ParseStart reads.
func PositionsText(ps []Position) string {
	var b strings.Builder
	for i, p := range ps {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(p.ID)
		if p.Added >= 0 {
			b.WriteByte('@')
			b.WriteString(strconv.FormatInt(p.Added, 10))
		}
	}
	return b.String()
}

// ReadPositions reads where every shard of queue q ends, all in one MULTI/EXEC of XINFO STREAM
// (the shard count read again inside it): the last id added to the shard, and how many entries
// were ever added to it, so that a group created later can tell whether retention removed some of
// what came after. A queue that does not exist is a no_queue error.
func ReadPositions(ctx context.Context, rdb redis.UniversalClient, l Layout, q string) ([]Position, error) {
	shards, err := ShardCount(ctx, rdb, l, q)
	if err != nil {
		return nil, err
	}
	if shards == 0 {
		return nil, noQueue(l, q)
	}
	var again *redis.StringCmd
	infos := make([]*redis.XInfoStreamCmd, shards)
	_, _ = rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		again = p.HGet(ctx, l.Meta(q), "shards")
		for n := range infos {
			infos[n] = p.XInfoStream(ctx, l.Stream(q, n))
		}
		return nil
	})
	if err := again.Err(); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("queue %s: read positions: %w", q, err)
	}
	if again.Val() != strconv.Itoa(shards) {
		return nil, fmt.Errorf("queue %s: its shard count changed from %d to %q while the positions were read", q, shards, again.Val())
	}
	out := make([]Position, shards)
	for n, cmd := range infos {
		out[n] = Position{Shard: n, ID: "0-0"}
		info, err := cmd.Result()
		switch {
		case err != nil && strings.Contains(err.Error(), "no such key"): // nothing written to this shard yet
		case err != nil:
			return nil, fmt.Errorf("queue %s: read the position of shard %d: %w", q, n, err)
		default:
			out[n].ID, out[n].Added = info.LastGeneratedID, info.EntriesAdded
		}
	}
	return out, nil
}

// StartOf reads the start stored with group g of queue q (nil when the group has none).
func StartOf(ctx context.Context, rdb redis.Cmdable, l Layout, q, g string) (*Start, error) {
	vals, err := rdb.HMGet(ctx, l.GroupStart(q, g), "positions", "snapshot", "lsn").Result()
	if err != nil {
		return nil, fmt.Errorf("queue %s group %s: read its start: %w", q, g, err)
	}
	return storedStart(vals[0], vals[1], vals[2])
}

// storedStart parses the fields of a start hash; nil when there is none.
func storedStart(positions, snap, lsn any) (*Start, error) {
	p, _ := positions.(string)
	if p == "" {
		return nil, nil
	}
	sn, _ := snap.(string)
	ls, _ := lsn.(string)
	return ParseStart(p, sn, ls)
}

// openGroup creates the group on every one of the queue's shards, with the configured start when
// there is one, and returns the group's start (nil when it has none). Every replica of the group
// applies the start stored in Redis, whether its own config names one or not.
func (c *Consumer) openGroup(ctx context.Context, shards int) (*Start, error) {
	q, g := c.conf.Queue, c.conf.Group
	keys := make([]string, 0, shards+1)
	keys = append(keys, c.layout.GroupStart(q, g))
	for n := 0; n < shards; n++ {
		keys = append(keys, c.layout.Stream(q, n))
	}
	plain := "0"
	if c.conf.StartFrom == "latest" {
		plain = "$"
	}
	var positions, snap, lsn string
	if s := c.conf.Start; s != nil {
		if len(s.Positions) != shards {
			return nil, errcode.New(errcode.BadStart, fmt.Sprintf("the start after a load has %d positions; queue %s has %d shards", len(s.Positions), q, shards),
				"read the positions of this queue (pgrelay queue position "+q+"), then load again")
		}
		positions, snap, lsn = s.PositionsText(), s.SnapshotText(), s.LSN.String()
	}
	res, err := groupStartScript.Run(ctx, c.rdb, keys, g, plain, positions, snap, lsn, time.Now().UnixMilli()).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("queue %s: create group %s: %w", q, g, err)
	}
	if len(res) < 2 {
		return nil, fmt.Errorf("queue %s: create group %s: unexpected reply %q", q, g, res)
	}
	switch res[0] {
	case "ok":
		if len(res) != 4 {
			return nil, fmt.Errorf("queue %s: create group %s: unexpected reply %q", q, g, res)
		}
		start, err := storedStart(res[1], res[2], res[3])
		if err != nil {
			return nil, fmt.Errorf("queue %s group %s: the start stored in %s: %w", q, g, c.layout.GroupStart(q, g), err)
		}
		if start != nil && len(start.Positions) != shards {
			c.conf.Logger.Warnf("queue %s group %s: its start has %d positions and the queue %d shards (created again?); the skip rule still applies",
				q, g, len(start.Positions), shards)
		}
		return start, nil
	case "conflict":
		what := "without a start after a load"
		if len(res) == 4 && res[1] != "" {
			what = fmt.Sprintf("with another start (positions %s, snapshot %s, lsn %s)", res[1], res[2], res[3])
		}
		return nil, errcode.New(errcode.StartConflict, fmt.Sprintf("consumer group %s of queue %s already exists %s; a start after a load applies only to a new group", g, q, what),
			"give the consumer that loaded a new group name, or remove its start to go on with the existing group")
	case "trimmed":
		return nil, errcode.New(errcode.StartTrimmed, fmt.Sprintf("entries after the start position of shard %s of queue %s were removed before group %s was created", res[1], q, g),
			"load again and start the group at once; keep entries longer (max_age, max_length) if loads take that long")
	case "ahead":
		return nil, errcode.New(errcode.BadStart, fmt.Sprintf("the start position of shard %s is past the last entry of queue %s", res[1], q),
			"read the positions of this queue (pgrelay queue position "+q+") with the same prefix, then load again")
	}
	return nil, fmt.Errorf("queue %s: create group %s: unexpected reply %q", q, g, res)
}

// groupStart is the start the group applies (nil: none).
func (c *Consumer) groupStart() *Start {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.start
}

// ackSkipped acks the entries whose every message the group's start had in the load, never
// delivered (fetch logs and counts the messages skipped).
func (c *Consumer) ackSkipped(ctx context.Context, n int, ids []string) error {
	if err := c.ackUndelivered(ctx, n, ids); err != nil {
		return fmt.Errorf("ack entries in the load: %w", err)
	}
	return nil
}
