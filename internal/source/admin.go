package source

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/pgrelay/pgrelay/internal/lease"
	"github.com/pgrelay/pgrelay/internal/pgconnect"
	"github.com/pgrelay/pgrelay/internal/snapshot"
)

// The operator's actions on a source, outside a running pipeline (pgrelay status, resync and
// teardown): each connects, does its one thing and closes.

// Status is what `pgrelay status` shows for one source.
type Status struct {
	Name            string                     `json:"name"`
	Owner           string                     `json:"owner"`
	LeaseTTLLeftMs  int64                      `json:"lease_ttl_left_ms"`
	Replicas        map[string]json.RawMessage `json:"replicas"`
	Pointer         json.RawMessage            `json:"pointer"`
	Slot            string                     `json:"slot"`
	SlotExists      bool                       `json:"slot_exists"`
	SlotActivePID   int                        `json:"slot_active_pid,omitempty"`
	ConfirmedFlush  string                     `json:"confirmed_flush_lsn,omitempty"`
	WALStatus       string                     `json:"wal_status,omitempty"`
	SlotLagBytes    int64                      `json:"slot_lag_bytes"`
	Publication     string                     `json:"publication"`
	PostgresProblem string                     `json:"postgres_error,omitempty"`
	Snapshot        *SnapshotProgress          `json:"snapshot,omitempty"`
}

// ReadStatus gathers a source's status from Redis and PostgreSQL.
func ReadStatus(ctx context.Context, cfg Config) (*Status, error) {
	rdb, err := cfg.Redis.Client()
	if err != nil {
		return nil, err
	}
	defer rdb.Close()
	keys := KeysFor(&cfg)
	st := &Status{Name: cfg.Name, Slot: cfg.Slot, Publication: cfg.Publication, Replicas: map[string]json.RawMessage{}}
	owner, ttl, err := lease.Holder(ctx, rdb, keys.Lease)
	if err != nil {
		return nil, fmt.Errorf("redis: %w", err)
	}
	st.Owner, st.LeaseTTLLeftMs = owner, ttl.Milliseconds()
	if raw, err := rdb.Get(ctx, keys.Pointer).Bytes(); err == nil {
		st.Pointer = raw
	} else if !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("redis: %w", err)
	}
	reps, _ := rdb.HGetAll(ctx, keys.Status).Result()
	for k, v := range reps {
		st.Replicas[k] = json.RawMessage(v)
	}
	if err := st.readSlot(ctx, cfg); err != nil {
		st.PostgresProblem = err.Error()
	}
	if err := st.readSnapshot(ctx, cfg); err != nil && st.PostgresProblem == "" {
		st.PostgresProblem = pgconnect.Explain(err).Error()
	}
	return st, nil
}

