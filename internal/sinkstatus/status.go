// Package sinkstatus is the sink half of `pgrelay status`: for every pg_sink of a pipeline it
// reads the sink's progress rows (the offset applied per queue shard), and for every redis_queue
// input the consumer group's lag, pending entries, owners and dead letters, and prints them
// human-readable or as JSON. The command (internal/cli) reads the config and fills Parts.
package sinkstatus

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgrelay/pgrelay/internal/pgconnect"
	"github.com/pgrelay/pgrelay/internal/queue"
	"github.com/pgrelay/pgrelay/internal/redisconn"
)

// SinkRef is what a pg_sink of the config says: where its progress rows are.
type SinkRef struct {
	Name          string
	Table         string
	Mode          string
	ProgressTable string
	Conn          pgconnect.Config
}

// GroupRef is what a redis_queue input of the config says: which group reads which queue where.
type GroupRef struct {
	Queue string
	Group string
	Redis redisconn.Config
}

// Parts are the sink-side components of one pipeline config.
type Parts struct {
	Sinks      []SinkRef
	Groups     []GroupRef
	MetricsURL string // the pipeline's Prometheus endpoint, "" when it has none
}

// Status is the sink side of one pipeline config.
type Status struct {
	Sinks  []SinkStatus  `json:"sinks"`
	Groups []GroupStatus `json:"groups"`
}

// SinkStatus is one pg_sink's committed progress.
type SinkStatus struct {
	Name          string          `json:"name"`
	Mode          string          `json:"mode"`
	Table         string          `json:"table,omitempty"`
	ProgressTable string          `json:"progress_table"`
	Progress      []ShardProgress `json:"progress"` // by queue, shard
	Live          *Live           `json:"live,omitempty"`
	Problem       string          `json:"postgres_error,omitempty"`
}

// ShardProgress is one progress row: the last offset of a queue shard the sink has committed.
type ShardProgress struct {
	Queue      string    `json:"queue"`
	Shard      int       `json:"shard"`
	LastOffset int64     `json:"last_offset"`
	UpdatedAt  time.Time `json:"updated_at"`
}

// GroupStatus is one consumer group of a queue, shard by shard.
type GroupStatus struct {
	Queue       string        `json:"queue"`
	Group       string        `json:"group"`
	Shards      int           `json:"shards"`
	Lag         int64         `json:"lag"`          // messages not yet delivered to the group
	Pending     int64         `json:"pending"`      // delivered, not yet acked
	DeadLetters int64         `json:"dead_letters"` // of this group
	Replicas    int64         `json:"replicas"`     // live members
	ShardInfo   []GroupShard  `json:"shard_info"`
	Problem     string        `json:"redis_error,omitempty"`
	created     bool          // the group exists
	info        *queue.Info   // for the human form
	sinks       []*SinkStatus // sinks of the same config that read this queue
}

// GroupShard is the group on one shard, with the offset the config's sink applied there.
type GroupShard struct {
	Shard      int    `json:"shard"`
	LastOffset int64  `json:"last_offset"`              // last offset written to the shard
	Applied    *int64 `json:"applied_offset,omitempty"` // the sink's progress (one sink in the config)
	Behind     *int64 `json:"behind,omitempty"`         // last_offset - applied_offset
	Lag        int64  `json:"lag"`
	Pending    int64  `json:"pending"`
	Owner      string `json:"owner,omitempty"` // replica holding the shard lease
}

// Problems lists the errors met while reading (each part is still shown).
func (s *Status) Problems() []string {
	var out []string
	for _, k := range s.Sinks {
		if k.Problem != "" {
			out = append(out, "sink "+k.Name+": "+k.Problem)
		}
	}
	for _, g := range s.Groups {
		if g.Problem != "" {
			out = append(out, "group "+g.Group+" on queue "+g.Queue+": "+g.Problem)
		}
	}
	return out
}

// Read gathers the status of every part: progress rows from PostgreSQL, groups from Redis. A server
// that cannot be reached is reported in that part's problem field, not as an error.
func Read(ctx context.Context, parts Parts) *Status {
	st := &Status{Sinks: []SinkStatus{}, Groups: []GroupStatus{}}
	for _, s := range parts.Sinks {
		ss := readSink(ctx, s)
		if parts.MetricsURL != "" {
			ss.Live = scrapeLive(ctx, parts.MetricsURL, s.Name)
		}
		st.Sinks = append(st.Sinks, ss)
	}
	for _, g := range parts.Groups {
		gs := readGroup(ctx, g)
		for i := range st.Sinks {
			if len(st.Sinks) == 1 || st.Sinks[i].reads(g.Queue) {
				gs.sinks = append(gs.sinks, &st.Sinks[i])
			}
		}
		gs.joinProgress()
		st.Groups = append(st.Groups, gs)
	}
	return st
}

