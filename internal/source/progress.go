package source

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgrelay/pgrelay/internal/snapshot"
)

// progressEvery is how often a running snapshot logs its progress and records it in the source's
// status hash (what `pgrelay status` shows), in nanoseconds: atomic, as a test shortens it while
// other sources' snapshots may run.
var progressEvery atomic.Int64

func init() { progressEvery.Store(int64(10 * time.Second)) }

// SnapshotProgress is a snapshot's progress: the table being read, its rows done and row estimate
// (pg_class.reltuples, so the percent is approximate), and the rate and time left of this table.
type SnapshotProgress struct {
	Table      string  `json:"table"`
	TableIndex int     `json:"table_index"` // 0-based position of Table in the snapshot's tables
	Tables     int     `json:"tables"`
	RowsDone   int64   `json:"rows_done"`            // rows of Table done
	Estimate   int64   `json:"estimate"`             // reltuples of Table (-1 or 0: never analyzed)
	Percent    float64 `json:"percent"`              // RowsDone / Estimate, capped at 100
	RowsPerSec float64 `json:"rows_per_s,omitempty"` // rows of Table read per second by its owner since it began the table
	ETASec     int64   `json:"eta_s,omitempty"`      // seconds left for Table at that rate (absent: unknown)
	At         string  `json:"at,omitempty"`         // when the owner measured RowsPerSec
}

// newProgress starts the progress of cur's table at its rows done.
func newProgress(cur snapshot.Cursor, estimate int64, now time.Time) *tableProgress {
	p := &tableProgress{SnapshotProgress: SnapshotProgress{Table: cur.Table, Tables: len(cur.Tables), Estimate: estimate},
		startRows: cur.Rows, started: now, logged: now}
	for i, t := range cur.Tables {
		if t == cur.Table {
			p.TableIndex = i
		}
	}
	p.setRows(cur.Rows)
	return p
}

// tableProgress follows the snapshot of one table in the current replication session.
type tableProgress struct {
	SnapshotProgress
	startRows int64 // rows done when the replication session began the table
	started   time.Time
	logged    time.Time
}

func (p *tableProgress) setRows(rows int64) {
	p.RowsDone = rows
	p.Percent = percentOf(rows, p.Estimate)
}

func percentOf(rows, estimate int64) float64 {
	if estimate <= 0 {
		return 0
	}
	return min(100, float64(rows)*100/float64(estimate))
}

// measure sets the rate and time left at now.
func (p *tableProgress) measure(now time.Time) {
	p.At = now.UTC().Format(time.RFC3339)
	p.RowsPerSec, p.ETASec = 0, 0
	if secs := now.Sub(p.started).Seconds(); secs > 0 {
		p.RowsPerSec = float64(p.RowsDone-p.startRows) / secs
	}
	if p.RowsPerSec > 0 && p.Estimate > p.RowsDone {
		p.ETASec = int64(math.Ceil(float64(p.Estimate-p.RowsDone) / p.RowsPerSec))
	}
}

// String is the log line's text.
func (p *SnapshotProgress) String() string {
	s := fmt.Sprintf("snapshot of %s (table %d of %d): ", p.Table, p.TableIndex+1, p.Tables)
	if p.Estimate > 0 {
		s += fmt.Sprintf("%d of ~%d rows (%.1f%%)", p.RowsDone, p.Estimate, p.Percent)
	} else {
		s += fmt.Sprintf("%d rows (no estimate: the table was never analyzed)", p.RowsDone)
	}
	if p.At != "" {
		s += fmt.Sprintf(", %.0f rows/s", p.RowsPerSec)
		if p.ETASec > 0 {
			s += ", ETA " + (time.Duration(p.ETASec) * time.Second).String()
		}
	}
	return s
}

// estimateRows reads the table's row estimate (reltuples; -1 or 0 when never analyzed); of a
// partitioned table, the sum of its partitions'. The table is found by its oid when known (0: by
// name): a table renamed while its snapshot runs keeps its estimate. One no longer found has none
// (0).
func estimateRows(ctx context.Context, q queryer, table string, oid uint32) (int64, error) {
	schema, name := ParseTable(table)
	var est float64
	err := q.QueryRow(ctx, `SELECT CASE WHEN c.relkind = 'p' THEN (SELECT coalesce(sum(greatest(l.reltuples, 0)), 0)::float8
			FROM pg_catalog.pg_partition_tree(c.oid) t JOIN pg_catalog.pg_class l ON l.oid = t.relid WHERE t.isleaf)
		ELSE c.reltuples::float8 END
		FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		WHERE CASE WHEN $3::oid = 0 THEN n.nspname = $1 AND c.relname = $2 ELSE c.oid = $3::oid END`, schema, name, oid).Scan(&est)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("row estimate of %s: %w", table, err)
	}
	return int64(est), nil
}

// trackTable starts following cur's table (its estimate read once) and records it in the status
// hash at once, so `pgrelay status` has the table's estimate from its start (the owner's, read by
// the table's oid, is the only one for a table renamed while it is read).
func (sn *snapshotter) trackTable(ctx context.Context, cur snapshot.Cursor) {
	var oid uint32
	if t := sn.tables[cur.Table]; t != nil {
		oid = t.info.OID
	}
	est, err := estimateRows(ctx, sn.pool, cur.Table, oid)
	if err != nil {
		est = 0 // the line says "no estimate"; the snapshot itself goes on
	}
	sn.progress = newProgress(cur, est, time.Now())
	snap := sn.progress.SnapshotProgress
	sn.ss.src.setSnapshotProgress(&snap)
}

// report logs the progress line and records it in the status hash when progressEvery has passed
// since the last one (or since the table began).
func (sn *snapshotter) report(rows int64) {
	p := sn.progress
	p.setRows(rows)
	now := time.Now()
	if now.Sub(p.logged) < time.Duration(progressEvery.Load()) {
		return
	}
	p.logged = now
	p.measure(now)
	src := sn.ss.src
	src.log.Infof("%s", p.String())
	snap := p.SnapshotProgress
	src.setSnapshotProgress(&snap)
}