func (st *Status) readSlot(ctx context.Context, cfg Config) error {
	pool, err := connectPool(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	slot, err := ReadSlot(ctx, pool, cfg.Slot)
	if err != nil {
		return pgconnect.Explain(err)
	}
	st.SlotExists, st.SlotActivePID, st.WALStatus = slot.Exists, slot.ActivePID, slot.WALStatus
	if slot.Exists {
		st.ConfirmedFlush = slot.ConfirmedFlush.String()
		return pool.QueryRow(ctx, `SELECT pg_current_wal_lsn() - $1::text::pg_lsn`, st.ConfirmedFlush).Scan(&st.SlotLagBytes)
	}
	return nil
}

func connectPool(ctx context.Context, cfg Config) (*pgxpool.Pool, error) {
	qcfg, err := cfg.PG.ConnConfig()
	if err != nil {
		return nil, err
	}
	pcfg, _ := pgxpool.ParseConfig("")
	pcfg.ConnConfig.Config = *qcfg
	pcfg.MaxConns = 1
	return pgxpool.NewWithConfig(ctx, pcfg)
}

// RequestResync writes the source's resync key. The replica owning the source acts on it within a
// heartbeat (or at its next start); a source with no running replica resyncs when one starts.
func RequestResync(ctx context.Context, cfg Config, w io.Writer) error {
	rdb, err := cfg.Redis.Client()
	if err != nil {
		return err
	}
	defer rdb.Close()
	keys := KeysFor(&cfg)
	host, _ := os.Hostname()
	req, _ := json.Marshal(map[string]string{"requested_at": time.Now().UTC().Format(time.RFC3339Nano), "by": host + ":" + strconv.Itoa(os.Getpid())})
	if err := rdb.Set(ctx, keys.Resync, req, 0).Err(); err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	fmt.Fprintf(w, "resync of %s requested (%s): the owning pgrelay drops and recreates slot %s, starts a new epoch and snapshots every table\n",
		cfg.Name, keys.Resync, cfg.Slot)
	return nil
}

// Teardown drops the slot and (when managed) the publication, then deletes the pointer, lease
// status and resync keys. It refuses while a replica holds the lease, unless force.
func Teardown(ctx context.Context, cfg Config, force bool, w io.Writer) error {
	rdb, err := cfg.Redis.Client()
	if err != nil {
		return err
	}
	defer rdb.Close()
	keys := KeysFor(&cfg)
	if owner, _, err := lease.Holder(ctx, rdb, keys.Lease); err != nil {
		return fmt.Errorf("redis: %w", err)
	} else if owner != "" && !force {
		return fmt.Errorf("%s holds the lease: stop pgrelay first (or use --force)", owner)
	}
	pool, err := connectPool(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	slot, err := ReadSlot(ctx, pool, cfg.Slot)
	if err != nil {
		return err
	}
	if slot.Exists {
		if slot.ActivePID != 0 {
			if _, err := pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, slot.ActivePID); err != nil {
				return fmt.Errorf("stop the walsender of slot %s: %w", cfg.Slot, err)
			}
			time.Sleep(500 * time.Millisecond)
		}
		if _, err := pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, cfg.Slot); err != nil {
			return fmt.Errorf("drop slot %s: %w", cfg.Slot, err)
		}
		fmt.Fprintf(w, "dropped slot %s\n", cfg.Slot)
	}
	if cfg.ManagePublication {
		if _, err := pool.Exec(ctx, "DROP PUBLICATION IF EXISTS "+pgx.Identifier{cfg.Publication}.Sanitize()); err != nil {
			return fmt.Errorf("drop publication %s: %w", cfg.Publication, err)
		}
		fmt.Fprintf(w, "dropped publication %s\n", cfg.Publication)
	}
	if err := rdb.Del(ctx, keys.Pointer, keys.Status, keys.Resync).Err(); err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	fmt.Fprintf(w, "deleted %s\n", keys.Pointer)
	return nil
}

// SnapshotProgress is the snapshot's progress as `pgrelay status` shows it: the pointer's cursor
// and the table's row estimate (pg_class.reltuples, so the percent is approximate).
type SnapshotProgress struct {
	Table      string  `json:"table"`
	TableIndex int     `json:"table_index"` // 0-based position of Table in the snapshot's tables
	Tables     int     `json:"tables"`
	RowsDone   int64   `json:"rows_done"` // rows of Table already in the queue
	Estimate   int64   `json:"estimate"`  // reltuples of Table (-1 or 0: never analyzed)
	Percent    float64 `json:"percent"`   // RowsDone / Estimate of Table, capped at 100
}

// readSnapshot fills st.Snapshot from the pointer's cursor (nothing when no snapshot runs).
func (st *Status) readSnapshot(ctx context.Context, cfg Config) error {
	if len(st.Pointer) == 0 {
		return nil
	}
	var p struct {
		Snapshot *snapshot.Cursor `json:"snapshot"`
	}
	if err := json.Unmarshal(st.Pointer, &p); err != nil || p.Snapshot == nil {
		return nil
	}
	cur := p.Snapshot
	sp := &SnapshotProgress{Table: cur.Table, Tables: len(cur.Tables), RowsDone: cur.Rows}
	for i, t := range cur.Tables {
		if t == cur.Table {
			sp.TableIndex = i
		}
	}
	st.Snapshot = sp
	pool, err := connectPool(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	schema, name := ParseTable(cur.Table)
	var est float64
	if err := pool.QueryRow(ctx, `SELECT c.reltuples::float8 FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relname = $2`, schema, name).Scan(&est); err != nil {
		return fmt.Errorf("snapshot estimate of %s: %w", cur.Table, err)
	}
	sp.Estimate = int64(est)
	if sp.Estimate > 0 {
		sp.Percent = min(100, float64(sp.RowsDone)*100/float64(sp.Estimate))
	}
	return nil
}