// reads says whether the sink has progress rows of queue q.
func (s *SinkStatus) reads(q string) bool {
	for _, p := range s.Progress {
		if p.Queue == q {
			return true
		}
	}
	return false
}

func readSink(ctx context.Context, ref SinkRef) SinkStatus {
	st := SinkStatus{Name: ref.Name, Mode: ref.Mode, Table: ref.Table, ProgressTable: ref.ProgressTable, Progress: []ShardProgress{}}
	schema, name, ok := strings.Cut(ref.ProgressTable, ".")
	if !ok {
		st.Problem = fmt.Sprintf("progress_table %q is not schema.name", ref.ProgressTable)
		return st
	}
	pcfg, err := ref.Conn.PoolConfig(1)
	if err != nil {
		st.Problem = err.Error()
		return st
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		st.Problem = err.Error()
		return st
	}
	defer pool.Close()
	rows, err := pool.Query(ctx, `SELECT queue, shard, last_offset, updated_at FROM `+pgx.Identifier{schema, name}.Sanitize()+
		` WHERE sink = $1 ORDER BY queue, shard`, ref.Name)
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42P01" {
			st.Problem = fmt.Sprintf("progress table %s does not exist: the sink has not started yet (or progress_table differs)", ref.ProgressTable)
		} else {
			st.Problem = pgconnect.Explain(err).Error()
		}
		return st
	}
	defer rows.Close()
	for rows.Next() {
		var p ShardProgress
		if err := rows.Scan(&p.Queue, &p.Shard, &p.LastOffset, &p.UpdatedAt); err != nil {
			st.Problem = err.Error()
			return st
		}
		p.UpdatedAt = p.UpdatedAt.UTC()
		st.Progress = append(st.Progress, p)
	}
	if err := rows.Err(); err != nil {
		st.Problem = err.Error()
	}
	return st
}

func readGroup(ctx context.Context, ref GroupRef) GroupStatus {
	gs := GroupStatus{Queue: ref.Queue, Group: ref.Group, ShardInfo: []GroupShard{}}
	rdb, err := ref.Redis.Client()
	if err != nil {
		gs.Problem = err.Error()
		return gs
	}
	defer rdb.Close()
	if err := ref.Redis.CheckACL(ctx, rdb, ref.Queue, redisconn.UseInspect, redisconn.UseDeadLetters); err != nil {
		gs.Problem = err.Error()
		return gs
	}
	layout := queue.NewLayout(ref.Redis.Prefix)
	info, err := queue.Inspect(ctx, rdb, layout, ref.Queue)
	if err != nil {
		gs.Problem = ref.Redis.Explain(err).Error()
		return gs
	}
	gs.info, gs.Shards = info, info.Shards
	dls, err := queue.ListDeadLetters(ctx, rdb, layout, ref.Queue, ref.Group, 0)
	if err != nil {
		gs.Problem = ref.Redis.Explain(err).Error()
	}
	gs.DeadLetters = int64(len(dls))
	perShard := map[int]queue.GroupShardInfo{}
	for _, g := range info.Groups {
		if g.Name == ref.Group {
			gs.created = true
			gs.Lag, gs.Pending, gs.Replicas = g.Lag, g.Pending, g.Replicas
			for _, s := range g.Shards {
				perShard[s.Shard] = s
			}
		}
	}
	if !gs.created && gs.Problem == "" {
		gs.Problem = fmt.Sprintf("group %s does not exist on queue %s yet (the input creates it when it starts)", ref.Group, ref.Queue)
	}
	for _, si := range info.ShardInfo {
		g := perShard[si.Shard]
		gs.ShardInfo = append(gs.ShardInfo, GroupShard{Shard: si.Shard, LastOffset: si.LastOffset, Lag: g.Lag, Pending: g.Pending, Owner: g.Owner})
	}
	return gs
}

// joinProgress fills applied_offset and behind when exactly one sink of the config reads the queue.
func (gs *GroupStatus) joinProgress() {
	if len(gs.sinks) != 1 {
		return
	}
	applied := map[int]int64{}
	for _, p := range gs.sinks[0].Progress {
		if p.Queue == gs.Queue {
			applied[p.Shard] = p.LastOffset
		}
	}
	for i := range gs.ShardInfo {
		s := &gs.ShardInfo[i]
		a := applied[s.Shard]
		behind := s.LastOffset - a
		s.Applied, s.Behind = &a, &behind
	}
}
